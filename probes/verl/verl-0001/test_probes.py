"""Probes for verl-0001 (checkpoint retention around a save).

The judge (this module) never imports verl: each probe drives the checkpoint managers in a
child process over a scenario drawn fresh (step numbers, how many saves, the limit, which saves
fail and where, untracked entries beside the checkpoints), and checks the directory listings and
tracked paths it sends back against what the judge computes from the scenario, against gold's
child on the same scenario, and against what the judge itself finds on disk afterwards."""

import os

from infradev_probe import fresh, reference, run, same, workdir

# A single-process FSDP checkpoint manager over a plain module: rank 0 of a world of 1 (the
# collective calls are stubbed). FAIL tells the save in progress to raise at one point while it
# writes: the model's state_dict (nothing written yet), the optimizer's (the model shard is on
# disk), the HF config (every shard is on disk), or the barrier once fsdp_config.json is written
# (every file is on disk). The model's state_dict records what the checkpoint root holds while
# the save is under way.
FSDP_DRIVER = """
import os
import torch
import torch.distributed as dist

FAIL = {"site": "", "msg": "", "new": ""}


def _fail(site):
    if FAIL["site"] == site:
        FAIL["site"] = ""
        raise OSError(FAIL["msg"])


def _barrier(*a, **k):
    if FAIL["site"] == "barrier" and os.path.exists(os.path.join(FAIL["new"], "fsdp_config.json")):
        _fail("barrier")


dist.get_rank = lambda *a, **k: 0
dist.get_world_size = lambda *a, **k: 1
dist.barrier = _barrier

from transformers import PretrainedConfig
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager


class Config(PretrainedConfig):
    def save_pretrained(self, *args, **kwargs):
        _fail("config")
        return super().save_pretrained(*args, **kwargs)


class Optim(torch.optim.SGD):
    def state_dict(self):
        _fail("optim")
        return super().state_dict()


class Tiny(torch.nn.Module):
    def __init__(self, root):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.config = Config()
        self.root = root
        self.during = []

    def can_generate(self):
        return False

    def state_dict(self, *args, **kwargs):
        self.during.append(sorted(os.listdir(self.root)))
        _fail("model")
        return super().state_dict(*args, **kwargs)


def tracked(manager):
    return [os.path.basename(os.path.normpath(p)) for p in manager.previous_saved_paths]


def files(root, name):
    path = os.path.join(root, name)
    return sorted(os.listdir(path)) if os.path.isdir(path) else None


torch.manual_seed(ARGS["seed"])
results = []
for sc in ARGS["scenarios"]:
    root = os.path.join(ARGS["dir"], sc["name"])
    os.makedirs(root)
    for name in sc["untracked"]:
        os.makedirs(os.path.join(root, name))
        with open(os.path.join(root, name, "keep.txt"), "w") as f:
            f.write(name)
    model = Tiny(root)
    manager = FSDPCheckpointManager(model, Optim(model.parameters(), lr=0.1))
    saves = []
    for step, site, msg in zip(sc["steps"], sc["sites"], sc["msgs"]):
        new = os.path.join(root, "global_step_%d" % step)
        FAIL.update(site=site, msg=msg, new=new)
        seen = len(model.during)
        try:
            manager.save_checkpoint(new, global_step=step, max_ckpt_to_keep=sc["keep"])
            raised = None
        except OSError as e:
            raised = str(e)
        FAIL["site"] = ""
        names = tracked(manager)
        saves.append({
            "raised": raised,
            "during": model.during[seen] if len(model.during) > seen else None,
            "disk": sorted(os.listdir(root)),
            "tracked": names,
            "contents": [files(root, n) for n in names],
        })
    results.append(saves)
emit(results=results)
"""

# Base-class calls on directories made by hand: each case tracks some checkpoints, leaves
# untracked entries beside them, may have deleted some tracked ones already, and makes a list
# of calls; the state (disk listing and tracked names) is recorded after every call.
BASE_DRIVER = """
import os
import torch.distributed as dist

dist.get_rank = lambda *a, **k: 0
dist.get_world_size = lambda *a, **k: 1

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager


def make(root, step):
    path = os.path.join(root, "global_step_%d" % step)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "weights.bin"), "w") as f:
        f.write(str(step))
    return path


def state(root, m):
    return {"disk": sorted(os.listdir(root)),
            "tracked": [os.path.basename(p) for p in m.previous_saved_paths]}


out = []
for case in ARGS["cases"]:
    root = os.path.join(ARGS["dir"], case["name"])
    os.makedirs(root)
    for name in case["untracked"]:
        os.makedirs(os.path.join(root, name))
    m = BaseCheckpointManager(model=object(), optimizer=object(), lr_scheduler=None,
                              processing_class=None, checkpoint_config=None)
    m.previous_saved_paths = [make(root, s) for s in case["tracked"]]
    for s in case["gone"]:
        import shutil
        shutil.rmtree(os.path.join(root, "global_step_%d" % s))
    states = []
    try:
        for call in case["calls"]:
            if call[0] == "capacity":
                m.ensure_checkpoint_capacity(call[1])
            else:
                m.register_checkpoint(make(root, call[1]), call[2])
            states.append(state(root, m))
        out.append({"states": states})
    except Exception as e:
        out.append({"states": states, "error": "%s: %s" % (type(e).__name__, e)})
emit(cases=out)
"""


def _steps(rng, n, low=1):
    """n strictly increasing step numbers with random gaps, from a random start."""
    start = int(rng.integers(low, 1_000_000))
    return [start + int(x) for x in (rng.integers(1, 997, size=n).cumsum() - 1)]


def _gs(step):
    return f"global_step_{step}"


def _untracked(rng, below):
    """Untracked entries beside the checkpoints: a checkpoint-like directory from an older run
    and an unrelated one, each present or not."""
    out = []
    if rng.random() < 0.7:
        out.append(_gs(int(rng.integers(0, below))))
    if rng.random() < 0.7:
        out.append("notes_%x" % int(rng.integers(1 << 30)))
    return out


def _expect_fsdp(sc):
    """What the scenario leaves, save by save: the error raised, the root's listing while the
    save writes, the listing after it, the tracked checkpoints."""
    keep, tracked, failed, out = sc["keep"], [], [], []
    for step, site, msg in zip(sc["steps"], sc["sites"], sc["msgs"]):
        name = _gs(step)
        if keep > 1 and len(tracked) >= keep:
            tracked = tracked[len(tracked) - keep + 1:]
        during = sorted(tracked + failed + sc["untracked"] + [name])
        if site:
            failed.append(name)
        else:
            tracked = (tracked + [name])[-keep:]
        out.append({"raised": msg if site else None, "during": during,
                    "disk": sorted(tracked + failed + sc["untracked"]), "tracked": list(tracked)})
    return out


def _run_fsdp(scenarios, rng):
    args = {"seed": int(rng.integers(1 << 31)), "scenarios": scenarios}
    mine = workdir()
    got = run(FSDP_DRIVER, {**args, "dir": mine})
    want = reference(FSDP_DRIVER, {**args, "dir": workdir()})
    return got["results"], want["results"], mine


def _check_fsdp(scenarios, got, want, mine):
    assert isinstance(got, list) and len(got) == len(scenarios), "the child sent no result per scenario"
    for sc, saves, ref in zip(scenarios, got, want):
        keep = sc["keep"]
        expected = _expect_fsdp(sc)
        assert isinstance(saves, list) and len(saves) == len(expected), f"max_ckpt_to_keep={keep}: saves missing"
        for i, (g, e) in enumerate(zip(saves, expected)):
            what = f"max_ckpt_to_keep={keep}, save {i + 1} of {len(expected)} ({_gs(sc['steps'][i])}" + (
                f", failing in {sc['sites'][i]})" if sc["sites"][i] else ")")
            assert g.get("raised") == e["raised"], (
                f"{what}: the save raised {g.get('raised')!r}, want {e['raised']!r}")
            assert g.get("during") == e["during"], (
                f"{what}: while writing, the checkpoint root holds {g.get('during')}, want {e['during']}")
            assert g.get("disk") == e["disk"] and g.get("tracked") == e["tracked"], (
                f"{what}: afterwards on disk {g.get('disk')}, tracked {g.get('tracked')}; "
                f"want on disk {e['disk']}, tracked {e['tracked']}")
        same(saves, ref, path=f"max_ckpt_to_keep={keep} (compared with the reference)")
        # What the judge finds on disk itself once the child is gone: the tracked checkpoints
        # of the last save, each whole (the files the reference wrote for it).
        root = os.path.join(mine, sc["name"])
        last, last_ref = expected[-1], ref[-1]
        assert sorted(os.listdir(root)) == last["disk"], (
            f"max_ckpt_to_keep={keep}: the checkpoint root holds {sorted(os.listdir(root))}, want {last['disk']}")
        for name, files in zip(last["tracked"], last_ref["contents"]):
            on_disk = sorted(os.listdir(os.path.join(root, name)))
            assert on_disk == files, f"max_ckpt_to_keep={keep}: {name} holds {on_disk}, want {files}"


def test_failed_save_keeps_the_last_good_checkpoint():
    rng = fresh()
    sites = ["model", "optim", "config", "barrier"]
    keeps = [1, int(rng.integers(2, 5))]
    rng.shuffle(keeps)
    scenarios = []
    for k, keep in enumerate(keeps):
        # One or two failing saves, never the first or the last, and enough good ones that the
        # limit is reached before the last save.
        fails = int(rng.integers(1, 3))
        n = keep + fails + int(rng.integers(2, 4))
        failing = rng.choice(range(1, n - 1), size=fails, replace=False).tolist()
        site = ["" for _ in range(n)]
        msgs = ["" for _ in range(n)]
        for i in failing:
            site[i] = sites[int(rng.integers(len(sites)))]
            msgs[i] = "No space left on device (%x)" % int(rng.integers(1 << 40))
        steps = _steps(rng, n, low=50_000)
        scenarios.append({"name": f"s{k}", "keep": keep, "steps": steps, "sites": site, "msgs": msgs,
                          "untracked": _untracked(rng, steps[0])})
    got, want, mine = _run_fsdp(scenarios, rng)
    _check_fsdp(scenarios, got, want, mine)


def test_checkpoints_on_disk_during_and_after_each_save():
    rng = fresh()
    keeps = [1, int(rng.integers(2, 4)), int(rng.integers(3, 5))]
    rng.shuffle(keeps)
    scenarios = []
    for k, keep in enumerate(keeps):
        n = keep + int(rng.integers(1, 4))
        steps = _steps(rng, n, low=50_000)
        scenarios.append({"name": f"s{k}", "keep": keep, "steps": steps, "sites": [""] * n, "msgs": [""] * n,
                          "untracked": _untracked(rng, steps[0])})
    got, want, mine = _run_fsdp(scenarios, rng)
    _check_fsdp(scenarios, got, want, mine)


def _expect_base(case):
    """The state after each call: disk listing and tracked names."""
    tracked = [_gs(s) for s in case["tracked"]]
    disk = set(tracked) - {_gs(s) for s in case["gone"]} | set(case["untracked"])
    out = []
    for call in case["calls"]:
        if call[0] == "capacity":
            keep = call[1]
            if isinstance(keep, int) and keep > 1 and len(tracked) >= keep:
                drop = len(tracked) - keep + 1
                disk -= set(tracked[:drop])
                tracked = tracked[drop:]
        else:
            _, step, keep = call
            tracked.append(_gs(step))
            disk.add(_gs(step))
            if isinstance(keep, int) and keep > 0 and len(tracked) > keep:
                drop = len(tracked) - keep
                disk -= set(tracked[:drop])
                tracked = tracked[drop:]
        out.append({"disk": sorted(disk), "tracked": list(tracked)})
    return out


def _describe(case):
    return (f"case {case['name']}: {len(case['tracked'])} tracked checkpoints "
            f"({len(case['gone'])} already gone), untracked {case['untracked']}, calls {case['calls']}")


def _run_base(cases, rng):
    mine = workdir()
    got = run(BASE_DRIVER, {"cases": cases, "dir": mine})["cases"]
    want = reference(BASE_DRIVER, {"cases": cases, "dir": workdir()})["cases"]
    assert isinstance(got, list) and len(got) == len(cases), "the child sent no result per case"
    for case, g, w in zip(cases, got, want):
        assert "error" not in g, f"{_describe(case)}: raised {g.get('error')}"
        expected = _expect_base(case)
        for i, (s, e) in enumerate(zip(g.get("states") or [], expected)):
            assert s == e, (f"{_describe(case)}: after call {i + 1} on disk {s.get('disk')}, tracked "
                            f"{s.get('tracked')}; want on disk {e['disk']}, tracked {e['tracked']}")
        assert len(g.get("states") or []) == len(expected), f"{_describe(case)}: states missing"
        same(g, w, path=f"{_describe(case)} (compared with the reference)")
        on_disk = sorted(os.listdir(os.path.join(mine, case["name"])))
        assert on_disk == expected[-1]["disk"], (
            f"{_describe(case)}: the judge finds {on_disk} on disk, want {expected[-1]['disk']}")


def test_rotation_removes_every_excess_checkpoint_and_nothing_else():
    rng = fresh()
    cases = []
    # ensure_checkpoint_capacity over at least 2 checkpoints too many, twice, then a registration.
    n = int(rng.integers(3, 9))
    keep = int(rng.integers(2, n))
    steps = _steps(rng, n + 1, low=1000)
    drop = n - keep + 1
    gone = [steps[int(rng.integers(drop))]] if rng.random() < 0.5 else []
    cases.append({"name": "capacity", "tracked": steps[:n], "gone": gone, "untracked": _untracked(rng, steps[0]),
                  "calls": [["capacity", keep], ["capacity", keep], ["register", steps[n], keep]]})
    # register_checkpoint over at least 2 too many, then a capacity call and another registration.
    n = int(rng.integers(2, 8))
    keep = int(rng.integers(1, n))
    steps = _steps(rng, n + 2, low=1000)
    drop = n + 1 - keep
    gone = [steps[int(rng.integers(drop))]] if rng.random() < 0.5 else []
    cases.append({"name": "register", "tracked": steps[:n], "gone": gone, "untracked": _untracked(rng, steps[0]),
                  "calls": [["register", steps[n], keep], ["capacity", keep], ["register", steps[n + 1], keep]]})
    # Fewer checkpoints than the limit: nothing goes until the limit is reached.
    keep = int(rng.integers(3, 7))
    n = int(rng.integers(0, keep - 1))
    steps = _steps(rng, n + 3, low=1000)
    cases.append({"name": "under", "tracked": steps[:n], "gone": [], "untracked": _untracked(rng, steps[0]),
                  "calls": [["capacity", keep], ["register", steps[n], keep], ["capacity", keep],
                            ["register", steps[n + 1], keep], ["register", steps[n + 2], keep]]})
    order = rng.permutation(len(cases))
    _run_base([cases[i] for i in order], rng)


def test_unset_or_non_positive_limit_keeps_everything():
    rng = fresh()
    keeps = [None, 0, -int(rng.integers(1, 100))]
    rng.shuffle(keeps)
    cases = []
    for k, keep in enumerate(keeps):
        n = int(rng.integers(1, 6))
        cycles = int(rng.integers(1, 5))
        steps = _steps(rng, n + cycles, low=1000)
        calls = []
        for c in range(cycles):
            calls += [["capacity", keep], ["register", steps[n + c], keep]]
        cases.append({"name": f"k{k}", "tracked": steps[:n], "gone": [], "untracked": _untracked(rng, steps[0]),
                      "calls": calls})
    _run_base(cases, rng)
