"""Probes for verl-0001 (checkpoint retention around a save).

The judge (this module) never imports verl: each probe drives the checkpoint managers in a
child process and checks the directory listings and tracked paths it sends back."""

from infradev_probe import run, workdir

# A single-process FSDP checkpoint manager over a plain module: rank 0 of a world of 1 (the
# collective calls are stubbed), a model whose state_dict records what the checkpoint root
# holds while the save is under way and can be told to fail.
FSDP_SETUP = """
import os
import torch
import torch.distributed as dist

dist.get_rank = lambda *a, **k: 0
dist.get_world_size = lambda *a, **k: 1
dist.barrier = lambda *a, **k: None

from transformers import PretrainedConfig
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager


class Tiny(torch.nn.Module):
    def __init__(self, root):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.config = PretrainedConfig()
        self.root = root
        self.fail_next = False
        self.during = []

    def can_generate(self):
        return False

    def state_dict(self, *args, **kwargs):
        self.during.append(sorted(os.listdir(self.root)))
        if self.fail_next:
            self.fail_next = False
            raise OSError("No space left on device")
        return super().state_dict(*args, **kwargs)


def make_manager(root):
    os.makedirs(root, exist_ok=True)
    model = Tiny(root)
    manager = FSDPCheckpointManager(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return model, manager


def save(manager, root, step, keep):
    manager.save_checkpoint(os.path.join(root, "global_step_%d" % step), global_step=step, max_ckpt_to_keep=keep)


def tracked(manager):
    return [os.path.basename(os.path.normpath(p)) for p in manager.previous_saved_paths]


def files(root, name):
    path = os.path.join(root, name)
    return sorted(os.listdir(path)) if os.path.isdir(path) else None
"""

# Base-class calls on directories made by hand.
BASE_SETUP = """
import os
import torch.distributed as dist

dist.get_rank = lambda *a, **k: 0
dist.get_world_size = lambda *a, **k: 1

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager


def manager_with(root, steps):
    os.makedirs(root, exist_ok=True)
    m = BaseCheckpointManager(model=object(), optimizer=object(), lr_scheduler=None,
                              processing_class=None, checkpoint_config=None)
    m.previous_saved_paths = [make(root, s) for s in steps]
    return m


def make(root, step):
    path = os.path.join(root, "global_step_%d" % step)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "weights.bin"), "w") as f:
        f.write(str(step))
    return path


def state(root, m):
    return {"disk": sorted(os.listdir(root)),
            "tracked": [os.path.basename(p) for p in m.previous_saved_paths]}
"""


def test_failed_save_keeps_the_last_good_checkpoint():
    out = run(FSDP_SETUP + """
results = {}
for keep in (1, 2):
    root = os.path.join(ARGS["dir"], "keep%d" % keep)
    model, manager = make_manager(root)
    for step in range(1, keep + 1):
        save(manager, root, step, keep)
    good = "global_step_%d" % keep
    model.fail_next = True
    try:
        save(manager, root, keep + 1, keep)
        raised = None
    except OSError as e:
        raised = str(e)
    after_failure = {"raised": raised, "good_files": files(root, good), "tracked": tracked(manager)}
    save(manager, root, keep + 2, keep)
    results["keep%d" % keep] = {
        "after_failure": after_failure,
        "after_next": {"tracked": tracked(manager), "good_files": files(root, good),
                       "new_files": files(root, "global_step_%d" % (keep + 2))},
    }
emit(**results)
""", {"dir": workdir()})
    full = ["extra_state_world_size_1_rank_0.pt", "fsdp_config.json", "huggingface",
            "model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt"]
    for keep in (1, 2):
        r = out[f"keep{keep}"]
        good = f"global_step_{keep}"
        failed = f"global_step_{keep + 1}"
        nxt = f"global_step_{keep + 2}"
        fail = r["after_failure"]
        assert fail["raised"] and "No space left" in fail["raised"], (
            f"max_ckpt_to_keep={keep}: the failing save did not raise its error (got {fail['raised']!r})")
        assert fail["good_files"] == full, (
            f"max_ckpt_to_keep={keep}: after a failed save the last good checkpoint {good} holds "
            f"{fail['good_files']}, want {full}")
        assert good in fail["tracked"] and failed not in fail["tracked"], (
            f"max_ckpt_to_keep={keep}: after a failed save the manager tracks {fail['tracked']}; "
            f"want {good} tracked and the unfinished {failed} not")
        nx = r["after_next"]
        assert nx["new_files"] == full, f"max_ckpt_to_keep={keep}: {nxt} holds {nx['new_files']}"
        want = [good, nxt] if keep == 2 else [nxt]
        assert nx["tracked"] == want, (
            f"max_ckpt_to_keep={keep}: after the next good save the manager tracks {nx['tracked']}, want {want}")
        if keep == 1:
            assert nx["good_files"] is None, f"{good} is still on disk after {nxt} replaced it"


def test_checkpoints_on_disk_during_and_after_each_save():
    out = run(FSDP_SETUP + """
results = {}
for keep in (1, 2, 3):
    root = os.path.join(ARGS["dir"], "keep%d" % keep)
    model, manager = make_manager(root)
    after = []
    for step in range(1, 6):
        save(manager, root, step, keep)
        after.append({"disk": sorted(os.listdir(root)), "tracked": tracked(manager)})
    results["keep%d" % keep] = {"during": model.during, "after": after}
emit(**results)
""", {"dir": workdir()})
    for keep in (1, 2, 3):
        r = out[f"keep{keep}"]
        for step in range(1, 6):
            older = max(keep - 1, 1)
            want_during = [f"global_step_{s}" for s in range(max(1, step - older), step + 1)]
            want_after = [f"global_step_{s}" for s in range(max(1, step - keep + 1), step + 1)]
            got = r["during"][step - 1]
            assert got == want_during, (
                f"max_ckpt_to_keep={keep}, save {step}: while writing, the checkpoint root holds {got}, "
                f"want {want_during}")
            got = r["after"][step - 1]
            assert got["disk"] == want_after and got["tracked"] == want_after, (
                f"max_ckpt_to_keep={keep}, after save {step}: on disk {got['disk']}, tracked {got['tracked']}, "
                f"want {want_after} for both")


def test_rotation_removes_every_excess_checkpoint_and_nothing_else():
    out = run(BASE_SETUP + """
import os
d = ARGS["dir"]
res = {}

root = os.path.join(d, "capacity")
os.makedirs(os.path.join(root, "notes"))
make(root, 0)  # an untracked checkpoint: never touched
m = manager_with(root, [1, 2, 3, 4, 5])
m.ensure_checkpoint_capacity(3)
res["capacity"] = state(root, m)
m.ensure_checkpoint_capacity(3)
res["capacity_again"] = state(root, m)

root = os.path.join(d, "register2")
m = manager_with(root, [1, 2, 3, 4])
m.register_checkpoint(make(root, 5), 2)
res["register2"] = state(root, m)

root = os.path.join(d, "register1")
m = manager_with(root, [1, 2, 3])
m.register_checkpoint(make(root, 4), 1)
res["register1"] = state(root, m)

root = os.path.join(d, "under")
m = manager_with(root, [1])
m.ensure_checkpoint_capacity(3)
m.register_checkpoint(make(root, 2), 3)
res["under"] = state(root, m)
emit(**res)
""", {"dir": workdir()})

    def names(*steps):
        return [f"global_step_{s}" for s in steps]

    want = {
        "capacity": (names(0, 4, 5) + ["notes"], names(4, 5)),
        "capacity_again": (names(0, 4, 5) + ["notes"], names(4, 5)),
        "register2": (names(4, 5), names(4, 5)),
        "register1": (names(4), names(4)),
        "under": (names(1, 2), names(1, 2)),
    }
    calls = {
        "capacity": "ensure_checkpoint_capacity(3) over 5 tracked checkpoints and 2 untracked entries",
        "capacity_again": "a second ensure_checkpoint_capacity(3)",
        "register2": "register_checkpoint(new, 2) over 4 tracked checkpoints",
        "register1": "register_checkpoint(new, 1) over 3 tracked checkpoints",
        "under": "ensure_checkpoint_capacity(3) and register_checkpoint(new, 3) over 1 tracked checkpoint",
    }
    for case, (disk, tracked) in want.items():
        got = out[case]
        assert got["disk"] == disk and got["tracked"] == tracked, (
            f"{calls[case]}: on disk {got['disk']}, tracked {got['tracked']}; want on disk {disk}, tracked {tracked}")


def test_unset_or_non_positive_limit_keeps_everything():
    out = run(BASE_SETUP + """
import os
res = {}
for name, keep in (("none", None), ("zero", 0), ("negative", -1)):
    root = os.path.join(ARGS["dir"], name)
    m = manager_with(root, [1, 2, 3])
    try:
        m.ensure_checkpoint_capacity(keep)
        m.register_checkpoint(make(root, 4), keep)
        m.ensure_checkpoint_capacity(keep)
        m.register_checkpoint(make(root, 5), keep)
        res[name] = state(root, m)
    except Exception as e:
        res[name] = {"error": "%s: %s" % (type(e).__name__, e)}
emit(**res)
""", {"dir": workdir()})
    want = [f"global_step_{s}" for s in range(1, 6)]
    for name, keep in (("none", None), ("zero", 0), ("negative", -1)):
        got = out[name]
        assert "error" not in got, f"max_ckpt_to_keep={keep!r}: rotation raised {got.get('error')}"
        assert got["disk"] == want and got["tracked"] == want, (
            f"max_ckpt_to_keep={keep!r} (no limit): on disk {got['disk']}, tracked {got['tracked']}, want {want}")
