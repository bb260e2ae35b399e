"""Budget probes for minitron-0001: run alone, so the harness's cgroup figures are theirs."""

from infradev_probe import run, workdir


def test_checkpoint_save_memory():
    # 2 x 1024 x 4096 float32 parameters (32 MiB); one step makes grads and moments resident.
    out = run("""
        import numpy as np
        from minitron.checkpoint import save_checkpoint
        from minitron.comm import ProcessGroup
        from minitron.model import MLP
        from minitron.optimizer import Adam

        m = MLP(1024, 4096, 1024, ProcessGroup(0, 1, {}), seed=0)
        opt = Adam(m, lr=1e-3)
        m.backward(m.forward(np.ones((8, 1024), np.float32)))
        opt.step()
        save_checkpoint(ARGS["path"], m, optimizer=opt)
        emit(saved=True)
    """, {"path": workdir() + "/ckpt"})
    assert out["saved"] is True
