"""Hidden probes for megatron-0010 (per-KV-block MoE routing storage for routing replay).

The judge never imports megatron or torch. Every probe draws its scenario fresh: the block size,
the routing arrays' layer and top-k dimensions and dtype, the routing values, request ids, prompt
lengths and tokens, how many decode steps run, how much of a prompt is a cached prefix, which
positions and blocks the allocator calls touch. Children build DynamicInferenceContext objects
on the CUDA device (no process group: tensor and pipeline parallel size 1), step them through
add_request / initialize_attention_state / update_requests, store the judge's arrays with the
allocator and send back what it holds and rebuilds, together with the active-token layout
(request id and position of each active token, read from the context's own token_to_request_idx /
request_ids / token_to_pos_ids) and the block ids involved.

Every scenario also runs over the gold tree (`reference`, same inputs): the submission's layouts
and block ids must be the reference's (the context's bookkeeping is not what the task changes),
and the judge builds every expected routing array itself from the reference's layout and its own
arrays (the row stored for token (request, position) sits at position `position % block size` of
that token's block) and compares exactly. The allocator and request contracts compare with
arrays the judge wrote itself.
"""

import numpy as np

from infradev_probe import fresh, reference, run, same

# The reference children run as a user the image's passwd does not name; torch (imported through
# megatron) asks getpass for a user name when it sets up its compile cache, so name one.
ENV = {"USER": "infradev-probe"}

PRELUDE = """
import json
from types import SimpleNamespace

import numpy as np
import torch

from megatron.core.inference.config import InferenceConfig, PrefixCachingEvictionPolicy
from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
from megatron.core.inference.inference_request import (
    DynamicInferenceRequest,
    DynamicInferenceRequestRecord,
)
from megatron.core.inference.sampling_params import SamplingParams
from megatron.core.transformer.transformer_config import TransformerConfig

DEV = torch.cuda.current_device()


def make_context(block_size, prefix_caching, lru=True):
    DynamicInferenceContext.ROUNDER = 64
    DynamicInferenceContext.TOKEN_ROUNDER = 64
    DynamicInferenceContext.REQUEST_ROUNDER = 64
    model = TransformerConfig(
        params_dtype=torch.float32, num_layers=4, kv_channels=8, num_attention_heads=2,
        hidden_size=16, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        use_cpu_initialization=True,
    )
    policy = PrefixCachingEvictionPolicy.LRU if lru else PrefixCachingEvictionPolicy.REF_ZERO
    config = InferenceConfig(
        max_sequence_length=512, buffer_size_gb=0.1, paused_buffer_size_gb=0.02,
        block_size_tokens=block_size, unified_memory_level=0,
        enable_prefix_caching=prefix_caching, prefix_caching_eviction_policy=policy,
    )
    return DynamicInferenceContext(model_config=model, inference_config=config)


def make_request(ctx, rid, tokens, prefix_caching):
    return DynamicInferenceRequest(
        request_id=rid,
        prompt_tokens=torch.tensor(tokens, dtype=torch.int64, device=DEV),
        sampling_params=SamplingParams(num_tokens_to_generate=16),
        block_size_tokens=ctx.block_size_tokens,
        enable_prefix_caching=prefix_caching,
    )


def layout(ctx):
    n = ctx.active_token_count
    rows = ctx.token_to_request_idx[:n].long()
    rids = ctx.request_ids[rows].tolist()
    pos = ctx.token_to_pos_ids[:n].tolist()
    return [[int(r), int(p)] for r, p in zip(rids, pos)]


def blocks_of(ctx, rid):
    ids = ctx.request_ids[: ctx.total_request_count].tolist()
    row = ids.index(rid)
    blocks = ctx.request_to_kv_block_ids[row]
    return blocks[blocks >= 0].tolist()


def arr(x):
    # a snapshot: the allocator may keep writing into the array it returned
    return None if x is None else np.array(x, copy=True)
"""

DTYPES = ("int16", "int32")


def draw_routing(rng, rows, L, K, dtype):
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -30000), min(info.max, 30000), size=(rows, L, K)).astype(dtype)


def token_table(steps):
    """{(request, position): stored row} from (layout, array) pairs, later steps winning."""
    table = {}
    for lay, flat in steps:
        assert len(lay) == len(flat), "probe setup: a step's layout and routing differ in length"
        for i, (r, p) in enumerate(lay):
            table[(int(r), int(p))] = flat[i]
    return table


def rebuild(table, rid, count):
    """The judge's reconstruction of request rid's first `count` positions."""
    missing = [p for p in range(count) if (rid, p) not in table]
    assert not missing, f"probe setup: request {rid}: no step computed positions {missing[:8]}"
    return np.stack([table[(rid, p)] for p in range(count)])


def block_array(table, rid, block, bs, L, K, dtype):
    """What block number `block` of request rid holds after its tokens were stored: rows at the
    positions computed, zeros elsewhere; None when none of its positions was computed."""
    out = np.zeros((bs, L, K), dtype=dtype)
    hit = False
    for p in range(block * bs, (block + 1) * bs):
        if (rid, p) in table:
            out[p - block * bs] = table[(rid, p)]
            hit = True
    return out if hit else None


def _equal(got, want, what):
    if want is None:
        assert got is None, f"{what}: want None, got {type(got).__name__}"
        return
    assert got is not None, f"{what}: got None, want an array of shape {want.shape}"
    assert isinstance(got, np.ndarray), f"{what}: got {type(got).__name__}, want an array"
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    bad = np.nonzero((got != want).reshape(len(want), -1).any(axis=1))[0] if want.ndim else []
    assert len(bad) == 0, f"{what}: rows {bad[:10].tolist()} differ"


_SCATTER = PRELUDE + """
ctx = make_context(ARGS["bs"], prefix_caching=False)
alloc = ctx.kv_block_allocator
for rid, tokens in ARGS["prompts"]:
    ctx.add_request(make_request(ctx, rid, tokens, False))
layouts = []
for step, flat in enumerate(ARGS["flats"]):
    ctx.initialize_attention_state()
    layouts.append(layout(ctx))
    alloc.store_routing_per_block(np.asarray(flat))
    count = ctx.total_request_count - ctx.paused_request_count
    ctx.update_requests(
        active_requests_mask=torch.ones(count, dtype=torch.int32, device=DEV),
        new_tokens=torch.tensor(ARGS["new_tokens"][step][:count], dtype=torch.int64, device=DEV),
    )
rebuilt, blocks, stored = [], [], []
for (rid, tokens), want_rows in zip(ARGS["prompts"], ARGS["rows"]):
    b = blocks_of(ctx, rid)
    blocks.append(b)
    # the blocks that hold its routed tokens (update_requests may already have given it the next one)
    used = b[: -(-want_rows // ctx.block_size_tokens)]
    rebuilt.append(arr(alloc.reconstruct_routing_from_blocks(used, want_rows)))
    stored.append([arr(alloc.get_block_routing(x)) for x in b])
emit(layouts=layouts, rebuilt=rebuilt, blocks=blocks, stored=stored, bs=int(ctx.block_size_tokens))
"""


def test_scatter_and_reconstruct_across_steps():
    rng = fresh()
    bs = int(rng.choice([16, 32, 64]))
    L, K = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    dtype = str(rng.choice(DTYPES))
    n_req = int(rng.integers(2, 6))
    rids = [int(x) for x in rng.choice(10**6, size=n_req, replace=False) + 1]
    # Prompt lengths: inside one block, across blocks, and (often) one ending on a block boundary;
    # at least one that does not, so decode tokens land mid-block.
    lengths = [int(rng.integers(2, 3 * bs + 1)) for _ in range(n_req)]
    if rng.random() < 0.7:
        lengths[int(rng.integers(n_req))] = bs * int(rng.integers(1, 4))
    if all(n % bs == 0 for n in lengths):
        lengths[0] += int(rng.integers(1, bs))
    prompts = [[rid, [int(t) for t in rng.integers(100, 30000, size=n)]] for rid, n in zip(rids, lengths)]
    decode_steps = int(rng.integers(1, 5))
    flats = [draw_routing(rng, sum(lengths), L, K, dtype)] + \
            [draw_routing(rng, n_req, L, K, dtype) for _ in range(decode_steps)]
    new_tokens = [[int(t) for t in rng.integers(100, 30000, size=n_req)] for _ in flats]
    rows = [n + decode_steps for n in lengths]
    args = {"bs": bs, "prompts": prompts, "flats": flats, "new_tokens": new_tokens, "rows": rows}
    want = reference(_SCATTER, args, env=ENV)
    got = run(_SCATTER, args, env=ENV)
    assert want["bs"] == bs, "probe setup"
    lays = want["layouts"]
    assert sorted(map(tuple, lays[0])) == sorted((rid, p) for rid, n in zip(rids, lengths) for p in range(n)), \
        "probe setup: the reference's prefill layout"
    for s in range(1, decode_steps + 1):
        assert sorted(map(tuple, lays[s])) == sorted((rid, n + s - 1) for rid, n in zip(rids, lengths)), \
            f"probe setup: the reference's decode step {s} layout"
    same(got["layouts"], want["layouts"], path="active-token layouts")
    same(got["blocks"], want["blocks"], path="requests' block ids")
    table = token_table(zip(lays, flats))
    for i, (rid, n) in enumerate(zip(rids, lengths)):
        what = (f"request {rid} ({n}-token prompt, {decode_steps} decode steps, block size {bs}, "
                f"blocks {want['blocks'][i]})")
        for b, blk in enumerate(want["blocks"][i]):
            _equal(got["stored"][i][b], block_array(table, rid, b, bs, L, K, dtype),
                   f"{what}: get_block_routing({blk}) after every step's store_routing_per_block")
        _equal(got["rebuilt"][i], rebuild(table, rid, rows[i]),
               f"{what}: reconstruct_routing_from_blocks(its first {-(-rows[i] // bs)} blocks, {rows[i]})")


_PREFIX = PRELUDE + """
ctx = make_context(ARGS["bs"], prefix_caching=True, lru=True)
alloc = ctx.kv_block_allocator
ctx.add_request(make_request(ctx, ARGS["rid_a"], ARGS["first"], True))
ctx.initialize_attention_state()
lay_a = layout(ctx)
alloc.store_routing_per_block(np.asarray(ARGS["flat_a"]))
blocks_a = blocks_of(ctx, ARGS["rid_a"])
ctx.update_requests(
    active_requests_mask=torch.zeros(1, dtype=torch.int32, device=DEV),
    new_tokens=torch.tensor([ARGS["last_a"]], dtype=torch.int64, device=DEV),
)
after_release = [arr(alloc.get_block_routing(b)) for b in blocks_a]
ctx.add_request(make_request(ctx, ARGS["rid_b"], ARGS["second"], True))
blocks_b = blocks_of(ctx, ARGS["rid_b"])
given = [arr(alloc.get_block_routing(b)) for b in blocks_b[ARGS["shared"]:]]
ctx.initialize_attention_state()
lay_b = layout(ctx)
alloc.store_routing_per_block(np.asarray(ARGS["flat_b"]))
rebuilt = arr(alloc.reconstruct_routing_from_blocks(blocks_b, len(ARGS["second"])))
final = [arr(alloc.get_block_routing(b)) for b in blocks_a + blocks_b]
held = len(alloc.block_routing)
alloc.reset()
emit(lay_a=lay_a, lay_b=lay_b, blocks_a=blocks_a, blocks_b=blocks_b, after_release=after_release,
     given=given, rebuilt=rebuilt, final=final, held=held,
     after_reset=[arr(alloc.get_block_routing(b)) for b in blocks_a + blocks_b],
     left=len(alloc.block_routing))
"""


def test_prefix_blocks_keep_routing_and_reused_blocks_start_clean():
    rng = fresh()
    bs = int(rng.choice([16, 32, 64]))
    L, K = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    dtype = str(rng.choice(DTYPES))
    full = int(rng.integers(1, 4))          # full blocks of the first prompt
    tail = int(rng.integers(1, bs))         # tokens of its partial last block
    shared = int(rng.integers(1, full + 1))  # full blocks the second prompt shares with it
    extra = int(rng.integers(2, 2 * bs + 1))  # the second prompt's own tokens (two at least: with one,
    # the context recomputes the last shared block so the step never has a single-token prefill)
    first = [int(t) for t in rng.integers(100, 20000, size=full * bs + tail)]
    second = first[: shared * bs] + [int(t) for t in rng.integers(20000, 30000, size=extra)]
    rid_a, rid_b = (int(x) + 1 for x in rng.choice(10**6, size=2, replace=False))
    flat_a, flat_b = draw_routing(rng, len(first), L, K, dtype), draw_routing(rng, extra, L, K, dtype)
    args = {"bs": bs, "first": first, "second": second, "flat_a": flat_a, "flat_b": flat_b,
            "rid_a": rid_a, "rid_b": rid_b, "shared": shared, "last_a": int(rng.integers(100, 30000))}
    want = reference(_PREFIX, args, env=ENV)
    got = run(_PREFIX, args, env=ENV)
    assert sorted(map(tuple, want["lay_a"])) == [(rid_a, p) for p in range(len(first))], "probe setup: first layout"
    assert sorted(map(tuple, want["lay_b"])) == [(rid_b, p) for p in range(shared * bs, len(second))], \
        "probe setup: the reference's second layout is not the unmatched tokens"
    assert want["blocks_b"][:shared] == want["blocks_a"][:shared], "probe setup: no prefix reuse in the reference"
    same(got["lay_a"], want["lay_a"], path="first request's layout")
    same(got["lay_b"], want["lay_b"], path="second request's layout (only its unmatched tokens)")
    same(got["blocks_a"], want["blocks_a"], path="first request's blocks")
    same(got["blocks_b"], want["blocks_b"], path="second request's blocks (the shared prefix blocks reused)")
    table_a = token_table([(want["lay_a"], flat_a)])
    where = (f"block size {bs}, first prompt {len(first)} tokens ({full} full blocks), second prompt sharing "
             f"{shared} blocks plus {extra} tokens")
    for b, blk in enumerate(want["blocks_a"]):
        kind = "its partial last block, back in the free pool" if b == full else "a cached full block"
        _equal(got["after_release"][b], block_array(table_a, rid_a, b, bs, L, K, dtype),
               f"{where}: after the first request finished, block {blk} ({kind}) must keep its routing")
    new_blocks = want["blocks_b"][shared:]
    assert len(got["given"]) == len(new_blocks), "the second request's newly given blocks"
    for blk, g in zip(new_blocks, got["given"]):
        stale = " (the first request's partial block, re-allocated)" if blk == want["blocks_a"][-1] else ""
        assert g is None, \
            f"{where}: block {blk}{stale} was just handed to the second request yet holds routing"
    table_b = token_table([(want["lay_b"], flat_b)])
    expect = np.stack([table_a[(rid_a, p)] for p in range(shared * bs)]
                      + [table_b[(rid_b, p)] for p in range(shared * bs, len(second))])
    _equal(got["rebuilt"], expect,
           f"{where}: the second request's rebuilt routing (the first request's rows for the matched "
           f"prefix, its own for the rest)")
    # Final contents: the first request's blocks (the second's are its shared ones and new ones).
    final_want = []
    owner = {}
    for b, blk in enumerate(want["blocks_a"]):
        owner[blk] = block_array(table_a, rid_a, b, bs, L, K, dtype)
    for b, blk in enumerate(want["blocks_b"]):
        if b >= shared:
            owner[blk] = block_array(table_b, rid_b, b, bs, L, K, dtype)
    for blk in want["blocks_a"] + want["blocks_b"]:
        final_want.append(owner[blk])
    for blk, g, w in zip(want["blocks_a"] + want["blocks_b"], got["final"], final_want):
        _equal(g, w, f"{where}: block {blk}'s routing once both requests were stored")
    assert got["held"] == len(owner), \
        f"{where}: the allocator holds routing for {got['held']} blocks, want {len(owner)}"
    assert all(x is None for x in got["after_reset"]) and got["left"] == 0, "reset() must drop all stored routing"


_CONTRACT = PRELUDE + """
ctx = make_context(ARGS["bs"], prefix_caching=False)
alloc = ctx.kv_block_allocator
if ARGS["skip"]:
    alloc.allocate_memory_blocks(ARGS["skip"])
ids = alloc.allocate_memory_blocks(ARGS["nblocks"]).tolist()
x = ids[ARGS["target"]]
for pos, rout in zip(ARGS["positions"], ARGS["partial"]):
    alloc.store_block_routing(x, np.asarray(pos), np.asarray(rout))
partial = arr(alloc.get_block_routing(x))
others = [arr(alloc.get_block_routing(b)) for b in ids if b != x]
alloc.store_routing_per_block(None)
after_none = {str(k): arr(v) for k, v in alloc.block_routing.items()}
for bid, a in zip(ids, ARGS["full"]):
    alloc.store_block_routing(bid, np.arange(ARGS["bs"]), np.asarray(a))
recs = [arr(alloc.reconstruct_routing_from_blocks([ids[i] for i in order], n)) for order, n in ARGS["recs"]]
alloc.block_routing.pop(ids[ARGS["hole"]])
hole = arr(alloc.reconstruct_routing_from_blocks(ids, ARGS["hole_rows"]))
# release one block and take it back: its routing survives the release, not the re-allocation
r = ids[ARGS["released"]]
alloc.release_memory_blocks(torch.tensor([r], dtype=torch.int32, device=DEV))
kept = arr(alloc.get_block_routing(r))
again = alloc.allocate_memory_blocks(1).tolist()
emit(ids=ids, partial=partial, others=others, after_none=after_none, recs=recs, hole=hole, kept=kept,
     again=again, again_routing=arr(alloc.get_block_routing(again[0])),
     rest=[arr(alloc.get_block_routing(b)) for b in ids if b not in (r, ids[ARGS["hole"]])])
"""


def test_allocator_storage_contract():
    rng = fresh()
    bs = int(rng.choice([16, 32, 64]))
    L, K = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    dtype = str(rng.choice(["int16", "int32", "int64"]))
    nblocks = int(rng.integers(3, 6))
    target = int(rng.integers(nblocks))
    # Stores at scattered positions of one block; a later store may overwrite earlier rows.
    positions, partial, block = [], [], np.zeros((bs, L, K), dtype=dtype)
    for _ in range(int(rng.integers(2, 4))):
        pos = np.sort(rng.choice(bs, size=int(rng.integers(1, bs // 2)), replace=False)).astype(np.int64)
        rout = draw_routing(rng, len(pos), L, K, dtype)
        positions.append(pos)
        partial.append(rout)
        block[pos] = rout
    full = [draw_routing(rng, bs, L, K, dtype) for _ in range(nblocks)]
    recs, expect = [], []
    kinds = [0, 1, 2] + [int(k) for k in rng.integers(3, size=int(rng.integers(0, 3)))]
    for kind in rng.permutation(kinds):
        order = [int(i) for i in rng.permutation(nblocks)[: int(rng.integers(1, nblocks + 1))]]
        if kind == 0:    # trimmed inside the last block taken
            n = int(rng.integers(max(1, (len(order) - 1) * bs + 1), len(order) * bs + 1))
        elif kind == 1:  # exactly whole blocks
            n = int(rng.integers(1, len(order) + 1)) * bs
        else:            # more rows than the blocks hold
            n = len(order) * bs + int(rng.integers(1, bs + 1))
        recs.append([order, n])
        if n > len(order) * bs:
            expect.append(None)
        else:
            expect.append(np.concatenate([full[i] for i in order])[:n])
    hole = int(rng.integers(nblocks - 1))
    hole_rows = int(rng.integers(hole * bs + 1, nblocks * bs + 1))
    released = int(rng.choice([i for i in range(nblocks) if i != hole]))
    args = {"bs": bs, "skip": int(rng.integers(0, 4)), "nblocks": nblocks, "target": target,
            "positions": positions, "partial": partial, "full": full, "recs": recs, "hole": hole,
            "hole_rows": hole_rows, "released": released}
    got = run(_CONTRACT, args, env=ENV)
    want_ids = reference(_CONTRACT, args, env=ENV)["ids"]
    same(got["ids"], want_ids, path="allocated block ids")
    ids = want_ids
    _equal(got["partial"], block,
           f"store_block_routing: {len(positions)} stores at scattered positions of a {bs}-token block ({dtype})"
           f" must leave the last value at each stored position and zeros elsewhere, in the routing's dtype")
    assert all(o is None for o in got["others"]), "get_block_routing of a block with no stored routing must be None"
    assert sorted(got["after_none"]) == [str(ids[target])], \
        f"store_routing_per_block(None) changed which blocks hold routing: {sorted(got['after_none'])}"
    _equal(got["after_none"][str(ids[target])], block, "store_routing_per_block(None) changed the stored routing")
    for (order, n), g, w in zip(recs, got["recs"], expect):
        what = f"reconstruct_routing_from_blocks(blocks {[ids[i] for i in order]}, {n}) (block size {bs})"
        if w is None:
            assert g is None, f"{what}: the blocks hold {len(order) * bs} rows; want None, got an array"
        else:
            _equal(g, w, f"{what}: whole blocks in order, the last one cut")
    assert got["hole"] is None, \
        f"reconstruct over blocks {ids} for {hole_rows} rows, block {ids[hole]} without routing: want None"
    _equal(got["kept"], full[released], f"release_memory_blocks([{ids[released]}]) must keep the block's routing")
    assert got["again"] == [ids[released]], \
        f"probe setup: expected the released block {ids[released]} back, got {got['again']}"
    assert got["again_routing"] is None, \
        f"allocate_memory_blocks handed out block {ids[released]} still holding its previous owner's routing"
    rest = [i for i in range(nblocks) if i not in (released, hole)]
    assert len(got["rest"]) == len(rest), "blocks left untouched"
    for i, g in zip(rest, got["rest"]):
        _equal(g, full[i], f"block {ids[i]}, neither released nor emptied, lost its routing")


_REQUESTS = PRELUDE + """
req = DynamicInferenceRequest(
    request_id=ARGS["rid"], prompt_tokens=torch.tensor(ARGS["prompt"], dtype=torch.int64, device=DEV),
    sampling_params=SamplingParams(num_tokens_to_generate=ARGS["gen"] + 2),
)
req.generated_tokens = list(ARGS["generated"])
req.routing_indices = np.asarray(ARGS["routing"])
obj = req.serialize()
# what a transport does: tuples become lists; the routing must be plain JSON data
wire = {k: (json.loads(json.dumps(v)) if isinstance(v, tuple) else v) for k, v in obj.items()}
json.dumps(wire["routing_indices"])
back = DynamicInferenceRequest.deserialize(wire)
ri = back.routing_indices
restored = dict(type=type(ri).__name__, dtype=str(getattr(ri, "dtype", "")),
                value=np.asarray(ri) if isinstance(ri, np.ndarray) else None)

def req_with(routing):
    r = DynamicInferenceRequest(request_id=ARGS["rid"], prompt_tokens=torch.arange(4, device=DEV),
                                sampling_params=SamplingParams(num_tokens_to_generate=4))
    r.routing_indices = None if routing is None else np.asarray(routing)
    return r

merged = []
for parts in ARGS["records"]:
    rec = DynamicInferenceRequestRecord()
    rec.requests = [req_with(p) for p in parts]
    m = rec.merge().routing_indices
    merged.append(dict(type=type(m).__name__, value=arr(m) if isinstance(m, np.ndarray) else None))
emit(restored=restored, wire=obj["routing_indices"], merged=merged,
     prompt=[int(x) for x in back.prompt_tokens.tolist()])
"""


def _plain(v):
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return all(_plain(x) for x in v)
    return v is None or isinstance(v, (bool, int, float, str))


def test_request_serialization_and_merge():
    rng = fresh()
    L, K = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    dtype = str(rng.choice(DTYPES))
    p, g = int(rng.integers(1, 20)), int(rng.integers(1, 8))
    routing = draw_routing(rng, p + g - 1, L, K, dtype)
    records, expect = [], []
    for i in range(int(rng.integers(2, 5))):
        n = int(rng.integers(1, 5))
        has = rng.random(n) < 0.6
        if i == 0:
            has[:] = False            # a record none of whose requests has routing
        elif i == 1:
            has[0] = False            # the first request has none, a later one has
            has[-1] = True if n > 1 else has[-1]
        parts = [draw_routing(rng, int(rng.integers(1, 9)), L, K, dtype) if h else None for h in has]
        records.append(parts)
        present = [x for x in parts if x is not None]
        expect.append(np.concatenate(present) if present else None)
    order = rng.permutation(len(records))
    records, expect = [records[i] for i in order], [expect[i] for i in order]
    args = {"rid": int(rng.integers(1, 10**6)), "prompt": [int(t) for t in rng.integers(0, 30000, size=p)],
            "gen": g, "generated": [int(t) for t in rng.integers(0, 30000, size=g)], "routing": routing,
            "records": records}
    out = run(_REQUESTS, args, env=ENV)
    assert _plain(out["wire"]), \
        "serialize(): routing_indices must become plain JSON data (lists, dicts, strings, numbers), not an array"
    got = out["restored"]
    assert got["type"] == "ndarray", f"deserialized routing_indices is a {got['type']}, want a numpy array"
    assert got["dtype"] == dtype, f"deserialized routing_indices has dtype {got['dtype']}, want {dtype}"
    _equal(got["value"], routing, "routing_indices through serialize / JSON / deserialize")
    assert out["prompt"] == args["prompt"], "prompt_tokens (a tensor field) through serialize / deserialize"
    for parts, m, w in zip(records, out["merged"], expect):
        pattern = ["array" if x is not None else "None" for x in parts]
        if w is None:
            assert m["type"] == "NoneType", f"merge() of requests with routing {pattern}: want None, got {m['type']}"
        else:
            assert m["type"] == "ndarray", f"merge() of requests with routing {pattern}: got {m['type']}"
            _equal(m["value"], w, f"merge() of requests with routing {pattern}: the present arrays concatenated in order")


_CONTROLLER = PRELUDE + """
from megatron.core.inference.text_generation_controllers.text_generation_controller import (
    TextGenerationController,
)

def bookkeeping(replay, experts, active, metadata, recorded):
    ctrl = TextGenerationController.__new__(TextGenerationController)
    cfg = SimpleNamespace(moe_enable_routing_replay=replay, num_moe_experts=experts, sequence_parallel=False)
    data = torch.tensor(np.asarray(ARGS["recorded"]), device=DEV) if recorded else None
    meta = SimpleNamespace(get_routing_indices=lambda: data) if metadata else None
    ctx = SimpleNamespace(moe_routing_metadata=meta, active_token_count=active,
                          padded_active_token_count=ARGS["padded"])
    ctrl.inference_wrapped_model = SimpleNamespace(model=SimpleNamespace(config=cfg),
                                                   inference_context=ctx, tp_group=None)
    r = ctrl._router_record_bookkeeping()
    if r is None:
        return None
    return dict(type=type(r).__name__, dtype=str(r.dtype), value=np.asarray(r.tolist()))

emit(results=[bookkeeping(*c) for c in ARGS["cases"]])
"""


def test_controller_returns_flat_host_routing():
    rng = fresh()
    L, K = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    padded = int(rng.integers(4, 33))
    recorded = rng.integers(0, 32000, size=(padded, L, K)).astype(np.int64)
    cases = []
    for i in range(int(rng.integers(3, 6))):
        experts = [None, int(rng.integers(2, 32769)), int(rng.integers(32769, 100000))][int(rng.integers(3))]
        # the first one with padding rows recorded past the active tokens
        active = int(rng.integers(1, padded)) if i == 0 else int(rng.integers(1, padded + 1))
        cases.append([True, experts, active, True, True])
    cases += [[False, int(rng.integers(2, 1000)), int(rng.integers(1, padded + 1)), True, True],
              [True, int(rng.integers(2, 1000)), int(rng.integers(1, padded + 1)), False, True],
              [True, int(rng.integers(2, 1000)), int(rng.integers(1, padded + 1)), True, False]]
    cases = [cases[int(i)] for i in rng.permutation(len(cases))]
    out = run(_CONTROLLER, {"recorded": recorded, "padded": padded, "cases": cases}, env=ENV)
    assert len(out["results"]) == len(cases), "one result per case"
    for (replay, experts, active, metadata, rec), got in zip(cases, out["results"]):
        where = (f"moe_enable_routing_replay={replay}, num_moe_experts={experts}, active_token_count={active} "
                 f"of {padded} recorded rows, routing metadata {'present' if metadata else 'absent'}, "
                 f"get_routing_indices() {'a tensor' if rec else 'None'}")
        if not (replay and metadata and rec):
            assert got is None, f"{where}: want None, got {got and got['type']}"
            continue
        dtype = "int16" if (experts or 0) <= 32768 else "int32"
        assert got is not None, f"{where}: _router_record_bookkeeping returned None"
        assert got["type"] == "ndarray", f"{where}: returned a {got['type']}, want one flat numpy array"
        assert got["dtype"] == dtype, f"{where}: dtype {got['dtype']}, want {dtype}"
        _equal(got["value"], recorded[:active], f"{where}: the first active_token_count recorded rows")
