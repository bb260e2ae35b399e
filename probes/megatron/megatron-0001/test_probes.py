"""Hidden probes for megatron-0001 (buffer layout computed up front, in the optimizer).

The judge never imports megatron. Each probe builds layouts or a DistributedDataParallel wrapper
in a child (on CPU: process groups are stand-ins with a fixed size and rank 0, buffers are
allocated on the CPU) and sends back offsets as plain lists; the reference layouts are computed
here from the parameter sizes."""

import math

from infradev_probe import run

# The child's common part: a model with dense and expert-parallel layers, stand-in groups and a
# context that lets DistributedDataParallel be built without GPUs or a process group.
PRELUDE = """
import contextlib
from unittest import mock
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer import TransformerConfig

def group(size):
    g = mock.MagicMock()
    g.size.return_value = size
    g.rank.return_value = 0
    return g

def collection(dp, edp):
    one, d, e = group(1), group(dp), group(edp)
    return ProcessGroupCollection(tp=one, pp=one, ep=one, dp=d, dp_cp=d, intra_dp_cp=d,
                                  expt_dp=e, intra_expt_dp=e)

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = torch.nn.ModuleList([torch.nn.Linear(24, 40), torch.nn.Linear(40, 40),
                                          torch.nn.Linear(40, 24)])
        self.experts = torch.nn.ModuleList([torch.nn.Linear(24, 20), torch.nn.Linear(24, 20)])
        for p in self.experts.parameters():
            p.allreduce = False

def on_cpu():
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch("torch.cuda.current_device", return_value="cpu"))
    stack.enter_context(mock.patch("torch.distributed.is_initialized", return_value=True))
    stack.enter_context(mock.patch("torch.distributed.get_rank", return_value=0))
    return stack

def ddp_config(bucket_size=None):
    return DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=True,
                                         bucket_size=bucket_size, grad_reduce_in_fp32=True,
                                         average_in_collective=False)

def wrap(model, cfg, pg, **kw):
    config = TransformerConfig(num_attention_heads=1, num_layers=1, calculate_per_token_loss=True)
    return DistributedDataParallel(config, ddp_config=cfg, module=model, pg_collection=pg, **kw)

def describe(ddp, params):
    index = {id(p): i for i, p in enumerate(params)}
    out = []
    for kind, buffers in (("dense", ddp.buffers), ("expert", ddp.expert_parallel_buffers)):
        for b in buffers:
            out.append({
                "kind": kind,
                "dtypes": [str(b.param_dtype), str(b.grad_dtype)],
                "map": sorted([index[id(p)], s, e, k] for p, (s, e, k) in b.param_index_map.items()),
                "buckets": [list(x) for x in b.bucket_indices],
                "numel": b.numel,
                "bucket_params": [sorted(index[id(p)] for p in bk.params_list) for bk in b.buckets],
            })
    return out
"""

# named_parameters order of PRELUDE's Model: (numel, expert?)
PARAMS = [(960, False), (40, False), (1600, False), (40, False), (960, False), (24, False),
          (480, True), (20, True), (480, True), (20, True)]
DENSE = [i for i, (_, e) in enumerate(PARAMS) if not e]
EXPERT = [i for i, (_, e) in enumerate(PARAMS) if e]


def _pad(v, d):
    return int(math.ceil(v / d) * d)


def ref_distopt(items, bucket_size, dp, busbw=False):
    """The distributed optimizer's layout of items = [(key, numel, shared)] in forward order:
    {key: (start, end, bucket)}, bucket_indices, per_bucket_numel_unpadded."""
    div = math.lcm(dp, 128, 2 ** 16) if busbw else math.lcm(dp, 128)
    index, buckets, unpadded = {}, [], []
    start = bucket_start = 0
    open_params = 0
    end = 0
    for key, numel, shared in reversed(items):
        start = _pad(start, 64)
        if shared and open_params:
            unpadded.append(start - bucket_start)
            bucket_start = _pad(start, div)
            buckets.append((len(buckets) and buckets[-1][1], bucket_start))
            open_params, start = 0, bucket_start
        end = start + numel
        index[key] = (start, end, len(buckets))
        open_params += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or shared:
            unpadded.append(end - bucket_start)
            bucket_start = _pad(end, div)
            buckets.append((len(buckets) and buckets[-1][1], bucket_start))
            open_params, start = 0, bucket_start
        else:
            start = end
    if open_params:
        unpadded.append(end - bucket_start)
        buckets.append((len(buckets) and buckets[-1][1], _pad(end, div)))
    return index, buckets, unpadded


def ref_default(items, bucket_size):
    index, buckets, unpadded = {}, [], []
    start = bucket_start = 0
    open_params = 0
    for key, numel, _ in reversed(items):
        end = start + numel
        index[key] = (start, end, len(buckets))
        open_params += 1
        if bucket_size is not None and end - bucket_start >= bucket_size:
            buckets.append((bucket_start, end))
            unpadded.append(end - bucket_start)
            bucket_start, open_params = end, 0
        start = end
    if open_params:
        buckets.append((bucket_start, start))
        unpadded.append(start - bucket_start)
    return index, buckets, unpadded


def _check_ddp_buffers(buffers, bucket_size, dp, edp, what):
    kinds = sorted(b["kind"] for b in buffers)
    assert kinds == ["dense", "expert"], f"{what}: buffers {kinds}, want one dense and one expert"
    for b in buffers:
        assert b["dtypes"] == ["torch.bfloat16", "torch.float32"], f"{what}: {b['kind']} dtypes {b['dtypes']}"
        members = DENSE if b["kind"] == "dense" else EXPERT
        size = dp if b["kind"] == "dense" else edp
        index, buckets, _ = ref_distopt([(i, PARAMS[i][0], False) for i in members], bucket_size, size)
        got = {m[0]: tuple(m[1:]) for m in b["map"]}
        assert got == index, f"{what}: {b['kind']} buffer offsets {got}, want {index}"
        assert [tuple(x) for x in b["buckets"]] == buckets, \
            f"{what}: {b['kind']} buckets {b['buckets']}, want {buckets}"
        assert b["numel"] == buckets[-1][1], f"{what}: {b['kind']} numel {b['numel']}"
        want_members = [sorted(i for i, v in index.items() if v[2] == k) for k in range(len(buckets))]
        assert b["bucket_params"] == want_members, \
            f"{what}: {b['kind']} bucket members {b['bucket_params']}, want {want_members}"


def test_ddp_builds_its_buffers_from_the_given_layout():
    # The layout is computed for bucket_size=1000; DDP's own bucket size is the 40M default.
    out = run(PRELUDE + """
with on_cpu():
    torch.manual_seed(0)
    model = Model().bfloat16()
    params = [p for _, p in model.named_parameters()]
    cfg = ddp_config()
    layout = DistributedOptimizer.compute_full_param_layout(
        params, 1000, 4, cfg, expert_data_parallel_world_size=2)
    ddp = wrap(model, cfg, collection(4, 2), full_param_layout=layout)
    emit(sizes=[p.numel() for p in params], buffers=describe(ddp, params))
""")
    assert out["sizes"] == [n for n, _ in PARAMS]
    _check_ddp_buffers(out["buffers"], 1000, 4, 2, "DDP given a layout")


def test_ddp_without_layout_pads_each_buffer_for_its_own_group():
    # Dense data-parallel group of 3 ranks, expert data-parallel group of 5.
    out = run(PRELUDE + """
with on_cpu():
    torch.manual_seed(0)
    model = Model().bfloat16()
    params = [p for _, p in model.named_parameters()]
    ddp = wrap(model, ddp_config(bucket_size=700), collection(3, 5))
    emit(buffers=describe(ddp, params))
""")
    _check_ddp_buffers(out["buffers"], 700, 3, 5, "DDP computing its own layout")


def test_default_layout_does_not_isolate_shared_embeddings():
    sizes = [300, 70, 500, 130, 90]
    shared = [True, False, False, True, False]
    out = run("""
import torch
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.distributed.param_and_grad_buffer import _compute_default_per_buffer_param_layout
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

params = []
for n, s in zip(ARGS["sizes"], ARGS["shared"]):
    p = torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16))
    if s:
        p.shared_embedding = True
    params.append(p)

def dump(layout):
    index = {id(p): i for i, p in enumerate(params)}
    return {"map": sorted([index[id(p)], *v] for p, v in layout.param_index_map.items()),
            "buckets": [list(b) for b in layout.bucket_indices],
            "unpadded": list(layout.per_bucket_numel_unpadded),
            "indices": list(layout.param_indices)}

cfg = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
emit(default=dump(_compute_default_per_buffer_param_layout(params, None)),
     default_sized=dump(_compute_default_per_buffer_param_layout(params, 550)),
     distopt=dump(DistributedOptimizer._compute_per_buffer_param_layout(params, None, 2, cfg)))
""", {"sizes": sizes, "shared": shared})
    items = [(i, n, s) for i, (n, s) in enumerate(zip(sizes, shared))]
    for name, bucket_size in (("default", None), ("default_sized", 550)):
        index, buckets, unpadded = ref_default(items, bucket_size)
        got = out[name]
        assert {m[0]: tuple(m[1:]) for m in got["map"]} == index, \
            f"default layout (bucket_size={bucket_size}) offsets {got['map']}, want {index}"
        assert [tuple(b) for b in got["buckets"]] == buckets, \
            f"default layout (bucket_size={bucket_size}) buckets {got['buckets']}, want {buckets}"
        assert got["unpadded"] == unpadded, f"default layout unpadded sizes {got['unpadded']}"
        assert got["indices"] == [], f"default layout param_indices {got['indices']}"
    index, buckets, unpadded = ref_distopt(items, None, 2)
    got = out["distopt"]
    assert {m[0]: tuple(m[1:]) for m in got["map"]} == index, f"distributed optimizer offsets {got['map']}"
    assert [tuple(b) for b in got["buckets"]] == buckets, f"distributed optimizer buckets {got['buckets']}"
    assert got["unpadded"] == unpadded, f"distributed optimizer unpadded sizes {got['unpadded']}"


def test_expert_layout_defaults_to_the_dense_data_parallel_size():
    out = run("""
import torch
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

def param(n, expert):
    p = torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16))
    if expert:
        p.allreduce = False
    return p

params = [param(100, False), param(100, True), param(300, False), param(60, True)]
cfg = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=False)

def dump(full):
    return {("expert" if k.is_expert_parallel else "dense"): [list(b) for b in v.bucket_indices]
            for k, v in full.layouts.items()}

emit(implicit=dump(DistributedOptimizer.compute_full_param_layout(params, None, 3, cfg)),
     explicit=dump(DistributedOptimizer.compute_full_param_layout(
         params, None, 3, cfg, expert_data_parallel_world_size=5)))
""")
    dense = ref_distopt([(0, 100, False), (2, 300, False)], None, 3)[1]
    for name, edp in (("implicit", 3), ("explicit", 5)):
        expert = ref_distopt([(1, 100, False), (3, 60, False)], None, edp)[1]
        got = {k: [tuple(b) for b in v] for k, v in out[name].items()}
        assert got.get("dense") == dense, f"{name}: dense buckets {got.get('dense')}, want {dense}"
        assert got.get("expert") == expert, \
            f"{name} expert data-parallel size: expert buckets {got.get('expert')}, want {expert} (padded for {edp} ranks)"


def test_ddp_rejects_a_layout_of_other_parameters():
    out = run(PRELUDE + """
def attempt(extra_dtype):
    with on_cpu():
        torch.manual_seed(0)
        model = Model().bfloat16()
        params = [p for _, p in model.named_parameters()]
        stranger = torch.nn.Parameter(torch.zeros(64, dtype=extra_dtype))
        cfg = ddp_config()
        layout = DistributedOptimizer.compute_full_param_layout(
            params + [stranger], None, 2, cfg, expert_data_parallel_world_size=2)
        try:
            wrap(model, cfg, collection(2, 2), full_param_layout=layout)
            return "built"
        except (AssertionError, ValueError) as e:
            return "rejected"

emit(same_dtype=attempt(torch.bfloat16), other_dtype=attempt(torch.float32))
""")
    assert out["same_dtype"] == "rejected", \
        "DDP accepted a layout that places a parameter the module does not have"
    assert out["other_dtype"] == "rejected", \
        "DDP accepted a layout with a buffer the module does not need"
