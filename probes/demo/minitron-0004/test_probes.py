"""Probes for minitron-0004 (ZeRO-1 sharded Adam).

The judge (this module) never imports minitron: each probe drives the code under test in a
child process and compares the plain data it sends back."""

import numpy as np

from infradev_probe import run

RANKS = 4
# MLP(8, 16, 4) on one tensor-parallel rank: elements of each parameter (float32).
SIZES = {"fc1.bias": 16, "fc1.weight": 8 * 16, "fc2.bias": 4, "fc2.weight": 16 * 4}
PARAM_BYTES = sum(SIZES.values()) * 4  # 848


def _state_and_traffic():
    """Each of 4 data-parallel ranks takes one step through train_steps and one more alone;
    returns each rank's moments, parameters and the bytes it sent in the second step."""
    out = run("""
        import numpy as np
        from minitron.comm import ProcessGroup, launch
        from minitron.model import MLP
        from minitron.optimizer import DistributedAdam
        from minitron.train import train_steps

        def rank(group):
            m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
            opt = DistributedAdam(m, group, lr=1e-2)
            train_steps(m, opt, 1, group=group)
            before = group.bytes_sent
            opt.step()
            return {"sent": group.bytes_sent - before,
                    "exp_avg": {n: np.array(a) for n, a in opt.exp_avg.items()},
                    "exp_avg_sq": {n: np.array(a) for n, a in opt.exp_avg_sq.items()},
                    "params": {n: np.array(p) for n, p, _ in m.named_parameters()}}

        emit(ranks=launch(rank, ARGS["ranks"]))
    """, {"ranks": RANKS})["ranks"]
    assert len(out) == RANKS
    return out


def test_each_rank_keeps_moments_for_its_share_only():
    out = _state_and_traffic()
    for moment in ("exp_avg", "exp_avg_sq"):
        for name, size in SIZES.items():
            held = [int(np.asarray(o[moment].get(name, [])).size) for o in out]
            # The ranks' slices cover each parameter exactly once.
            assert sum(held) == size, f"{moment}[{name}]: the ranks hold {held} elements of {size}"
        for r, o in enumerate(out):
            assert set(o[moment]) <= set(SIZES), f"rank {r}: {moment} for {sorted(o[moment])}"


def test_a_step_sends_only_the_owned_slices():
    out = _state_and_traffic()
    # Every rank sends its owned quarter of every parameter to the 3 other ranks.
    sent = [o["sent"] for o in out]
    assert sum(sent) == (RANKS - 1) * PARAM_BYTES, f"the ranks sent {sent} bytes in one step"
    for r, o in enumerate(out[1:], 1):
        for name in SIZES:
            np.testing.assert_array_equal(o["params"][name], out[0]["params"][name],
                                          err_msg=f"rank {r}: {name} differs from rank 0's after the step")
