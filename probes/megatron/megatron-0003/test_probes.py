"""Hidden probes for megatron-0003 (DDP parameter readiness protocol).

The judge never imports megatron. Every probe draws its scenario with `fresh()`: the model's
parameter sizes and expert flags, bucket sizes, the sequence of wraps, which parameters share
which callbacks and which are read in which call, the bucket groups' states and DDP's schedule
flags. Children build DistributedDataParallel wrappers on the CPU (process groups are stand-ins
with the drawn size and rank 0) or drive the readiness callback with stand-in bucket groups, and
send back which callbacks sit where and which calls were made. The judge checks these against
the protocol's rules computed from the draw, and the DDP bucket structures against a reference
child running gold on the same draw."""

from infradev_probe import fresh, reference, run, same

PRELUDE = """
import contextlib
from unittest import mock
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer import TransformerConfig
from megatron.core.utils import PARAM_READY_CALLBACK_ATTR

def group(size):
    g = mock.MagicMock()
    g.size.return_value = size
    g.rank.return_value = 0
    return g

def collection(dp, edp):
    one, d, e = group(1), group(dp), group(edp)
    return ProcessGroupCollection(tp=one, pp=one, ep=one, dp=d, dp_cp=d, intra_dp_cp=d,
                                  expt_dp=e, intra_expt_dp=e)

def on_cpu():
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch("torch.cuda.current_device", return_value="cpu"))
    stack.enter_context(mock.patch("torch.distributed.is_initialized", return_value=True))
    stack.enter_context(mock.patch("torch.distributed.get_rank", return_value=0))
    return stack

class Model(torch.nn.Module):
    def __init__(self, sizes, experts):
        super().__init__()
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(n) * 0.01) for n in sizes])
        for p, e in zip(self.ps, experts):
            if e:
                p.allreduce = False

def model():
    torch.manual_seed(ARGS["seed"])
    return Model(ARGS["sizes"], ARGS["experts"]).bfloat16()

DDPS = []

def wrap(m, overlap_param_gather, bucket_size):
    cfg = DistributedDataParallelConfig(
        use_distributed_optimizer=overlap_param_gather, overlap_grad_reduce=True,
        overlap_param_gather=overlap_param_gather, bucket_size=bucket_size, grad_reduce_in_fp32=True)
    config = TransformerConfig(num_attention_heads=1, num_layers=1, calculate_per_token_loss=True)
    ddp = DistributedDataParallel(config, ddp_config=cfg, module=m,
                                  pg_collection=collection(ARGS["dp"], ARGS["edp"]))
    DDPS.append(ddp)  # every wrapper stays alive: a stale callback still finds its DDP
    return ddp

def members(m, bucket_group):
    index = {id(p): i for i, p in enumerate(m.parameters())}
    if bucket_group is None:
        return None
    return sorted(index.get(id(p), -1) for b in bucket_group.buckets for p in b.params_list)

def markers(m, ddp):
    \"\"\"DDP's bucket groups (as parameter indices, dense then expert) and, per parameter: None
    when unmarked, else [the members of the group the callback is bound to, the callback's
    number (first-seen order), the wrap the callback is bound to, the members of the group DDP
    maps the parameter to].\"\"\"
    numbers = {}
    out = []
    for p in m.parameters():
        cb = getattr(p, PARAM_READY_CALLBACK_ATTR, None)
        if cb is None:
            out.append(None)
            continue
        owner = cb._ddp()
        out.append([members(m, cb._bucket_group()), numbers.setdefault(id(cb), len(numbers)),
                    next((k for k, d in enumerate(DDPS) if d is owner), -1),
                    members(m, ddp.param_to_bucket_group.get(p))])
    return {"dense": [members(m, g) for g in ddp.bucket_groups],
            "expert": [members(m, g) for g in ddp.expert_parallel_bucket_groups],
            "params": out}
"""


def draw_model(rng):
    """Parameter sizes and expert flags (at least four dense and two expert parameters), and a
    bucket size that puts at least two parameters in every bucket but the last."""
    while True:
        n = int(rng.integers(7, 15))
        experts = [bool(e) for e in rng.random(n) < 0.4]
        if sum(experts) >= 2 and n - sum(experts) >= 4:
            break
    sizes = [int(s) for s in rng.integers(1, 400, size=n)]
    return {"seed": int(rng.integers(1 << 31)), "sizes": sizes, "experts": experts,
            "dp": int(rng.integers(1, 9)), "edp": int(rng.integers(1, 9))}


def bucket_size(rng, model):
    return int(rng.integers(2 * max(model["sizes"]), sum(model["sizes"]) + 1))


def _check_stamped(st, n, wrap_index, what):
    groups = st["dense"] + st["expert"]
    assert st["expert"], f"{what}: DDP has no expert bucket groups"
    params = st["params"]
    assert len(params) == n, f"{what}: {len(params)} parameters reported, the model has {n}"
    unmarked = [i for i, m in enumerate(params) if m is None]
    assert not unmarked, f"{what}: parameters {unmarked} carry no readiness callback"
    by_group, by_callback = {}, {}
    for i, (bound, number, owner, mapped) in enumerate(params):
        assert mapped is not None and i in mapped and mapped in groups, \
            f"{what}: DDP maps parameter {i} to bucket group {mapped}, not one of its groups {groups}"
        assert bound == mapped, \
            f"{what}: parameter {i}'s callback is bound to bucket group {bound}, the parameter is in {mapped}"
        assert owner == wrap_index, \
            f"{what}: parameter {i}'s callback is bound to wrapper {owner}, want the current one ({wrap_index})"
        by_group.setdefault(tuple(mapped), set()).add(number)
        by_callback.setdefault(number, set()).add(tuple(mapped))
    for grp, cbs in by_group.items():
        assert len(cbs) == 1, f"{what}: bucket group {list(grp)}'s parameters carry {len(cbs)} different callbacks, want one shared"
    for cb, grps in by_callback.items():
        assert len(grps) == 1, f"{what}: one callback is shared by bucket groups {sorted(grps)}"
    assert len(by_group) == len(groups), f"{what}: callbacks for {len(by_group)} bucket groups, DDP has {len(groups)}"


def test_ddp_stamps_one_callback_per_bucket_group():
    rng = fresh()
    model = draw_model(rng)
    args = {**model, "bucket_size": bucket_size(rng, model)}
    driver = PRELUDE + """
with on_cpu():
    m = model()
    ddp = wrap(m, True, ARGS["bucket_size"])
    stamped = markers(m, ddp)
    plain = model()
    wrap(plain, False, ARGS["bucket_size"])
emit(stamped=stamped, plain=[hasattr(p, PARAM_READY_CALLBACK_ATTR) for p in plain.parameters()])
"""
    out = run(driver, args)
    n = len(model["sizes"])
    _check_stamped(out["stamped"], n, 0, f"overlap_param_gather, bucket_size={args['bucket_size']}")
    marked = [i for i, m in enumerate(out["plain"]) if m is not False]
    assert len(out["plain"]) == n and not marked, \
        f"parameters {marked} are marked although overlap_param_gather is off"
    same(out, reference(driver, args))


def test_rewrapping_replaces_or_removes_markers():
    rng = fresh()
    model = draw_model(rng)
    while True:
        overlaps = [True] + [bool(x) for x in rng.random(int(rng.integers(2, 5))) < 0.5]
        pairs = list(zip(overlaps, overlaps[1:]))
        if (True, False) in pairs and (True, True) in pairs:
            break
    wraps = [[o, bucket_size(rng, model)] for o in overlaps]
    args = {**model, "wraps": wraps}
    driver = PRELUDE + """
with on_cpu():
    m = model()
    after = []
    for overlap, size in ARGS["wraps"]:
        ddp = wrap(m, overlap, size)
        after.append(markers(m, ddp))
emit(after=after)
"""
    out = run(driver, args)
    n = len(model["sizes"])
    assert len(out["after"]) == len(wraps), f"{len(out['after'])} wraps reported, {len(wraps)} made"
    for k, ((overlap, size), st) in enumerate(zip(wraps, out["after"])):
        what = f"wrap {k} of {[w[0] for w in wraps]} (overlap_param_gather={overlap}, bucket_size={size})"
        if overlap:
            _check_stamped(st, n, k, what)
        else:
            stale = [i for i, m in enumerate(st["params"]) if m is not None]
            assert len(st["params"]) == n and not stale, \
                f"{what}: parameters {stale} still carry an older DDP's callback"
    same(out, reference(driver, args))


def _first_seen(chosen, marks):
    out = []
    for i in chosen:
        cb = marks[i]
        if cb is not None and cb not in out:
            out.append(cb)
    return out


def test_ensure_params_ready_deduplicates_within_a_call_only():
    rng = fresh()
    n_cb = int(rng.integers(2, 6))
    n = int(rng.integers(6, 15))
    # marks[i]: the callback parameter i carries, None for no marker (None markers are the
    # input-contract probe's).
    while True:
        marks = [int(c) if c >= 0 else None for c in rng.integers(-1, n_cb, size=n)]
        rounds = [[int(i) for i in rng.choice(n, size=int(rng.integers(1, 2 * n)), replace=True)]
                  for _ in range(int(rng.integers(3, 7)))]
        fired = [set(_first_seen(r, marks)) for r in rounds]
        # Some call reads two parameters of one callback, and some callback fires again in a
        # later call.
        shared = any(len([i for i in r if marks[i] is not None]) > len(f) for r, f in zip(rounds, fired))
        again = any(fired[a] & fired[b] for a in range(len(rounds)) for b in range(a + 1, len(rounds)))
        if shared and again:
            break
    out = run("""
import torch
from megatron.core.utils import PARAM_READY_CALLBACK_ATTR, ensure_params_ready

calls = []

class Callback:
    def __init__(self, name):
        self.name = name
    def __call__(self):
        calls.append(self.name)

callbacks = [Callback(k) for k in range(ARGS["callbacks"])]
params = [torch.nn.Parameter(torch.zeros(1)) for _ in ARGS["marks"]]
for p, mark in zip(params, ARGS["marks"]):
    if mark is not None:
        setattr(p, PARAM_READY_CALLBACK_ATTR, callbacks[mark])
rounds = []
for chosen in ARGS["rounds"]:
    calls.clear()
    ensure_params_ready([params[i] for i in chosen])
    rounds.append(list(calls))
emit(rounds=rounds)
""", {"callbacks": n_cb, "marks": marks, "rounds": rounds})
    want = [_first_seen(r, marks) for r in rounds]
    assert out["rounds"] == want, (
        f"callbacks fired per call {out['rounds']}, want {want}: each distinct callback once per call, "
        f"in every call, in first-seen order (markers {marks}, calls over parameters {rounds})")


def test_ensure_params_ready_input_contract():
    rng = fresh()
    n = int(rng.integers(4, 12))
    # Each parameter: its own callback, a None marker or no marker.
    while True:
        kinds = [str(k) for k in rng.choice(["own", "none", "absent"], size=n, p=[0.5, 0.25, 0.25])]
        if {"own", "none", "absent"} <= set(kinds):
            break
    forms = [str(f) for f in rng.permutation(["list", "generator", "tuple", "reversed", "map", "empty"])]
    out = run("""
import torch
from megatron.core.utils import PARAM_READY_CALLBACK_ATTR, ensure_params_ready

calls = []

def marked():
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in ARGS["kinds"]]
    for i, (p, kind) in enumerate(zip(params, ARGS["kinds"])):
        if kind == "none":
            setattr(p, PARAM_READY_CALLBACK_ATTR, None)
        elif kind == "own":
            setattr(p, PARAM_READY_CALLBACK_ATTR, lambda i=i: calls.append(i))
    return params

def given(form, params):
    if form == "list":
        return list(params)
    if form == "generator":
        return (p for p in params)
    if form == "tuple":
        return tuple(params)
    if form == "reversed":
        return reversed(params)
    if form == "map":
        return map(lambda p: p, params)
    return []

def outcome(form):
    calls.clear()
    try:
        ensure_params_ready(given(form, marked()))
    except Exception as e:
        return [type(e).__name__, list(calls)]
    return ["ok", list(calls)]

emit(**{form: outcome(form) for form in ARGS["forms"]})
""", {"kinds": kinds, "forms": forms})
    own = [i for i, k in enumerate(kinds) if k == "own"]
    for form in forms:
        want = ["ok", [] if form == "empty" else own[::-1] if form == "reversed" else own]
        assert out[form] == want, \
            f"parameters marked {kinds} given as {form}: {out[form]}, want {want} (each own callback once)"


# The stand-ins the callback tests drive: a DDP carrying only what the callback reads, and a
# bucket group that records finish_param_sync calls in a list of the driver's.
CALLBACK = """
import gc
from types import SimpleNamespace
from megatron.core.distributed.distributed_data_parallel import (
    DistributedDataParallel, _BucketParamReadyCallback)
from megatron.core.transformer import cuda_graphs

class BucketGroup:
    def __init__(self, log, dispatched, in_flight):
        self.log = log
        self.param_gather_dispatched = dispatched
        self.param_gather_handle = object() if in_flight else None

    def finish_param_sync(self, skip_next_bucket_dispatch=False):
        self.log.append(bool(skip_next_bucket_dispatch))
        self.param_gather_dispatched = True
        self.param_gather_handle = None

def fake_ddp(align, with_optimizer_step, hooks):
    ddp = object.__new__(DistributedDataParallel)
    ddp.ddp_config = SimpleNamespace(align_param_gather=align)
    ddp.overlap_param_gather_with_optimizer_step = with_optimizer_step
    ddp.remove_forward_pre_hook_handles = {object(): object()} if hooks else {}
    return ddp

def publish(s):
    log = []
    ddp = fake_ddp(s["align"], s["with_optimizer_step"], s["hooks"])
    bucket_group = BucketGroup(log, s["dispatched"], s["in_flight"])
    callback = _BucketParamReadyCallback(ddp, bucket_group)
    if s["ddp_gone"]:
        del ddp
    if s["group_gone"]:
        del bucket_group
    gc.collect()
    if s["capturing"]:
        cuda_graphs._set_capture_start()
    try:
        for _ in range(s["calls"]):
            callback()
    finally:
        cuda_graphs._set_capture_end()
    return log

emit(logs=[publish(s) for s in ARGS["scenarios"]])
"""


def _expected_calls(s):
    """finish_param_sync's skip_next_bucket_dispatch arguments for one scenario, by the rules."""
    dispatched, in_flight = s["dispatched"], s["in_flight"]
    out = []
    for _ in range(s["calls"]):
        if s["group_gone"]:
            break
        if dispatched and not in_flight:
            continue
        if s["ddp_gone"] or s["capturing"]:
            continue
        skip = s["align"] or s["with_optimizer_step"]
        if in_flight:
            out.append(skip if s["hooks"] else True)
        elif s["hooks"]:
            out.append(skip)
        else:
            continue
        dispatched, in_flight = True, False  # the stand-in's finish_param_sync publishes
    return out


def test_callback_follows_the_ddp_schedule_flags():
    rng = fresh()
    scenarios = []
    for _ in range(int(rng.integers(8, 14))):
        state = str(rng.choice(["never", "in_flight", "published", "handle_only"]))
        scenarios.append({
            "align": bool(rng.random() < 0.3),
            "with_optimizer_step": bool(rng.random() < 0.4),
            "hooks": bool(rng.random() < 0.7),
            "dispatched": state in ("in_flight", "published"),
            "in_flight": state in ("in_flight", "handle_only"),
            "capturing": bool(rng.random() < 0.25),
            "ddp_gone": bool(rng.random() < 0.1),
            "group_gone": bool(rng.random() < 0.1),
            "calls": int(rng.integers(1, 3)),
        })
    # The draw must hold a scenario where each flag decides: the optimizer-step overlap
    # alone makes the dispatch skipped, and capture alone makes the callback do nothing.
    scenarios.append({"align": False, "with_optimizer_step": True, "hooks": True,
                      "dispatched": bool(rng.random() < 0.5), "in_flight": bool(rng.random() < 0.5),
                      "capturing": False, "ddp_gone": False, "group_gone": False, "calls": 1})
    scenarios.append({"align": bool(rng.random() < 0.5), "with_optimizer_step": False,
                      "hooks": bool(rng.random() < 0.5), "dispatched": True, "in_flight": True,
                      "capturing": True, "ddp_gone": False, "group_gone": False, "calls": 1})
    if not scenarios[-2]["in_flight"]:
        scenarios[-2]["dispatched"] = False
    order = [int(i) for i in rng.permutation(len(scenarios))]
    scenarios = [scenarios[i] for i in order]
    out = run(CALLBACK, {"scenarios": scenarios})
    assert len(out["logs"]) == len(scenarios), f"{len(out['logs'])} scenarios reported, {len(scenarios)} run"
    for s, got in zip(scenarios, out["logs"]):
        want = _expected_calls(s)
        assert got == want, \
            f"scenario {s}: finish_param_sync(skip_next_bucket_dispatch=...) calls {got}, want {want}"
