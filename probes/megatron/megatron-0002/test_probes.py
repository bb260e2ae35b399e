"""Hidden probes for megatron-0002 (layer-wise distributed optimizer on DDP's buffers).

The judge never imports megatron. Every probe draws its scenario with `fresh()`: parameter
sizes, shared-embedding and expert flags, data-parallel sizes and ranks, bucket sizes, how the
optimizers' param groups split the parameters, how many model chunks and steps, what the
chained step returns. Children build layouts, DistributedDataParallel wrappers and
LayerWiseDistributedOptimizer instances on the CPU (process groups are stand-ins with the drawn
size and rank) and send back offsets and parameter indices as plain lists, which the judge
checks against its own arithmetic: the layout invariants the instruction states, and the
shards of a layout the judge itself draws and hands to DDP."""

import math

from infradev_probe import fresh, run

PRELUDE = """
import contextlib
from unittest import mock
import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.distributed.param_and_grad_buffer import group_params_for_buffers
from megatron.core.optimizer import OptimizerConfig
from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
from megatron.core.optimizer.param_layout import FullParamLayout, PerBufferParamLayout
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer import TransformerConfig

def group(size, rank):
    g = mock.MagicMock()
    g.size.return_value = size
    g.rank.return_value = rank
    return g

def collection(dp, dp_rank, edp, edp_rank):
    one, d, e = group(1, 0), group(dp, dp_rank), group(edp, edp_rank)
    return ProcessGroupCollection(tp=one, pp=one, ep=one, dp=d, dp_cp=d, intra_dp_cp=d,
                                  expt_dp=e, intra_expt_dp=e)

def on_cpu():
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch("torch.cuda.current_device", return_value="cpu"))
    stack.enter_context(mock.patch("torch.distributed.is_initialized", return_value=True))
    stack.enter_context(mock.patch("torch.distributed.get_rank", return_value=0))
    return stack

def Model(sizes, experts):
    model = torch.nn.Module()
    model.ps = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.randn(n) * 0.01) for n in sizes])
    for p, e in zip(model.ps, experts):
        if e:
            p.allreduce = False
    return model

def wrap(model, cfg, pg, **kw):
    config = TransformerConfig(num_attention_heads=1, num_layers=1, calculate_per_token_loss=True)
    return DistributedDataParallel(config, ddp_config=cfg, module=model, pg_collection=pg, **kw)

def ddp_config(distopt=True):
    return DistributedDataParallelConfig(use_distributed_optimizer=distopt, overlap_grad_reduce=True,
                                         bucket_size=None, grad_reduce_in_fp32=True)

def given_layout(params, spec):
    # The judge's layout (spec: one entry per buffer, by expert flag) as a FullParamLayout.
    layouts = {}
    for key, (group_params, indices) in group_params_for_buffers(params, True).items():
        buf = spec["expert" if key.is_expert_parallel else "dense"]
        layouts[key] = PerBufferParamLayout(
            param_index_map={params[i]: (s, e, b) for i, s, e, b in buf["map"]},
            bucket_indices=[tuple(x) for x in buf["buckets"]],
            per_bucket_numel_unpadded=list(buf["unpadded"]),
            param_indices=indices)
    return FullParamLayout(layouts=layouts)

def dump(full, params):
    if full is None:
        return None
    index = {id(p): i for i, p in enumerate(params)}
    return {("expert" if k.is_expert_parallel else "dense"): {
                "map": sorted([index.get(id(p), -1), *v] for p, v in l.param_index_map.items()),
                "buckets": [list(b) for b in l.bucket_indices]}
            for k, l in full.layouts.items()}
"""


def _pad(v, d):
    return -(-v // d) * d


def bucket_divisor(dp, busbw):
    return math.lcm(dp, 128, 2 ** 16) if busbw else math.lcm(dp, 128)


def shard_divisor(dp, busbw=False):
    return math.lcm(64, bucket_divisor(dp, busbw) // dp)


def _check_layout(name, numels, shared, layout, dp, busbw, bucket_size, indices):
    """Every invariant a layer-wise layout must hold, from the judge's own arithmetic."""
    where = f"{name} (numels={numels}, shared={shared}, dp={dp}, bucket_size={bucket_size}, high_busbw={busbw})"
    got = {m[0]: tuple(m[1:]) for m in layout["map"]}
    assert len(layout["map"]) == len(numels) and sorted(got) == list(range(len(numels))), \
        f"{where}: parameters placed {sorted(got)}"
    buckets = [tuple(b) for b in layout["buckets"]]
    assert buckets and buckets[0][0] == 0, f"{where}: buckets {buckets} do not start at 0"
    sdiv = shard_divisor(dp, busbw)
    for k, (lo, hi) in enumerate(buckets):
        if k:
            assert lo == buckets[k - 1][1], f"{where}: bucket {k} starts at {lo}, previous ends at {buckets[k - 1][1]}"
        assert hi > lo and (hi - lo) % dp == 0, f"{where}: bucket {k} size {hi - lo} not divisible by {dp}"
        assert ((hi - lo) // dp) % sdiv == 0, \
            f"{where}: bucket {k} shard size {(hi - lo) // dp} not a multiple of the shard divisor {sdiv}"
    spans = []
    for i, (s, e, b) in got.items():
        assert e - s == numels[i], f"{where}: parameter {i} spans {e - s}, has {numels[i]} elements"
        assert s % 64 == 0, f"{where}: parameter {i} starts at {s}, not 64-aligned"
        assert 0 <= b < len(buckets), f"{where}: parameter {i} in bucket {b} of {len(buckets)}"
        lo, hi = buckets[b]
        shard = (hi - lo) // dp
        k = (s - lo) // shard
        assert lo <= s and e <= hi, f"{where}: parameter {i} at [{s}, {e}) lies outside its bucket {b} {buckets[b]}"
        assert e <= lo + (k + 1) * shard, \
            f"{where}: parameter {i} at [{s}, {e}) crosses the end of shard {k} of bucket {b} {buckets[b]}"
        spans.append((s, e, i))
    spans.sort()
    for (s0, e0, i0), (s1, e1, i1) in zip(spans, spans[1:]):
        assert e0 <= s1, f"{where}: parameters {i0} [{s0}, {e0}) and {i1} [{s1}, {e1}) overlap"
    n_shared = sum(shared)
    for i, flag in enumerate(shared):
        if flag:
            s, e, b = got[i]
            others = [j for j, v in got.items() if v[2] == b and j != i]
            assert not others, f"{where}: shared embedding {i} shares bucket {b} with {others}"
            assert s == buckets[b][0], f"{where}: shared embedding {i} is not at the start of shard 0"
            assert b < n_shared, f"{where}: shared embedding {i} in bucket {b}, after other parameters' buckets"
    unpadded = [sum(numels[i] for i, v in got.items() if v[2] == b) for b in range(len(buckets))]
    assert layout["unpadded"] == unpadded, \
        f"{where}: per_bucket_numel_unpadded {layout['unpadded']}, the buckets hold {unpadded} parameter elements"
    assert layout["indices"] == indices, f"{where}: param_indices {layout['indices']}, given {indices}"
    if bucket_size is not None:
        for k, (lo, hi) in enumerate(buckets[:-1]):
            if not any(shared[i] for i, v in got.items() if v[2] == k):
                assert hi - lo >= bucket_size, f"{where}: bucket {k} closed at {hi - lo} < {bucket_size}"
    return got, buckets


def _draw_cases(rng):
    cases = []
    # Mixed sizes from a small palette (repeated shapes, as layers repeat) plus unique ones.
    for name in ("mixed", "mixed-bucketed", "shared"):
        palette = [int(x) for x in rng.integers(1, 4500, size=int(rng.integers(3, 7)))]
        n = int(rng.integers(12, 40))
        numels = [int(rng.choice(palette)) if rng.random() < 0.8 else int(rng.integers(1, 5000))
                  for _ in range(n)]
        shared = [False] * n
        if name == "shared":
            for i in rng.choice(n, size=int(rng.integers(1, 3)), replace=False):
                shared[int(i)] = True
        dp = int(rng.integers(2, 9))
        busbw = bool(rng.random() < 0.2)
        bucket_size = None if name == "mixed" else int(rng.integers(2000, 30000))
        cases.append([name, numels, shared, dp, busbw, bucket_size])
    # Packing: one large seed first in backprop order, then smaller parameters that fit its
    # slot only when their 64-aligned starts are ignored (their sizes sum to the seed's).
    dp = int(rng.choice([2, 4]))
    seed = 64 * int(rng.integers(4, 12))
    while True:
        k = int(rng.integers(2, 5))
        cuts = sorted(int(c) for c in rng.choice(range(1, seed), size=k - 1, replace=False))
        smalls = [b - a for a, b in zip([0] + cuts, cuts + [seed])]
        if all(s % 64 for s in smalls) and max(smalls) < seed:
            break
    numels = list(reversed([seed] + smalls * (dp - 1)))
    cases.append(["packing", numels, [False] * len(numels), dp, False, None])
    # Equal parameters, dp a power of two and a size of whole 64-element blocks: round after
    # round every shard takes one, so the buffer holds no padding at all.
    dp = int(rng.choice([2, 4, 8]))
    per_shard = int(rng.integers(1, 6))
    size = 64 * int(rng.integers(1, 20))
    cases.append(["equal", [size] * (dp * per_shard), [False] * (dp * per_shard), dp, False, None])
    return cases


LAYOUTS = """
import torch
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

result = {}
for (name, numels, shared, dp, busbw, bucket_size), indices in zip(ARGS["cases"], ARGS["indices"]):
    params = []
    for n, s in zip(numels, shared):
        p = torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16))
        if s:
            p.shared_embedding = True
        params.append(p)
    cfg = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True,
                                        pad_buckets_for_high_nccl_busbw=busbw)
    layout = LayerWiseDistributedOptimizer._compute_per_buffer_param_layout(
        params, bucket_size, dp, cfg, indices)
    index = {id(p): i for i, p in enumerate(params)}
    result[name] = {
        "map": [[index.get(id(p), -1), *v] for p, v in layout.param_index_map.items()],
        "buckets": [list(b) for b in layout.bucket_indices],
        "unpadded": list(layout.per_bucket_numel_unpadded),
        "indices": list(layout.param_indices),
        "divisor": LayerWiseDistributedOptimizer._shard_divisor(dp, cfg),
    }
emit(**result)
"""


def test_layer_wise_layouts_hold_their_invariants():
    rng = fresh()
    cases = _draw_cases(rng)
    indices = [[int(x) for x in rng.integers(0, 1000, size=len(c[1]))] for c in cases]
    out = run(LAYOUTS, {"cases": cases, "indices": indices})
    assert sorted(out) == sorted(c[0] for c in cases), f"layouts for {sorted(out)}"
    for (name, numels, shared, dp, busbw, bucket_size), idx in zip(cases, indices):
        got, buckets = _check_layout(name, numels, shared, out[name], dp, busbw, bucket_size, idx)
        assert out[name]["divisor"] == shard_divisor(dp, busbw), \
            f"_shard_divisor({dp}, high_busbw={busbw}) is {out[name]['divisor']}, want {shard_divisor(dp, busbw)}"
        if name == "equal":
            total = len(numels) * numels[0]
            assert buckets == [(0, total)], \
                f"{len(numels)} parameters of {numels[0]} elements on {dp} ranks: buckets {buckets}, want [(0, {total})] (no padding)"
            shard = total // dp
            per = [sum(1 for s, _, _ in got.values() if s // shard == j) for j in range(dp)]
            assert per == [len(numels) // dp] * dp, f"equal parameters per shard {per}, want {len(numels) // dp} each"


def draw_model(rng):
    """Parameter sizes and expert flags (at least three dense and three expert parameters)."""
    while True:
        n = int(rng.integers(8, 16))
        experts = [bool(e) for e in rng.random(n) < 0.45]
        if sum(experts) >= 3 and n - sum(experts) >= 3:
            break
    palette = [int(x) for x in rng.integers(1, 700, size=4)]
    sizes = [int(rng.choice(palette)) if rng.random() < 0.5 else int(rng.integers(1, 700)) for _ in range(n)]
    return {"seed": int(rng.integers(1 << 31)), "sizes": sizes, "experts": experts}


def draw_buffer(rng, members, sizes, dp, shard0=False):
    """A layout of members (indices, in module order) that keeps every parameter inside one
    shard: contiguous blocks of the backprop order form the buckets, each parameter goes to a
    drawn shard of its bucket. Returns the spec and {index: shard}."""
    order = list(reversed(members))
    nb = int(rng.integers(1, min(3, len(order)) + 1))
    cuts = sorted(int(c) for c in rng.choice(range(1, len(order)), size=nb - 1, replace=False)) if nb > 1 else []
    blocks = [order[a:b] for a, b in zip([0] + cuts, cuts + [len(order)])]
    sdiv = shard_divisor(dp)
    while True:
        shard_of = {i: int(rng.integers(0, dp)) for i in order}
        if not shard0 or any(s == 0 for s in shard_of.values()):
            break
    spec = {"map": [], "buckets": [], "unpadded": []}
    lo = 0
    for b, block in enumerate(blocks):
        cursors = [0] * dp
        placed = []
        for i in block:
            j = shard_of[i]
            start = _pad(cursors[j], 64) + 64 * int(rng.integers(0, 2))
            placed.append((i, j, start))
            cursors[j] = start + sizes[i]
        shard = _pad(max(max(cursors), 1), sdiv) + sdiv * int(rng.integers(0, 2))
        for i, j, start in placed:
            s = lo + j * shard + start
            spec["map"].append([i, s, s + sizes[i], b])
        spec["buckets"].append([lo, lo + dp * shard])
        spec["unpadded"].append(sum(sizes[i] for i in block))
        lo += dp * shard
    return spec, shard_of


def _shards_with(spec, size):
    """Each parameter's shard in spec when bucket shards are cut for `size` ranks (None when one
    crosses a shard boundary)."""
    out = {}
    for i, s, e, b in spec["map"]:
        lo, hi = spec["buckets"][b]
        shard = (hi - lo) // size
        k = (s - lo) // shard
        if e > lo + (k + 1) * shard:
            return None
        out[i] = k
    return out


def _param_groups(rng, dense, expert):
    """Optimizers and their param groups over shuffled dense and expert parameters."""
    d = [int(i) for i in rng.permutation(dense)]
    e = [int(i) for i in rng.permutation(expert)]
    cut = int(rng.integers(1, len(d)))
    dense_groups = [d[:cut], d[cut:]] if rng.random() < 0.6 else [d]
    expert_groups = [{"params": e, "expert": True}]
    groups = [{"params": g, "expert": False} for g in dense_groups]
    if rng.random() < 0.5:
        return [groups, expert_groups]
    return [groups + expert_groups]


SHARDS = PRELUDE + """
with on_cpu():
    torch.manual_seed(ARGS["seed"])
    model = Model(ARGS["sizes"], ARGS["experts"]).bfloat16()
    params = [p for _, p in model.named_parameters()]
    index = {id(p): i for i, p in enumerate(params)}
    layout = given_layout(params, ARGS["layout"])
    pg = collection(ARGS["dp"], ARGS["rank"], ARGS["edp"], ARGS["erank"])
    ddp = wrap(model, ddp_config(), pg, full_param_layout=layout)
    opts = []
    for groups in ARGS["optimizers"]:
        opts.append(torch.optim.Adam(
            [dict({"params": [params[i] for i in g["params"]]}, **({"is_expert_parallel": True} if g["expert"] else {}))
             for g in groups], lr=1e-3))
    lwo = LayerWiseDistributedOptimizer(opts, OptimizerConfig(bf16=False, overlap_param_gather=False),
                                        pg_collection=pg, model_chunks=[ddp])
    names = lambda ps: [index.get(id(p), -1) for p in ps]
    emit(
        kept=dump(getattr(ddp, "full_param_layout", None), params),
        groups=[names(g["params"]) for o in opts for g in o.param_groups],
        dense=None if lwo.dp_cp_params_list is None else [names(ps) for ps in lwo.dp_cp_params_list],
        expert=None if lwo.expt_dp_params_list is None else [names(ps) for ps in lwo.expt_dp_params_list],
    )
"""


def test_optimizer_shards_follow_the_ddp_layout():
    rng = fresh()
    while True:
        model = draw_model(rng)
        dense = [i for i, e in enumerate(model["experts"]) if not e]
        expert = [i for i, e in enumerate(model["experts"]) if e]
        dp, edp = int(rng.integers(2, 7)), int(rng.integers(1, 5))
        dspec, dshard = draw_buffer(rng, dense, model["sizes"], dp)
        espec, eshard = draw_buffer(rng, expert, model["sizes"], edp, shard0=True)
        # The draw must tell expert shards cut for the expert size from shards cut for the
        # dense size.
        if dp != edp and _shards_with(espec, dp) != eshard:
            break
    rank, erank = int(rng.integers(0, dp)), int(rng.integers(0, edp))
    optimizers = _param_groups(rng, dense, expert)
    args = {**model, "layout": {"dense": dspec, "expert": espec}, "dp": dp, "edp": edp,
            "rank": rank, "erank": erank, "optimizers": optimizers}
    out = run(SHARDS, args)
    what = f"dp={dp} (rank {rank}), expert dp={edp} (rank {erank})"
    want_kept = {"dense": {"map": sorted(dspec["map"]), "buckets": dspec["buckets"]},
                 "expert": {"map": sorted(espec["map"]), "buckets": espec["buckets"]}}
    assert out["kept"] == want_kept, \
        f"DistributedDataParallel.full_param_layout is {out['kept']}, want the layout it was given {want_kept}"
    groups = [g for o in optimizers for g in o]
    want_groups = [[i for i in g["params"] if (eshard[i] == erank if g["expert"] else dshard[i] == rank)]
                   for g in groups]
    assert out["groups"] == want_groups, \
        f"{what}: this rank's optimizer param groups {out['groups']}, want the parameters of its shards {want_groups}"
    dense_order = [i for g in groups if not g["expert"] for i in g["params"]]
    expert_order = [i for g in groups if g["expert"] for i in g["params"]]
    want_dense = [[i for i in dense_order if dshard[i] == k] for k in range(dp)]
    assert out["dense"] == want_dense, f"{what}: dp_cp_params_list {out['dense']}, want {want_dense}"
    want_expert = None if edp == 1 else [[i for i in expert_order if eshard[i] == k] for k in range(edp)]
    assert out["expert"] == want_expert, f"{what}: expt_dp_params_list {out['expert']}, want {want_expert}"


STEPS = PRELUDE + """
from megatron.core.optimizer.optimizer import ChainedOptimizer

def build(with_layout, overlap):
    torch.manual_seed(ARGS["seed"])
    chunks, models = [], []
    for spec in ARGS["chunks"]:
        m = Model(spec["sizes"], spec["experts"]).bfloat16()
        ps = [p for _, p in m.named_parameters()]
        pg = collection(ARGS["dp"], ARGS["rank"], ARGS["edp"], ARGS["erank"])
        if with_layout:
            chunks.append(wrap(m, ddp_config(), pg, full_param_layout=given_layout(ps, spec["layout"])))
        else:
            chunks.append(wrap(m, ddp_config(distopt=False), pg))
        models.append(m)
    params = [p for m in models for p in m.parameters()]
    dense = [p for p in params if getattr(p, "allreduce", True)]
    expert = [p for p in params if not getattr(p, "allreduce", True)]
    opts = [torch.optim.Adam(dense, lr=1e-3),
            torch.optim.Adam([{"params": expert, "is_expert_parallel": True}], lr=1e-3)]
    lwo = LayerWiseDistributedOptimizer(opts, OptimizerConfig(bf16=False, overlap_param_gather=overlap),
                                        pg_collection=collection(ARGS["dp"], ARGS["rank"], ARGS["edp"], ARGS["erank"]),
                                        model_chunks=chunks)
    return chunks, lwo

def steps(with_layout, overlap):
    calls = []
    with on_cpu():
        chunks, lwo = build(with_layout, overlap)
        which = {id(c): i for i, c in enumerate(chunks)}
        def sync(self, *args, **kwargs):
            calls.append(["start_param_sync", which.get(id(self), -1)])
        def gather(self, *args, **kwargs):
            calls.append(["allgather_params", -1])
        returns = [tuple(r) for r in ARGS["returns"]]
        with mock.patch.object(ChainedOptimizer, "step", side_effect=returns), \\
             mock.patch.object(DistributedDataParallel, "start_param_sync", sync), \\
             mock.patch.object(LayerWiseDistributedOptimizer, "allgather_params", gather):
            results = [list(lwo.step()) for _ in returns]
    return {"calls": calls, "results": results}

emit(layout=steps(True, False), overlap=steps(True, True), legacy=steps(False, False))
"""


def test_step_publishes_params_through_the_ddp_buffers():
    rng = fresh()
    # One size for dense and expert groups: which group size cuts expert shards is the
    # sharding probe's concern.
    dp = edp = int(rng.integers(2, 5))
    chunks = []
    for _ in range(int(rng.integers(1, 5))):
        model = draw_model(rng)
        dense = [i for i, e in enumerate(model["experts"]) if not e]
        expert = [i for i, e in enumerate(model["experts"]) if e]
        dspec, _ = draw_buffer(rng, dense, model["sizes"], dp)
        espec, _ = draw_buffer(rng, expert, model["sizes"], edp, shard0=True)
        chunks.append({"sizes": model["sizes"], "experts": model["experts"],
                       "layout": {"dense": dspec, "expert": espec}})
    n_steps = int(rng.integers(1, 5))
    returns = [[bool(rng.random() < 0.7), float(rng.uniform(0.01, 50.0)), int(rng.integers(0, 1000))]
               for _ in range(n_steps)]
    args = {"seed": int(rng.integers(1 << 31)), "chunks": chunks, "dp": dp, "edp": edp,
            "rank": int(rng.integers(0, dp)), "erank": int(rng.integers(0, edp)), "returns": returns}
    out = run(STEPS, args)
    what = f"{len(chunks)} model chunks, {n_steps} steps"
    want = [["start_param_sync", c] for _ in range(n_steps) for c in range(len(chunks))]
    assert out["layout"]["calls"] == want, \
        f"{what}, with layouts: the steps made {out['layout']['calls']}, want each chunk's start_param_sync per step"
    assert out["overlap"]["calls"] == [], \
        f"{what}, with layouts and overlap_param_gather: the steps made {out['overlap']['calls']}, want none"
    assert out["legacy"]["calls"] == [["allgather_params", -1]] * n_steps, \
        f"{what}, without layouts: the steps made {out['legacy']['calls']}, want allgather_params per step"
    for name in ("layout", "overlap", "legacy"):
        assert out[name]["results"] == returns, \
            f"{what} ({name}): step returned {out[name]['results']}, the chained step returned {returns}"
