"""Hidden probes for minitron-0001 (optimizer state in checkpoints).

The judge (this module) never imports minitron: each probe drives the code under test in a
child process on a fresh model and fresh steps, and compares what it sends back with what gold
sends for the same inputs (a reference child that never loads the submission)."""

from infradev_probe import fresh, reference, run, same, workdir


def _model(rng):
    return {"dims": [8, int(rng.integers(4, 24)), 4], "seed": int(rng.integers(1 << 20))}


_SNAPSHOT = """
import numpy as np
from minitron.comm import ProcessGroup
from minitron.model import MLP
from minitron.optimizer import Adam
from minitron.train import train_steps

m = MLP(*ARGS["dims"], ProcessGroup(0, 1, {}), seed=ARGS["seed"])
opt = Adam(m, lr=1e-2)
train_steps(m, opt, ARGS["before"], seed=ARGS["seed"])
state = opt.state_dict()
train_steps(m, opt, ARGS["after"], seed=ARGS["seed"] + 7)
emit(step=state["step"], exp_avg={n: np.array(a) for n, a in state["exp_avg"].items()},
     exp_avg_sq={n: np.array(a) for n, a in state["exp_avg_sq"].items()})
"""


def test_state_dict_is_a_snapshot():
    # The state taken after `before` steps, read after `after` more: it must still be the state
    # of the moment it was taken, as gold's is.
    rng = fresh()
    args = dict(_model(rng), before=int(rng.integers(1, 4)), after=int(rng.integers(1, 4)))
    same(run(_SNAPSHOT, args), reference(_SNAPSHOT, args))


_RANKS = """
import numpy as np
from minitron.checkpoint import load_checkpoint, save_checkpoint
from minitron.comm import launch
from minitron.model import MLP
from minitron.optimizer import Adam

def rank(group, args):
    m = MLP(*args["dims"], group, seed=args["seed"])
    opt = Adam(m, lr=1e-2)
    for x in args["inputs"]:  # each rank holds different shards, so their states differ
        m.zero_grad()
        m.backward(m.forward(np.array(x, np.float32)))
        opt.step()
    save_checkpoint(args["path"], m, optimizer=opt, rank=group.rank, world_size=group.world_size)
    group.barrier()
    other = MLP(*args["dims"], group, seed=args["seed"] + 1)
    oopt = Adam(other, lr=1e-2)
    load_checkpoint(args["path"], other, optimizer=oopt, rank=group.rank)
    return {"step": oopt.step_count, "exp_avg": {n: np.array(a) for n, a in oopt.exp_avg.items()},
            "exp_avg_sq": {n: np.array(a) for n, a in oopt.exp_avg_sq.items()}}

emit(ranks=launch(rank, ARGS["world"], ARGS))
"""


def test_tensor_parallel_ranks_resume_their_own_optimizer_state():
    rng = fresh()
    world = int(rng.integers(2, 4))
    args = dict(_model(rng), world=world,
                inputs=[rng.standard_normal((4, 8)).astype("float32") for _ in range(int(rng.integers(1, 4)))])
    args["dims"][1] = world * int(rng.integers(2, 6))  # the hidden size splits over the ranks
    got = run(_RANKS, dict(args, path=workdir() + "/ckpt"))
    want = reference(_RANKS, dict(args, path=workdir() + "/ckpt"))
    same(got, want)


_MODEL_ONLY = """
from minitron.checkpoint import load_checkpoint, save_checkpoint
from minitron.comm import ProcessGroup
from minitron.model import MLP
from minitron.optimizer import Adam

m = MLP(*ARGS["dims"], ProcessGroup(0, 1, {}), seed=ARGS["seed"])
save_checkpoint(ARGS["path"], m)
try:
    load_checkpoint(ARGS["path"], m, optimizer=Adam(m))
    outcome = None
except Exception as e:
    outcome = [c.__name__ for c in type(e).__mro__]
# Keyed by a name drawn for this attempt: a message recorded in another attempt answers
# nothing here.
emit(**{ARGS["key"]: outcome})
"""


def test_loading_optimizer_from_model_only_checkpoint_raises():
    rng = fresh()
    key = "k%016x" % int(rng.integers(1 << 62))
    out = run(_MODEL_ONLY, dict(_model(rng), path=workdir(), key=key))
    mro = out.get(key)
    assert mro is not None, "loading an optimizer from a model-only checkpoint did not raise"
    assert "KeyError" in mro, f"raised {mro[0]}, not a KeyError"
