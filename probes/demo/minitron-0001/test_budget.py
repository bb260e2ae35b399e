"""Budget probes for minitron-0001: run alone, so the harness's cgroup figures are theirs.

The judge (this module) never imports minitron: the child steps a fresh large model, sends
elements of its moments the judge picked at random and saves a checkpoint; gold does the same in
a reference child, one after the other, so the phase's peak is the larger of the two saves."""

from infradev_probe import fresh, reference, run, same, workdir

_SAVE = """
import numpy as np
from minitron.checkpoint import save_checkpoint
from minitron.comm import ProcessGroup
from minitron.model import MLP
from minitron.optimizer import Adam

m = MLP(*ARGS["dims"], ProcessGroup(0, 1, {}), seed=ARGS["seed"])
opt = Adam(m, lr=1e-3)
m.backward(m.forward(np.full((8, ARGS["dims"][0]), ARGS["x"], np.float32)))
opt.step()
picks = np.array(ARGS["picks"])
# The moments at places drawn for this attempt, read before the save: the save is the peak.
emit(exp_avg={n: np.asarray(a).reshape(-1)[picks % np.asarray(a).size] for n, a in opt.exp_avg.items()},
     step=opt.step_count)
save_checkpoint(ARGS["path"], m, optimizer=opt)
# The files live in /tmp, in the sandbox's memory: gone before the next child saves its own.
import shutil
shutil.rmtree(ARGS["path"], ignore_errors=True)
"""


def test_checkpoint_save_memory():
    # About 2 x 1024 x 4096 float32 parameters (32 MiB); one step makes grads and moments
    # resident. Gold saves the same in a reference child after it: the phase's peak is the
    # larger of the two saves.
    rng = fresh()
    args = {"dims": [1024, int(rng.integers(3968, 4224)), 1024], "seed": int(rng.integers(1 << 20)),
            "x": float(rng.uniform(0.5, 2.0)), "picks": [int(p) for p in rng.integers(0, 1 << 30, size=16)]}
    got = run(_SAVE, dict(args, path=workdir() + "/ckpt"))
    want = reference(_SAVE, dict(args, path=workdir() + "/ckpt"))
    same(got, want)
