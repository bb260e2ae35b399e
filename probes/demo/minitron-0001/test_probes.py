"""Hidden probes for minitron-0001 (optimizer state in checkpoints).

The judge (this module) never imports minitron: each probe drives the code under test in a
child process and compares the plain data it sends back."""

import numpy as np

from infradev_probe import run, workdir


def test_state_dict_is_a_snapshot():
    out = run("""
        import numpy as np
        from minitron.comm import ProcessGroup
        from minitron.model import MLP
        from minitron.optimizer import Adam
        from minitron.train import train_steps

        m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
        opt = Adam(m, lr=1e-2)
        train_steps(m, opt, 2)
        state = opt.state_dict()
        taken = {n: np.array(a, copy=True) for n, a in state["exp_avg"].items()}
        train_steps(m, opt, 2, seed=2)
        emit(step=state["step"], taken=taken, later={n: np.array(a) for n, a in state["exp_avg"].items()})
    """)
    assert out["step"] == 2
    assert out["taken"], "state_dict() has no exp_avg entries"
    for name, before in out["taken"].items():
        np.testing.assert_array_equal(out["later"][name], before, err_msg=f"exp_avg[{name}] changed after later steps")


def test_tensor_parallel_ranks_resume_their_own_optimizer_state():
    out = run("""
        import numpy as np
        from minitron.checkpoint import load_checkpoint, save_checkpoint
        from minitron.comm import launch
        from minitron.model import MLP
        from minitron.optimizer import Adam

        def rank(group, path):
            m = MLP(8, 16, 4, group, seed=0)
            opt = Adam(m, lr=1e-2)
            for step in range(3):  # each rank holds different shards, so their states differ
                m.zero_grad()
                m.backward(m.forward(np.full((4, 8), step + 1.0, np.float32)))
                opt.step()
            save_checkpoint(path, m, optimizer=opt, rank=group.rank, world_size=group.world_size)
            group.barrier()
            fresh = MLP(8, 16, 4, group, seed=9)
            fopt = Adam(fresh, lr=1e-2)
            load_checkpoint(path, fresh, optimizer=fopt, rank=group.rank)
            return {"saved_step": opt.step_count, "loaded_step": fopt.step_count,
                    "saved": {n: np.array(a) for n, a in opt.exp_avg.items()},
                    "loaded": {n: np.array(a) for n, a in fopt.exp_avg.items()}}

        emit(ranks=launch(rank, 2, ARGS["path"]))
    """, {"path": workdir() + "/ckpt"})
    assert len(out["ranks"]) == 2
    first = out["ranks"][0]["saved"]
    for r, got in enumerate(out["ranks"]):
        assert got["loaded_step"] == got["saved_step"] == 3, f"rank {r}: step {got['loaded_step']}"
        assert set(got["loaded"]) == set(got["saved"]), f"rank {r}: parameters differ"
        for name, saved in got["saved"].items():
            np.testing.assert_array_equal(got["loaded"][name], saved, err_msg=f"rank {r}: exp_avg[{name}]")
    assert any(not np.array_equal(out["ranks"][1]["saved"][n], first[n]) for n in first), \
        "the two ranks' states are equal, so the probe cannot tell them apart"


def test_loading_optimizer_from_model_only_checkpoint_raises():
    out = run("""
        from minitron.checkpoint import load_checkpoint, save_checkpoint
        from minitron.comm import ProcessGroup
        from minitron.model import MLP
        from minitron.optimizer import Adam

        m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
        save_checkpoint(ARGS["path"], m)
        try:
            load_checkpoint(ARGS["path"], m, optimizer=Adam(m))
            emit(raised=None)
        except Exception as e:
            emit(raised=type(e).__name__, mro=[c.__name__ for c in type(e).__mro__])
    """, {"path": workdir()})
    assert out["raised"] is not None, "loading an optimizer from a model-only checkpoint did not raise"
    assert "KeyError" in out["mro"], f"raised {out['raised']}, not a KeyError"
