"""Hidden probes for megatron-0008 (leaf-first LRU eviction of prefix-cached KV blocks).

The judge never imports megatron or torch. Two kinds of children:

- allocator children (CPU only) build KVBlockAllocator over a stand-in context, allocate blocks,
  register them with hashes and parent hashes the judge chose, set reference counts and
  timestamps the judge chose, evict, and send back which hashes are still registered and the
  allocator's parent/child bookkeeping. The judge derives the expected parent of every block
  from its own forest, and the expected evictions with its own leaf peel: repeatedly take the
  cached block with no registered child that has the smallest (timestamp, block id).
- context children (one CUDA device) open a one-rank gloo group (the context only reads group
  ranks and sizes), build DynamicInferenceContext objects with LRU prefix caching, and add,
  release and re-add requests whose prompts the judge chose so that the expected matches,
  evictions and parent chains follow from the scenario alone.
"""

import heapq

import numpy as np

from infradev_probe import run

ALLOC = """
from types import SimpleNamespace

import torch

from megatron.core.inference.config import PrefixCachingEvictionPolicy
from megatron.core.inference.contexts.kv_block_allocator import KVBlockAllocator


def make_alloc(total, lru=True):
    ctx = SimpleNamespace(
        paused_request_count=0, total_request_count=0,
        request_kv_block_counts=torch.zeros(8, dtype=torch.int32),
        request_to_kv_block_ids=-torch.ones((8, 4), dtype=torch.int32),
        prefix_cache_lru_clock=0,
    )
    policy = PrefixCachingEvictionPolicy.LRU if lru else PrefixCachingEvictionPolicy.REF_ZERO
    return KVBlockAllocator(ctx, total_count=total, paused_count=1, enable_prefix_caching=True,
                            prefix_caching_eviction_policy=policy)


def seed(a, hashes, parents, stamps=None, pinned=None):
    ids = [int(i) for i in a.allocate_memory_blocks(len(hashes)).tolist()]
    a.register_kv_block_hashes(ids, list(hashes), list(parents))
    t = torch.tensor(ids, dtype=torch.int64)
    if pinned is not None:
        a.block_ref_counts[t] = torch.tensor([1 if p else 0 for p in pinned], dtype=torch.int32)
    if stamps is not None:
        a.block_timestamps[t] = torch.tensor(stamps, dtype=torch.int64)
    return ids


def registered(a):
    return sorted(int(h) for h in a.kv_hash_to_block_id)


def forest(a, ids):
    return dict(parent=[int(a.block_parent_id[i]) for i in ids],
                children=[int(a.block_child_count[i]) for i in ids],
                hashes=[int(a.block_hashes[i]) for i in ids])
"""


def leaf_peel(ids, hashes, parents, stamps, pinned, k):
    """The judge's eviction: cached = unpinned; a cached block's parent is the block holding its
    parent hash if that block is cached; peel leaves by (timestamp, id). Returns evicted hashes."""
    by_hash = dict(zip(hashes, range(len(ids))))
    cached = [i for i in range(len(ids)) if not pinned[i]]
    parent = {}
    children = {i: 0 for i in cached}
    for i in cached:
        p = by_hash.get(parents[i])
        if p is not None and not pinned[p]:
            parent[i] = p
            children[p] += 1
    heap = [(stamps[i], ids[i], i) for i in cached if children[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap and len(out) < k:
        _, _, i = heapq.heappop(heap)
        out.append(hashes[i])
        p = parent.get(i)
        if p is not None:
            children[p] -= 1
            if children[p] == 0:
                heapq.heappush(heap, (stamps[p], ids[p], p))
    assert len(out) == k, "judge: generated a forest that cannot be peeled"
    return out


def random_cases(seed, count):
    rng = np.random.default_rng(seed)
    cases = []
    for c in range(count):
        n = int(rng.integers(3, 13))
        hashes = [int(h) for h in rng.choice(np.arange(10**6, 10**6 + 10**5), size=n, replace=False)]
        parents = []
        for k in range(n):
            parents.append(0 if k == 0 or rng.random() < 0.35 else hashes[int(rng.integers(0, k))])
        # half the cases draw timestamps from a tiny range, so ties are decided by block id
        stamps = [int(s) for s in rng.integers(1, 4 if c % 2 else 1000, size=n)]
        pinned = [False] * n
        if c % 3 == 0:
            # pin a block and all its ancestors (a request holds a whole prefix)
            by_hash = dict(zip(hashes, range(n)))
            i = int(rng.integers(0, n))
            while i is not None and not pinned[i]:
                pinned[i] = True
                i = by_hash.get(parents[i])
        cached = n - sum(pinned)
        if cached == 0:
            pinned[-1] = False
            cached = 1
        k = int(rng.integers(1, cached + 1)) if c % 7 else cached + 1
        cases.append(dict(hashes=hashes, parents=parents, stamps=stamps, pinned=pinned, k=k))
    return cases


CASES = random_cases(8, 48)


def test_eviction_peels_leaves_in_lru_order():
    out = run(ALLOC + """
results = []
for c in ARGS["cases"]:
    a = make_alloc(len(c["hashes"]) + 6)
    ids = seed(a, c["hashes"], c["parents"], c["stamps"], c["pinned"])
    avail = a.total_avail
    try:
        ok = a.evict_lru_blocks(c["k"])
    except AssertionError as e:
        ok = "AssertionError: %s" % e
    results.append(dict(ids=ids, ok=ok, kept=registered(a), freed=a.total_avail - avail,
                        hashes=[int(a.block_hashes[i]) for i in ids],
                        refs=[int(a.block_ref_counts[i]) for i in ids]))
emit(results=results)
""", args={"cases": CASES})
    for n, (c, got) in enumerate(zip(CASES, out["results"])):
        ids = got["ids"]
        assert len(set(ids)) == len(ids), f"case {n}: allocation gave repeated ids {ids}"
        where = (f"case {n}: blocks {ids}, parents (by hash) {c['parents']}, hashes {c['hashes']}, "
                 f"timestamps {c['stamps']}, pinned {c['pinned']}, evicting {c['k']}")
        cached = len(ids) - sum(c["pinned"])
        if c["k"] > cached:
            assert got["ok"] is False, f"{where}: only {cached} cached blocks, want False, got {got['ok']}"
            assert got["kept"] == sorted(c["hashes"]) and got["freed"] == 0, \
                f"{where}: a refused eviction changed the cache ({got['kept']}, freed {got['freed']})"
            continue
        assert got["ok"] is True, f"{where}: evict_lru_blocks returned {got['ok']}"
        evicted = leaf_peel(ids, c["hashes"], c["parents"], c["stamps"], c["pinned"], c["k"])
        want = sorted(set(c["hashes"]) - set(evicted))
        assert got["kept"] == want, \
            f"{where}: still registered {got['kept']}, want {want} (leaf-first LRU evicts {evicted})"
        assert got["freed"] == c["k"], f"{where}: total_avail grew by {got['freed']}, want {c['k']}"
        for i, h, bh, pin, ref in zip(ids, c["hashes"], got["hashes"], c["pinned"], got["refs"]):
            assert bh == (-1 if h in evicted else h), f"{where}: block {i} has hash {bh}"
            if pin:
                assert ref == 1, f"{where}: pinned block {i} has reference count {ref}"


# The judge's forest for the bookkeeping probe: (name, hash, parent hash) per registration call.
# E's parent hash is registered nowhere; F's parent G comes later in the same call.
BATCHES = [
    [("A", 101, 0), ("B", 102, 101)],
    [("C", 103, 102), ("D", 104, 102)],
    [("E", 105, 777777)],
    [("F", 106, 107), ("G", 107, 0)],
    [("H", 108, 103)],
]
STAMPS = {"A": 1, "B": 2, "C": 3, "D": 9, "E": 4, "F": 8, "G": 5, "H": 7}
NAMES = [b[0] for batch in BATCHES for b in batch]
HASH = {b[0]: b[1] for batch in BATCHES for b in batch}
PARENT = {b[0]: next((x for x in NAMES if HASH[x] == b[2]), None) for batch in BATCHES for b in batch}


def expected_forest(ids, alive):
    idx = {name: ids[i] for i, name in enumerate(NAMES)}
    parent = [idx[PARENT[x]] if x in alive and PARENT[x] in alive else -1 for x in NAMES]
    children = [sum(1 for y in alive if PARENT[y] == x) if x in alive else 0 for x in NAMES]
    hashes = [HASH[x] if x in alive else -1 for x in NAMES]
    return dict(parent=parent, children=children, hashes=hashes)


def test_forest_bookkeeping_persists_across_calls():
    out = run(ALLOC + """
a = make_alloc(24)
ids = []
for batch in ARGS["batches"]:
    ids += seed(a, [b[1] for b in batch], [b[2] for b in batch])
after_register = forest(a, ids)
t = torch.tensor(ids, dtype=torch.int64)
a.block_ref_counts[t] = 0
a.block_timestamps[t] = torch.tensor(ARGS["stamps"], dtype=torch.int64)
steps = []
for _ in range(len(ids) + 1):
    try:
        ok = a.evict_lru_blocks(1)
    except AssertionError as e:
        ok = "AssertionError: %s" % e
    steps.append(dict(ok=ok, kept=registered(a), **forest(a, ids)))
    if ok is not True:
        break
seed(a, [501, 502, 503], [0, 501, 502])
a.reset()
after_reset = dict(parents=sorted(set(int(x) for x in a.block_parent_id.tolist())),
                   children=sorted(set(int(x) for x in a.block_child_count.tolist())),
                   registered=registered(a))
rz = make_alloc(12, lru=False)
rz_ids = seed(rz, [11, 12], [0, 11])
mismatch = {}
for name, alloc in (("lru", make_alloc(12)), ("ref_zero", make_alloc(12, lru=False))):
    try:
        alloc.register_kv_block_hashes([3], [33], [1, 2])
        mismatch[name] = "accepted"
    except AssertionError:
        mismatch[name] = "AssertionError"
emit(ids=ids, after_register=after_register, steps=steps, after_reset=after_reset,
     rz_attrs=[hasattr(rz, "block_parent_id"), hasattr(rz, "block_child_count")],
     rz_registered=registered(rz), mismatch=mismatch)
""", args={"batches": BATCHES, "stamps": [STAMPS[x] for x in NAMES]})
    ids = out["ids"]
    assert len(set(ids)) == len(NAMES), f"allocation gave repeated ids {ids}"
    label = dict(zip(ids, NAMES))
    want = expected_forest(ids, set(NAMES))
    got = out["after_register"]
    assert got["parent"] == want["parent"], (
        f"block_parent_id after registering {BATCHES} in five calls: "
        f"{dict(zip(NAMES, got['parent']))}, want {dict(zip(NAMES, want['parent']))} (blocks {dict(zip(NAMES, ids))})")
    assert got["children"] == want["children"], (
        f"block_child_count after registration: {dict(zip(NAMES, got['children']))}, "
        f"want {dict(zip(NAMES, want['children']))}")

    alive = set(NAMES)
    for n, step in enumerate(out["steps"]):
        if not alive:
            assert step["ok"] is False, f"evicting from an empty cache returned {step['ok']}"
            break
        leaves = [x for x in alive if not any(PARENT[y] == x for y in alive)]
        victim = min(leaves, key=lambda x: (STAMPS[x], ids[NAMES.index(x)]))
        alive.discard(victim)
        assert step["ok"] is True, (
            f"call {n + 1} of evict_lru_blocks(1) returned {step['ok']}; want {victim} evicted "
            f"(leaves {sorted(leaves)}, timestamps {STAMPS})")
        kept = sorted(HASH[x] for x in alive)
        assert step["kept"] == kept, (
            f"call {n + 1} of evict_lru_blocks(1) left {[label.get(b, b) for b in step['kept']]} "
            f"(hashes {step['kept']}), want {sorted(alive)} ({victim} evicted): a parent whose "
            f"last child went in an earlier call is a leaf now")
        want = expected_forest(ids, alive)
        for key in ("parent", "children", "hashes"):
            assert step[key] == want[key], (
                f"after call {n + 1} ({victim} evicted): {key} {dict(zip(NAMES, step[key]))}, "
                f"want {dict(zip(NAMES, want[key]))}")
    else:
        raise AssertionError(f"the eviction sequence stopped early: {out['steps'][-1]}")

    assert out["after_reset"] == dict(parents=[-1], children=[0], registered=[]), \
        f"after reset(): {out['after_reset']}"
    assert out["rz_attrs"] == [False, False], \
        "a REF_ZERO allocator keeps no block_parent_id / block_child_count"
    assert out["rz_registered"] == [11, 12], f"REF_ZERO registration with parent hashes: {out['rz_registered']}"
    assert out["mismatch"] == {"lru": "AssertionError", "ref_zero": "AssertionError"}, \
        f"parent_hashes of the wrong length: {out['mismatch']}"


def available(avail, evictable, potential, need):
    return avail >= need or avail + evictable - potential >= need


QUERIES_FULL = [(3, 0), (3, 1), (2, 1), (1, 3), (2, 3)]
QUERIES_ONE_FREE = [(1, 2), (2, 2), (3, 0), (2, 1)]

CTX = """
import socket

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.core.inference.config import InferenceConfig, PrefixCachingEvictionPolicy
from megatron.core.inference.contexts.dynamic_context import BlockOverflowError, DynamicInferenceContext
from megatron.core.inference.inference_request import DynamicInferenceRequest
from megatron.core.inference.sampling_params import SamplingParams
from megatron.core.transformer.transformer_config import TransformerConfig

torch.cuda.set_device(0)
DEV = torch.cuda.current_device()
_s = socket.socket()
_s.bind(("127.0.0.1", 0))
_port = _s.getsockname()[1]
_s.close()
dist.init_process_group(backend="gloo", init_method="tcp://127.0.0.1:%d" % _port, rank=0, world_size=1)
parallel_state.initialize_model_parallel()


def make_context():
    DynamicInferenceContext.ROUNDER = 64
    DynamicInferenceContext.TOKEN_ROUNDER = 64
    DynamicInferenceContext.REQUEST_ROUNDER = 64
    model = TransformerConfig(
        params_dtype=torch.float32, num_layers=4, kv_channels=8, num_attention_heads=2,
        hidden_size=16, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        use_cpu_initialization=True,
    )
    config = InferenceConfig(
        max_sequence_length=512, buffer_size_gb=0.1, paused_buffer_size_gb=0.02,
        block_size_tokens=32, use_flashinfer_fused_rope=None, unified_memory_level=0,
        enable_prefix_caching=True, prefix_caching_eviction_policy=PrefixCachingEvictionPolicy.LRU,
    )
    return DynamicInferenceContext(model_config=model, inference_config=config)


def make_request(ctx, rid, pieces):
    tokens = []
    for start, count in pieces:
        tokens += list(range(start, start + count))
    return DynamicInferenceRequest(
        request_id=rid,
        prompt_tokens=torch.tensor(tokens, dtype=torch.int64, device=DEV),
        sampling_params=SamplingParams(num_tokens_to_generate=10),
        block_size_tokens=ctx.block_size_tokens,
        enable_prefix_caching=True,
    )


def row(ctx, idx, n):
    return [int(ctx.request_to_kv_block_ids[idx][i]) for i in range(n)]


def refs(ctx, ids):
    return [int(ctx.kv_block_allocator.block_ref_counts[i]) for i in ids]
"""


def test_availability_reserves_only_evictable_matches():
    alloc = run(ALLOC + """
a = make_alloc(12)
a.allocate_memory_blocks(a.total_avail)
ids = [int(i) for i in torch.nonzero(a.block_ref_counts == 1).flatten().tolist()][:3]
a.register_kv_block_hashes(ids, [71, 72, 73], [0, 71, 72])
a.block_ref_counts[torch.tensor(ids)] = 0
full = dict(avail=a.total_avail, evictable=int(a.get_evictable_block_count()),
            answers=[a.is_memory_available(n, potential_matched_count=p) for n, p in ARGS["full"]],
            default=a.is_memory_available(3))
a.evict_lru_blocks(1)
one_free = dict(avail=a.total_avail, evictable=int(a.get_evictable_block_count()),
                answers=[a.is_memory_available(n, potential_matched_count=p) for n, p in ARGS["one_free"]])
emit(full=full, one_free=one_free)
""", args={"full": QUERIES_FULL, "one_free": QUERIES_ONE_FREE})
    for name, queries, avail, evictable in (("full", QUERIES_FULL, 0, 3), ("one_free", QUERIES_ONE_FREE, 1, 2)):
        got = alloc[name]
        assert (got["avail"], got["evictable"]) == (avail, evictable), f"probe setup ({name}): {got}"
        want = [available(avail, evictable, p, n) for n, p in queries]
        assert got["answers"] == want, (
            f"is_memory_available with {avail} free and {evictable} evictable blocks, for "
            f"(num_blocks, potential_matched_count) {queries}: {got['answers']}, want {want}")
    assert alloc["full"]["default"] is True, "is_memory_available(3) with 3 evictable blocks must be True"

    out = run(CTX + """
ctx = make_context()
bs = ctx.block_size_tokens
a = ctx.kv_block_allocator
ctx.add_request(make_request(ctx, 1, [(0, 2 * bs)]))
shared = row(ctx, 0, 2)
ctx.add_request(make_request(ctx, 2, [(9000, bs)]))
ctx.release_memory_blocks_from_request_indexes(torch.tensor([1]))
a.total_avail = 0


def ask():
    b = make_request(ctx, 3, [(0, 2 * bs), (30000, bs)])
    c = make_request(ctx, 4, [(0, 2 * bs), (40000, 2 * bs)])
    return dict(b=bool(ctx.check_availability(b)[2]), c=bool(ctx.check_availability(c)[2]),
                evictable=int(a.get_evictable_block_count()), refs=refs(ctx, shared))


pinned = ask()
ctx.release_memory_blocks_from_request_indexes(torch.tensor([0]))
cached = ask()
emit(pinned=pinned, cached=cached)
""")
    p, c = out["pinned"], out["cached"]
    assert p["evictable"] == 1 and p["refs"] == [1, 1], f"probe setup: {p}"
    assert p["b"] is True, (
        "the shared 2-block prefix is pinned by a running request and one unrelated block is "
        "cached: a request matching the prefix and needing one new block must be reported as "
        "fitting (matches that are already pinned are not reserved again)")
    assert p["c"] is False, "one evictable block cannot supply a request needing two new blocks"
    assert c["evictable"] == 3 and c["refs"] == [0, 0], f"probe setup: {c}"
    assert c["b"] is True, "3 evictable blocks, 2 of them the request's own matches: one new block fits"
    assert c["c"] is False, (
        "3 evictable blocks, 2 of them the request's own (unpinned) matches, which add_request "
        "pins before allocating: a request needing two new blocks does not fit")


def test_matched_blocks_are_pinned_before_eviction():
    out = run(CTX + """
ctx = make_context()
bs = ctx.block_size_tokens
a = ctx.kv_block_allocator
ctx.prefix_cache_lru_clock = 1
ctx.add_request(make_request(ctx, 1, [(0, 3 * bs)]))
chain = row(ctx, 0, 3)
ctx.prefix_cache_lru_clock = 10
ctx.add_request(make_request(ctx, 2, [(9000, bs)]))
x = row(ctx, 1, 1)[0]
ctx.prefix_cache_lru_clock = 20
ctx.add_request(make_request(ctx, 3, [(20000, bs)]))
y = row(ctx, 2, 1)[0]
ctx.release_memory_blocks_from_request_indexes(torch.tensor([0, 1, 2]))
ctx.total_request_count = 0
before = refs(ctx, chain + [x, y])
a.total_avail = 0

ctx.prefix_cache_lru_clock = 30
new = make_request(ctx, 4, [(0, 2 * bs), (50000, 2 * bs)])
ctx.add_request(new)
table = row(ctx, 0, 4)
placed = dict(table=table, refs=refs(ctx, table), hashes=[int(a.block_hashes[i]) for i in table],
              want_hashes=[int(h) for h in new.precomputed_block_hashes[:4]],
              y_hash=int(a.block_hashes[y]), y_ref=int(a.block_ref_counts[y]))

ctx.prefix_cache_lru_clock = 40
big = make_request(ctx, 5, [(0, 2 * bs), (70000, 3 * bs)])
try:
    ctx.add_request(big)
    failed = None
except BlockOverflowError:
    failed = "BlockOverflowError"
except Exception as e:
    failed = "%s: %s" % (type(e).__name__, e)
after = dict(failed=failed, refs=refs(ctx, table), y_hash=int(a.block_hashes[y]),
             y_ref=int(a.block_ref_counts[y]), requests=int(ctx.total_request_count))
emit(chain=chain, x=x, y=y, before=before, placed=placed, after=after)
""")
    chain, x, y = out["chain"], out["x"], out["y"]
    assert len(set(chain + [x, y])) == 5 and out["before"] == [0] * 5, f"probe setup: {out}"
    got = out["placed"]
    table = got["table"]
    where = (f"cached chain {chain} (timestamp 1), unrelated cached blocks {x} (10) and {y} (20), "
             f"no free block; a prompt matching the chain's first two blocks and needing two new "
             f"blocks got block table {table}")
    assert table[:2] == chain[:2], f"{where}: the matched blocks must come first"
    assert len(set(table)) == 4, f"{where}: a matched block was evicted and handed out again"
    assert sorted(table[2:]) == sorted([chain[2], x]), (
        f"{where}: want the new blocks to be {chain[2]} (the chain's unmatched leaf) and {x} "
        f"(the next least recently used leaf), the matched blocks being pinned first")
    assert got["refs"] == [1, 1, 1, 1], f"{where}: reference counts {got['refs']}"
    assert got["hashes"] == got["want_hashes"], f"{where}: block hashes {got['hashes']}, want {got['want_hashes']}"
    assert got["y_ref"] == 0 and got["y_hash"] != -1, f"{where}: block {y} must stay cached"

    after = out["after"]
    assert after["failed"] == "BlockOverflowError", (
        f"a request matching the same two blocks and needing three new ones, with one evictable "
        f"block left, must fail with BlockOverflowError; got {after['failed']}")
    assert after["refs"] == [1, 1, 1, 1], (
        f"after the failed add_request the first request's blocks have reference counts "
        f"{after['refs']}, want [1, 1, 1, 1]: the failed add must undo its pin of the matched blocks")
    assert after["y_ref"] == 0 and after["y_hash"] != -1, "the failed add must not evict the cached block"
    assert after["requests"] == 1, f"the failed add changed total_request_count to {after['requests']}"


def test_context_registers_parent_chain():
    out = run(CTX + """
ctx = make_context()
bs = ctx.block_size_tokens
a = ctx.kv_block_allocator
# a 4.5-block prompt prefilled in two chunks (1.5 blocks, then the rest), as the engine does:
# the second add_request reuses the request's row and completes block 1
req = make_request(ctx, 1, [(0, 4 * bs + bs // 2)])
chunk = bs + bs // 2
ctx.add_request(req, prefill_chunk_length=chunk)
req.remaining_prompt_tokens = req.remaining_prompt_tokens[chunk:]
req.finished_chunk_token_count += chunk
ctx.total_request_count -= 1
ctx.add_request(req)
first = row(ctx, 0, 5)
ctx.add_request(make_request(ctx, 2, [(0, 2 * bs), (60000, 2 * bs)]))
second = row(ctx, 1, 4)
both = first + second[2:]
emit(first=first, second=second, parent=[int(a.block_parent_id[i]) for i in both],
     children=[int(a.block_child_count[i]) for i in both])
""")
    first, second = out["first"], out["second"]
    assert len(set(first)) == 5 and second[:2] == first[:2] and len(set(first + second[2:])) == 7, \
        f"probe setup (prefix match): {first} {second}"
    b0, b1, b2, b3, partial = first
    c2, c3 = second[2:]
    want_parent = [-1, b0, b1, b2, -1, b1, c2]
    want_children = [1, 2, 1, 0, 0, 1, 0]
    assert out["parent"] == want_parent, (
        f"a 4.5-block prompt prefilled in chunks of 1.5 and 3 blocks (blocks {first}) then a "
        f"prompt sharing its first two blocks (new "
        f"blocks {c2}, {c3}): block_parent_id {out['parent']}, want {want_parent} (each complete "
        f"block's parent is the block before it in its prompt, matched or not; the partial block "
        f"is not registered)")
    assert out["children"] == want_children, \
        f"block_child_count {out['children']}, want {want_children} for blocks {first + [c2, c3]}"
