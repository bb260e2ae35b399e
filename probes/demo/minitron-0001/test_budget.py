"""Budget probes for minitron-0001: run alone, so the harness's cgroup figures are theirs.

The judge (this module) never imports minitron: the child saves a checkpoint of a fresh large
model and optimizer, loads it back and sends elements the judge picked at random; gold does the
same in a reference child, one after the other, so the phase's peak is the larger of the two."""

from infradev_probe import fresh, reference, run, same, workdir

_SAVE = """
import numpy as np
from minitron.checkpoint import load_checkpoint, save_checkpoint
from minitron.comm import ProcessGroup
from minitron.model import MLP
from minitron.optimizer import Adam

m = MLP(*ARGS["dims"], ProcessGroup(0, 1, {}), seed=ARGS["seed"])
opt = Adam(m, lr=1e-3)
m.backward(m.forward(np.full((8, ARGS["dims"][0]), ARGS["x"], np.float32)))
opt.step()
save_checkpoint(ARGS["path"], m, optimizer=opt)
del m, opt
m = MLP(*ARGS["dims"], ProcessGroup(0, 1, {}), seed=ARGS["seed"] + 1)
opt = Adam(m, lr=1e-3)
load_checkpoint(ARGS["path"], m, optimizer=opt)
picks = ARGS["picks"]
emit(step=opt.step_count,
     exp_avg={n: np.asarray(a).reshape(-1)[np.array(picks) % np.asarray(a).size] for n, a in opt.exp_avg.items()},
     dtypes={n: str(np.asarray(a).dtype) for n, a in opt.exp_avg_sq.items()})
"""


def test_checkpoint_save_memory():
    # About 2 x 1024 x 4096 float32 parameters (32 MiB); one step makes grads and moments resident.
    rng = fresh()
    args = {"dims": [1024, int(rng.integers(3968, 4224)), 1024], "seed": int(rng.integers(1 << 20)),
            "x": float(rng.uniform(0.5, 2.0)), "picks": [int(p) for p in rng.integers(0, 1 << 30, size=16)]}
    got = run(_SAVE, dict(args, path=workdir() + "/ckpt"))
    want = reference(_SAVE, dict(args, path=workdir() + "/ckpt"))
    same(got, want)
