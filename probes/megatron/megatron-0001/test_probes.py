"""Hidden probes for megatron-0001 (buffer layout computed up front, in the optimizer).

The judge never imports megatron. Each probe draws a model (how many parameters, their sizes,
which are expert-parallel or shared embeddings), bucket sizes and data-parallel sizes with
`fresh()`, builds layouts or a DistributedDataParallel wrapper in a child (on CPU: process
groups are stand-ins with the drawn size and rank 0, buffers are allocated on the CPU) and
sends back offsets as plain lists. The expected layouts are computed here, from the drawn
sizes, by the rules the instruction states."""

import math

from infradev_probe import fresh, run

# The child's common part: a model whose parameters are the drawn sizes (some expert-parallel),
# stand-in groups and a context that lets DistributedDataParallel be built without GPUs or a
# process group.
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
    def __init__(self, sizes, experts):
        super().__init__()
        self.ps = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(n) * 0.01) for n in sizes])
        for p, e in zip(self.ps, experts):
            if e:
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

def make_model():
    torch.manual_seed(ARGS["seed"])
    model = Model(ARGS["sizes"], ARGS["experts"]).bfloat16()
    return model, [p for _, p in model.named_parameters()]

def describe(ddp, params):
    index = {id(p): i for i, p in enumerate(params)}
    out = []
    for kind, buffers in (("dense", ddp.buffers), ("expert", ddp.expert_parallel_buffers)):
        for b in buffers:
            out.append({
                "kind": kind,
                "dtypes": [str(b.param_dtype), str(b.grad_dtype)],
                "map": sorted([index.get(id(p), -1), s, e, k] for p, (s, e, k) in b.param_index_map.items()),
                "buckets": [list(x) for x in b.bucket_indices],
                "numel": b.numel,
                "bucket_params": [sorted(index.get(id(p), -1) for p in bk.params_list) for bk in b.buckets],
            })
    return out
"""


def _pad(v, d):
    return -(-v // d) * d


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


def ref_default(items, bucket_size, isolate_shared=False):
    """The unpadded default layout (isolate_shared: what a layout that wrongly splits shared
    embeddings out would give, to make sure a draw tells the two apart)."""
    index, buckets, unpadded = {}, [], []
    start = bucket_start = 0
    open_params = 0
    for key, numel, shared in reversed(items):
        shared = shared and isolate_shared
        if shared and open_params:
            buckets.append((bucket_start, start))
            unpadded.append(start - bucket_start)
            bucket_start, open_params = start, 0
        end = start + numel
        index[key] = (start, end, len(buckets))
        open_params += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or shared:
            buckets.append((bucket_start, end))
            unpadded.append(end - bucket_start)
            bucket_start, open_params = end, 0
        start = end
    if open_params:
        buckets.append((bucket_start, start))
        unpadded.append(start - bucket_start)
    return index, buckets, unpadded


def draw_model(rng, n_lo=5, n_hi=11):
    """Parameter sizes and expert flags (at least two dense and two expert parameters)."""
    while True:
        n = int(rng.integers(n_lo, n_hi))
        experts = [bool(e) for e in rng.random(n) < 0.4]
        if sum(experts) >= 2 and n - sum(experts) >= 2:
            break
    sizes = [int(s) for s in rng.integers(1, 1500, size=n)]
    return {"seed": int(rng.integers(1 << 31)), "sizes": sizes, "experts": experts}


def groups(model):
    dense = [i for i, e in enumerate(model["experts"]) if not e]
    expert = [i for i, e in enumerate(model["experts"]) if e]
    return dense, expert


def odd_size(rng):
    """A data-parallel size whose lcm with 128 is not 128 (so padding depends on it)."""
    return int(rng.choice([3, 5, 6, 7, 9, 10, 12, 24]))


def _check_ddp_buffers(buffers, model, bucket_size, dp, edp, what):
    kinds = sorted(b["kind"] for b in buffers)
    assert kinds == ["dense", "expert"], f"{what}: buffers {kinds}, want one dense and one expert"
    dense, expert = groups(model)
    for b in buffers:
        assert b["dtypes"] == ["torch.bfloat16", "torch.float32"], f"{what}: {b['kind']} dtypes {b['dtypes']}"
        members = dense if b["kind"] == "dense" else expert
        size = dp if b["kind"] == "dense" else edp
        index, buckets, _ = ref_distopt([(i, model["sizes"][i], False) for i in members], bucket_size, size)
        got = {m[0]: tuple(m[1:]) for m in b["map"]}
        assert got == index, f"{what}: {b['kind']} buffer offsets {got}, want {index}"
        assert [tuple(x) for x in b["buckets"]] == buckets, \
            f"{what}: {b['kind']} buckets {b['buckets']}, want {buckets}"
        assert b["numel"] == buckets[-1][1], f"{what}: {b['kind']} numel {b['numel']}, want {buckets[-1][1]}"
        want_members = [sorted(i for i, v in index.items() if v[2] == k) for k in range(len(buckets))]
        assert b["bucket_params"] == want_members, \
            f"{what}: {b['kind']} bucket members {b['bucket_params']}, want {want_members}"


def _layouts(model, bucket_size, dp, edp):
    dense, expert = groups(model)
    return [ref_distopt([(i, model["sizes"][i], False) for i in m], bucket_size, size)[1]
            for m, size in ((dense, dp), (expert, edp))]


def test_ddp_builds_its_buffers_from_the_given_layout():
    # The layout is computed for a drawn bucket size; DDP's own bucket size is the 40M default
    # (one bucket per buffer), and the draw makes sure the two layouts differ.
    rng = fresh()
    while True:
        model = draw_model(rng)
        dp, edp = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        bucket_size = int(rng.integers(200, 3000))
        if _layouts(model, bucket_size, dp, edp) != _layouts(model, None, dp, edp):
            break
    args = {**model, "bucket_size": bucket_size, "dp": dp, "edp": edp}
    out = run(PRELUDE + """
with on_cpu():
    model, params = make_model()
    cfg = ddp_config()
    layout = DistributedOptimizer.compute_full_param_layout(
        params, ARGS["bucket_size"], ARGS["dp"], cfg, expert_data_parallel_world_size=ARGS["edp"])
    ddp = wrap(model, cfg, collection(ARGS["dp"], ARGS["edp"]), full_param_layout=layout)
    emit(sizes=[p.numel() for p in params], buffers=describe(ddp, params))
""", args)
    assert out["sizes"] == model["sizes"], f"model parameter sizes {out['sizes']}, want {model['sizes']}"
    _check_ddp_buffers(out["buffers"], model, bucket_size, dp, edp,
                       f"DDP given a layout for bucket_size={bucket_size}, dp={dp}, edp={edp}")


def test_ddp_without_layout_pads_each_buffer_for_its_own_group():
    # Dense and expert data-parallel groups of different drawn sizes; the draw makes sure that
    # padding the expert buffer for the dense size would give other bucket ends.
    rng = fresh()
    while True:
        model = draw_model(rng)
        dp, edp = odd_size(rng), odd_size(rng)
        bucket_size = int(rng.integers(200, 3000))
        if dp != edp and _layouts(model, bucket_size, dp, edp) != _layouts(model, bucket_size, dp, dp):
            break
    args = {**model, "bucket_size": bucket_size, "dp": dp, "edp": edp}
    out = run(PRELUDE + """
calls = []
compute = DistributedOptimizer.compute_full_param_layout

def spy(params, bucket_size, data_parallel_world_size, ddp_config, expert_data_parallel_world_size=None):
    calls.append({"params": len(params), "bucket_size": bucket_size, "dp": data_parallel_world_size,
                  "edp": expert_data_parallel_world_size})
    return compute(params, bucket_size, data_parallel_world_size, ddp_config,
                   expert_data_parallel_world_size=expert_data_parallel_world_size)

with on_cpu(), mock.patch.object(DistributedOptimizer, "compute_full_param_layout", staticmethod(spy)):
    model, params = make_model()
    ddp = wrap(model, ddp_config(bucket_size=ARGS["bucket_size"]), collection(ARGS["dp"], ARGS["edp"]))
    emit(buffers=describe(ddp, params), calls=calls)
""", args)
    what = f"DDP computing its own layout (bucket_size={bucket_size}, dp={dp}, edp={edp})"
    want_call = {"params": len(model["sizes"]), "bucket_size": bucket_size, "dp": dp, "edp": edp}
    assert out["calls"] and all(c == want_call for c in out["calls"]), (
        f"{what}: DistributedOptimizer.compute_full_param_layout calls {out['calls']}, "
        f"want it called with {want_call}")
    _check_ddp_buffers(out["buffers"], model, bucket_size, dp, edp, what)


DEFAULT_LAYOUT = """
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

cfg = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True,
                                    pad_buckets_for_high_nccl_busbw=ARGS["busbw"])
emit(default=dump(_compute_default_per_buffer_param_layout(params, None)),
     default_sized=dump(_compute_default_per_buffer_param_layout(params, ARGS["bucket_size"])),
     distopt=dump(DistributedOptimizer._compute_per_buffer_param_layout(
         params, ARGS["distopt_bucket_size"], ARGS["dp"], cfg)))
"""


def test_default_layout_does_not_isolate_shared_embeddings():
    rng = fresh()
    while True:
        n = int(rng.integers(4, 10))
        sizes = [int(s) for s in rng.integers(1, 900, size=n)]
        shared = [bool(s) for s in rng.random(n) < 0.35]
        bucket_size = int(rng.integers(100, 2500))
        items = [(i, s, f) for i, (s, f) in enumerate(zip(sizes, shared))]
        if (ref_default(items, None) != ref_default(items, None, isolate_shared=True)
                and ref_default(items, bucket_size) != ref_default(items, bucket_size, isolate_shared=True)):
            break
    dp = int(rng.integers(1, 13))
    busbw = bool(rng.random() < 0.3)
    distopt_bucket_size = None if rng.random() < 0.4 else int(rng.integers(100, 2500))
    out = run(DEFAULT_LAYOUT, {"sizes": sizes, "shared": shared, "bucket_size": bucket_size,
                               "dp": dp, "busbw": busbw, "distopt_bucket_size": distopt_bucket_size})
    for name, bs in (("default", None), ("default_sized", bucket_size)):
        index, buckets, unpadded = ref_default(items, bs)
        got = out[name]
        assert {m[0]: tuple(m[1:]) for m in got["map"]} == index, \
            f"default layout (bucket_size={bs}, shared={shared}) offsets {got['map']}, want {index}"
        assert [tuple(b) for b in got["buckets"]] == buckets, \
            f"default layout (bucket_size={bs}, shared={shared}) buckets {got['buckets']}, want {buckets}"
        assert got["unpadded"] == unpadded, f"default layout unpadded sizes {got['unpadded']}, want {unpadded}"
        assert got["indices"] == [], f"default layout param_indices {got['indices']}"
    index, buckets, unpadded = ref_distopt(items, distopt_bucket_size, dp, busbw)
    got = out["distopt"]
    what = f"distributed optimizer (bucket_size={distopt_bucket_size}, dp={dp}, busbw={busbw}, shared={shared})"
    assert {m[0]: tuple(m[1:]) for m in got["map"]} == index, f"{what} offsets {got['map']}, want {index}"
    assert [tuple(b) for b in got["buckets"]] == buckets, f"{what} buckets {got['buckets']}, want {buckets}"
    assert got["unpadded"] == unpadded, f"{what} unpadded sizes {got['unpadded']}, want {unpadded}"


FULL_LAYOUT = """
import torch
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

params = []
for n, e in zip(ARGS["sizes"], ARGS["experts"]):
    p = torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16))
    if e:
        p.allreduce = False
    params.append(p)
cfg = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=False)

def dump(full):
    index = {id(p): i for i, p in enumerate(params)}
    return {("expert" if k.is_expert_parallel else "dense"): {
                "buckets": [list(b) for b in v.bucket_indices],
                "map": sorted([index[id(p)], *x] for p, x in v.param_index_map.items()),
                "indices": list(v.param_indices)}
            for k, v in full.layouts.items()}

emit(implicit=dump(DistributedOptimizer.compute_full_param_layout(
         params, ARGS["bucket_size"], ARGS["dp"], cfg)),
     explicit=dump(DistributedOptimizer.compute_full_param_layout(
         params, ARGS["bucket_size"], ARGS["dp"], cfg, expert_data_parallel_world_size=ARGS["edp"])))
"""


def test_expert_layout_defaults_to_the_dense_data_parallel_size():
    rng = fresh()
    while True:
        model = draw_model(rng, 4, 9)
        dp, edp = odd_size(rng), odd_size(rng)
        bucket_size = None if rng.random() < 0.5 else int(rng.integers(200, 3000))
        dense, expert = groups(model)
        ex = [(i, model["sizes"][i], False) for i in expert]
        one, for_dp, for_edp = (ref_distopt(ex, bucket_size, s)[1] for s in (1, dp, edp))
        if len({str(one), str(for_dp), str(for_edp)}) == 3:
            break
    out = run(FULL_LAYOUT, {**model, "bucket_size": bucket_size, "dp": dp, "edp": edp})
    dense_index, dense_buckets, _ = ref_distopt([(i, model["sizes"][i], False) for i in dense], bucket_size, dp)
    for name, size in (("implicit", dp), ("explicit", edp)):
        got = out[name]
        assert sorted(got) == ["dense", "expert"], f"{name}: layouts for {sorted(got)}, want dense and expert"
        expert_index, expert_buckets, _ = ref_distopt(ex, bucket_size, size)
        for kind, index, buckets, members in (("dense", dense_index, dense_buckets, dense),
                                              ("expert", expert_index, expert_buckets, expert)):
            g = got[kind]
            assert [tuple(b) for b in g["buckets"]] == buckets, (
                f"{name} (dp={dp}, edp={edp}, bucket_size={bucket_size}): {kind} buckets {g['buckets']}, "
                f"want {buckets}" + (f" (padded for {size} ranks)" if kind == "expert" else ""))
            assert {m[0]: tuple(m[1:]) for m in g["map"]} == index, f"{name}: {kind} offsets {g['map']}, want {index}"
            assert g["indices"] == list(range(len(members))), \
                f"{name}: {kind} param_indices {g['indices']}, want {list(range(len(members)))}"


def test_ddp_rejects_a_layout_of_other_parameters():
    # A drawn sequence of attempts: layouts of exactly the module's parameters (DDP must build
    # from them) and layouts with a stranger parameter of the same dtype, with a stranger of
    # another dtype (a buffer the module does not need), or missing one of the module's
    # parameters (DDP must raise AssertionError).
    rng = fresh()
    model = draw_model(rng)
    dp, edp = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    kinds = ["valid", "extra_same", "extra_dtype", "missing"]
    while True:
        attempts = [str(k) for k in rng.choice(kinds, size=int(rng.integers(4, 7)))]
        if "valid" in attempts and ("extra_same" in attempts or "extra_dtype" in attempts):
            break
    bucket_sizes = [int(rng.integers(200, 3000)) for _ in attempts]
    dense, _ = groups(model)
    missing = [int(rng.choice(dense)) for _ in attempts]
    strangers = [int(rng.integers(1, 500)) for _ in attempts]
    args = {**model, "dp": dp, "edp": edp, "attempts": attempts, "bucket_sizes": bucket_sizes,
            "missing": missing, "strangers": strangers}
    out = run(PRELUDE + """
def attempt(kind, bucket_size, missing, stranger):
    with on_cpu():
        model, params = make_model()
        laid = list(params)
        if kind == "extra_same":
            laid.append(torch.nn.Parameter(torch.zeros(stranger, dtype=torch.bfloat16)))
        elif kind == "extra_dtype":
            laid.append(torch.nn.Parameter(torch.zeros(stranger, dtype=torch.float32)))
        elif kind == "missing":
            del laid[missing]
        cfg = ddp_config()
        layout = DistributedOptimizer.compute_full_param_layout(
            laid, bucket_size, ARGS["dp"], cfg, expert_data_parallel_world_size=ARGS["edp"])
        try:
            ddp = wrap(model, cfg, collection(ARGS["dp"], ARGS["edp"]), full_param_layout=layout)
        except AssertionError:
            return {"outcome": "rejected"}
        return {"outcome": "built", "buffers": describe(ddp, params)}

emit(results=[attempt(*a) for a in zip(ARGS["attempts"], ARGS["bucket_sizes"], ARGS["missing"],
                                        ARGS["strangers"])])
""", args)
    results = out["results"]
    assert len(results) == len(attempts), f"{len(results)} results for {len(attempts)} attempts"
    for kind, bs, res in zip(attempts, bucket_sizes, results):
        what = {"valid": "a layout of exactly the module's parameters",
                "extra_same": "a layout placing a parameter the module does not have",
                "extra_dtype": "a layout with a buffer (float32) the module does not need",
                "missing": "a layout missing one of the module's parameters"}[kind]
        if kind == "valid":
            assert res.get("outcome") == "built", f"DDP did not build from {what} (outcome {res.get('outcome')})"
            _check_ddp_buffers(res["buffers"], model, bs, dp, edp, f"DDP given {what} (bucket_size={bs})")
        else:
            assert res.get("outcome") == "rejected" and set(res) == {"outcome"}, \
                f"DDP accepted {what}: want AssertionError (outcome {res.get('outcome')})"
