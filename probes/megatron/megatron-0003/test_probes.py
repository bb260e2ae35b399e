"""Hidden probes for megatron-0003 (DDP parameter readiness protocol).

The judge never imports megatron. Children build DistributedDataParallel wrappers on the CPU
(process groups are stand-ins with a fixed size and rank 0) or drive the readiness callback with
stand-in bucket groups, and send back which callbacks sit where and which calls were made."""

from infradev_probe import run

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

def model():
    torch.manual_seed(0)
    m = torch.nn.Module()
    m.dense = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(4)])
    m.experts = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(2)])
    for p in m.experts.parameters():
        p.allreduce = False
    return m.bfloat16()

def wrap(m, overlap_param_gather):
    cfg = DistributedDataParallelConfig(
        use_distributed_optimizer=overlap_param_gather, overlap_grad_reduce=True,
        overlap_param_gather=overlap_param_gather, bucket_size=300, grad_reduce_in_fp32=True)
    config = TransformerConfig(num_attention_heads=1, num_layers=1, calculate_per_token_loss=True)
    return DistributedDataParallel(config, ddp_config=cfg, module=m, pg_collection=collection(2, 2))

def markers(m, ddp):
    \"\"\"Per parameter: [its bucket group's index (dense groups first), callback number,
    callback bound to that bucket group, callback bound to ddp]; None when unmarked.\"\"\"
    groups = list(ddp.bucket_groups) + list(ddp.expert_parallel_bucket_groups)
    numbers = {}
    out = []
    for p in m.parameters():
        cb = getattr(p, PARAM_READY_CALLBACK_ATTR, None)
        if cb is None:
            out.append(None)
            continue
        bg = ddp.param_to_bucket_group.get(p)
        out.append([groups.index(bg) if bg is not None else -1,
                    numbers.setdefault(id(cb), len(numbers)),
                    cb._bucket_group() is bg, cb._ddp() is ddp])
    return {"groups": [len(ddp.bucket_groups), len(ddp.expert_parallel_bucket_groups)], "params": out}
"""

# The stand-ins the callback tests drive: a DDP carrying only what the callback reads, and a
# bucket group that records finish_param_sync calls.
FAKES = """
from types import SimpleNamespace
from megatron.core.distributed.distributed_data_parallel import (
    DistributedDataParallel, _BucketParamReadyCallback)
from megatron.core.transformer import cuda_graphs

class BucketGroup:
    def __init__(self, dispatched=False, in_flight=False):
        self.calls = []
        self.param_gather_dispatched = dispatched
        self.param_gather_handle = object() if in_flight else None

    def finish_param_sync(self, skip_next_bucket_dispatch=False):
        self.calls.append(bool(skip_next_bucket_dispatch))
        self.param_gather_dispatched = True
        self.param_gather_handle = None

def fake_ddp(align=False, with_optimizer_step=False, hooks=True):
    ddp = object.__new__(DistributedDataParallel)
    ddp.ddp_config = SimpleNamespace(align_param_gather=align)
    ddp.overlap_param_gather_with_optimizer_step = with_optimizer_step
    ddp.remove_forward_pre_hook_handles = {object(): object()} if hooks else {}
    return ddp
"""


def test_ddp_stamps_one_callback_per_bucket_group():
    out = run(PRELUDE + """
with on_cpu():
    m = model()
    ddp = wrap(m, True)
    stamped = markers(m, ddp)
    plain = model()
    wrap(plain, False)
emit(stamped=stamped, plain=[hasattr(p, PARAM_READY_CALLBACK_ATTR) for p in plain.parameters()])
""")
    dense_groups, expert_groups = out["stamped"]["groups"]
    assert dense_groups >= 2 and expert_groups >= 2, f"probe setup: bucket groups {out['stamped']['groups']}"
    params = out["stamped"]["params"]
    assert len(params) == 12
    unmarked = [i for i, m in enumerate(params) if m is None]
    assert not unmarked, f"parameters {unmarked} carry no readiness callback (8-11 are expert parameters)"
    by_group, by_callback = {}, {}
    for i, (grp, cb, bound_group, bound_ddp) in enumerate(params):
        assert grp >= 0, f"parameter {i} is in no bucket group"
        assert bound_group, f"parameter {i}'s callback is not bound to the parameter's bucket group"
        assert bound_ddp, f"parameter {i}'s callback is not bound to the DDP that owns it"
        by_group.setdefault(grp, set()).add(cb)
        by_callback.setdefault(cb, set()).add(grp)
    for grp, cbs in by_group.items():
        assert len(cbs) == 1, f"bucket group {grp}'s parameters carry {len(cbs)} different callbacks, want one shared"
    for cb, grps in by_callback.items():
        assert len(grps) == 1, f"one callback is shared by bucket groups {sorted(grps)}"
    assert len(by_group) == dense_groups + expert_groups, \
        f"callbacks for {len(by_group)} bucket groups, DDP has {dense_groups + expert_groups}"
    assert not any(out["plain"]), "parameters are marked although overlap_param_gather is off"


def test_rewrapping_replaces_or_removes_markers():
    out = run(PRELUDE + """
with on_cpu():
    m = model()
    first = wrap(m, True)
    before = markers(m, first)
    second = wrap(m, False)
    after_plain = [hasattr(p, PARAM_READY_CALLBACK_ATTR) for p in m.parameters()]
    third = wrap(m, True)
    after_third = markers(m, third)
emit(before=before, after_plain=after_plain, after_third=after_third)
""")
    assert all(m is not None and m[2] and m[3] for m in out["before"]["params"]), "first wrap: markers missing"
    stale = [i for i, marked in enumerate(out["after_plain"]) if marked]
    assert not stale, \
        f"after re-wrapping without overlap_param_gather, parameters {stale} still carry the old DDP's callback"
    for i, m in enumerate(out["after_third"]["params"]):
        assert m is not None, f"after wrapping again, parameter {i} carries no callback"
        assert m[2] and m[3], f"after wrapping again, parameter {i}'s callback belongs to an older DDP"


def test_ensure_params_ready_deduplicates_within_a_call_only():
    out = run("""
import torch
from megatron.core.utils import PARAM_READY_CALLBACK_ATTR, ensure_params_ready

calls = []

class Callback:
    def __init__(self, name):
        self.name = name
    def __call__(self):
        calls.append(self.name)

a, b = Callback("a"), Callback("b")
params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(5)]
for p, cb in zip(params, [a, a, b, None, a]):
    if cb is not None:
        setattr(p, PARAM_READY_CALLBACK_ATTR, cb)
rounds = []
for chosen in ([0, 1, 2], [0, 1, 2], [4, 3], [2, 2, 0]):
    calls.clear()
    ensure_params_ready([params[i] for i in chosen])
    rounds.append(list(calls))
emit(rounds=rounds)
""")
    want = [["a", "b"], ["a", "b"], ["a"], ["b", "a"]]
    assert out["rounds"] == want, \
        f"callbacks fired per call {out['rounds']}, want {want}: once per bucket in every call, in first-seen order"


def test_ensure_params_ready_input_contract():
    out = run("""
import torch
from megatron.core.utils import PARAM_READY_CALLBACK_ATTR, ensure_params_ready

calls = []

def fresh():
    # Four parameters: one marked None, two with their own callback, one unmarked.
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(4)]
    setattr(params[0], PARAM_READY_CALLBACK_ATTR, None)
    setattr(params[1], PARAM_READY_CALLBACK_ATTR, lambda: calls.append("x"))
    setattr(params[3], PARAM_READY_CALLBACK_ATTR, lambda: calls.append("y"))
    return params

def outcome(arg):
    calls.clear()
    try:
        ensure_params_ready(arg)
    except Exception as e:
        return [type(e).__name__, list(calls)]
    return ["ok", list(calls)]

emit(generator=outcome(p for p in fresh()), empty=outcome([]), tuple_=outcome(tuple(fresh()[::-1])))
""")
    assert out["generator"] == ["ok", ["x", "y"]], \
        f"a generator of parameters (one marked None): {out['generator']}, want both callbacks once"
    assert out["empty"] == ["ok", []], f"no parameters: {out['empty']}"
    assert out["tuple_"] == ["ok", ["y", "x"]], f"a tuple of parameters: {out['tuple_']}"


def test_callback_follows_the_ddp_schedule_flags():
    out = run(FAKES + """
def publish(ddp, bucket_group, capturing=False):
    callback = _BucketParamReadyCallback(ddp, bucket_group)
    if capturing:
        cuda_graphs._set_capture_start()
    try:
        callback()
    finally:
        cuda_graphs._set_capture_end()
    return list(bucket_group.calls)

emit(
    with_optimizer_step=publish(fake_ddp(with_optimizer_step=True), BucketGroup()),
    with_optimizer_step_in_flight=publish(fake_ddp(with_optimizer_step=True), BucketGroup(True, True)),
    plain=publish(fake_ddp(), BucketGroup()),
    capturing=publish(fake_ddp(), BucketGroup(), capturing=True),
    capturing_in_flight=publish(fake_ddp(), BucketGroup(True, True), capturing=True),
    published_hooks_off=publish(fake_ddp(hooks=False), BucketGroup(True, False)),
)
""")
    assert out["with_optimizer_step"] == [True], \
        f"overlap_param_gather_with_optimizer_step: finish_param_sync calls {out['with_optimizer_step']}, want [True] (no next-bucket dispatch)"
    assert out["with_optimizer_step_in_flight"] == [True], \
        f"overlap_param_gather_with_optimizer_step, gather in flight: {out['with_optimizer_step_in_flight']}, want [True]"
    assert out["plain"] == [False], f"default schedule: {out['plain']}, want [False]"
    assert out["capturing"] == [], f"during CUDA-graph capture the callback started work: {out['capturing']}"
    assert out["capturing_in_flight"] == [], f"during CUDA-graph capture the callback waited: {out['capturing_in_flight']}"
    assert out["published_hooks_off"] == [], f"an already published bucket was synced again: {out['published_hooks_off']}"
