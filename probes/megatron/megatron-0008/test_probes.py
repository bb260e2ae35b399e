"""Hidden probes for megatron-0008 (leaf-first LRU eviction of prefix-cached KV blocks).

The judge never imports megatron or torch. Every scenario is drawn fresh for each attempt. Two
kinds of children:

- allocator children (CPU only) build KVBlockAllocator over a stand-in context, take every block
  of the pool, register hashes and parent hashes the judge chose on block ids the judge chose,
  set reference counts and timestamps the judge chose, evict, and send back which hashes are
  still registered and the allocator's parent/child bookkeeping. The judge derives the expected
  parent of every block from its own forest, and the expected evictions with its own leaf peel:
  repeatedly take the cached block with no registered child that has the smallest
  (timestamp, block id).
- context children (one CUDA device) open a one-rank gloo group (the context only reads group
  ranks and sizes), build DynamicInferenceContext objects with LRU prefix caching, and add,
  release and re-add requests whose prompts (random token ids) the judge chose, so that the
  expected matches, evictions and parent chains follow from the scenario alone. The block ids
  the context hands out serve only as labels; the judge computes the prompt block hashes itself
  (the SHA-256 chain over each block's int64 token ids that DynamicInferenceRequest uses).
"""

import hashlib
import heapq

import numpy as np

from infradev_probe import fresh, run

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


def take_all(a):
    \"\"\"Takes every free block (all but the dummy block); they stay pinned and unregistered
    until a call registers some of them.\"\"\"
    return sorted(int(i) for i in a.allocate_memory_blocks(a.total_avail).tolist())


def register(a, ids, hashes, parents):
    if parents is None:
        a.register_kv_block_hashes([int(i) for i in ids], [int(h) for h in hashes])
    else:
        a.register_kv_block_hashes([int(i) for i in ids], [int(h) for h in hashes], [int(p) for p in parents])


def set_state(a, ids, refs=None, stamps=None):
    t = torch.tensor([int(i) for i in ids], dtype=torch.int64)
    if refs is not None:
        a.block_ref_counts[t] = torch.tensor([int(r) for r in refs], dtype=torch.int32)
    if stamps is not None:
        a.block_timestamps[t] = torch.tensor([int(s) for s in stamps], dtype=torch.int64)


def registered(a):
    return sorted(int(h) for h in a.kv_hash_to_block_id)


def evict(a, k):
    try:
        return a.evict_lru_blocks(int(k))
    except AssertionError:
        return "AssertionError"


def forest(a, ids):
    return dict(parent=[int(a.block_parent_id[i]) for i in ids],
                children=[int(a.block_child_count[i]) for i in ids],
                hashes=[int(a.block_hashes[i]) for i in ids])
"""


def draw_hashes(rng, n, avoid=()):
    """n distinct positive hashes, none in avoid."""
    out, seen = [], set(avoid)
    while len(out) < n:
        h = int(rng.integers(1, 1 << 62))
        if h not in seen:
            seen.add(h)
            out.append(h)
    return out


def peel(ids, parent_of, stamps, cached, k):
    """The judge's leaf-first LRU eviction of k blocks. ids: block id per index; parent_of: the
    index of each block's registered parent or None; cached: which indexes are cached (the
    others are pinned). A block is a leaf when no registered block (cached or pinned) has it as
    parent. Returns the evicted indexes in order, or None when the cached blocks cannot supply
    k leaves (a cycle)."""
    children = [0] * len(ids)
    for i, p in enumerate(parent_of):
        if p is not None:
            children[p] += 1
    heap = [(stamps[i], ids[i], i) for i in range(len(ids)) if cached[i] and children[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap and len(out) < k:
        _, _, i = heapq.heappop(heap)
        out.append(i)
        p = parent_of[i]
        if p is not None:
            children[p] -= 1
            if children[p] == 0 and cached[p]:
                heapq.heappush(heap, (stamps[p], ids[p], p))
    return out if len(out) == k else None


# --------------------------------------------------------------------------------------------
# Leaf-first LRU order

def eviction_case(rng):
    n = int(rng.integers(3, 14))
    total = n + int(rng.integers(2, 9)) + 1
    ids = [int(i) for i in rng.choice(total - 1, size=n, replace=False)]
    hashes = draw_hashes(rng, n)
    unknown = draw_hashes(rng, 1, avoid=hashes)[0]
    cyclic = rng.random() < 0.12
    # parent index per block: None (root: hash 0, or a hash registered nowhere) or an earlier
    # block; a cyclic case also closes a loop among some blocks (a hash collision).
    par, roots_unknown = [], []
    for i in range(n):
        if i == 0 or rng.random() < 0.3:
            par.append(None)
            roots_unknown.append(bool(rng.random() < 0.3))
        else:
            par.append(int(rng.integers(0, i)))
            roots_unknown.append(False)
    if cyclic:
        members = sorted(int(x) for x in rng.choice(n, size=min(n, int(rng.integers(2, 4))), replace=False))
        for a, b in zip(members, members[1:] + members[:1]):
            par[a] = b
    parent_hashes = [hashes[p] if p is not None else (unknown if u else 0) for p, u in zip(par, roots_unknown)]
    pinned = [False] * n
    if not cyclic and rng.random() < 0.4:
        # a running request holds a block and its whole prefix
        for _ in range(int(rng.integers(1, 3))):
            i = int(rng.integers(0, n))
            while i is not None and not pinned[i]:
                pinned[i] = True
                i = par[i]
    if all(pinned):
        pinned[n - 1] = False
        for i in range(n):  # keep the pinned set closed under parents
            if pinned[i] and par[i] is not None and not pinned[par[i]]:
                pinned[i] = False
    if rng.random() < 0.5:
        stamps = [int(s) for s in rng.integers(1, 4, size=n)]  # ties: block id decides
    else:
        stamps = [int(s) for s in rng.integers(1, 1000, size=n)]
    cached = n - sum(pinned)
    u = rng.random()
    if u < 0.12:
        k = cached + int(rng.integers(1, 3))
    elif u < 0.18:
        k = 0
    else:
        k = int(rng.integers(1, cached + 1))
    # registration calls: contiguous runs in index order (a parent is never in a later call);
    # a cyclic case registers in one call so that every parent hash resolves
    cuts = [] if cyclic else sorted(set(int(x) for x in rng.integers(1, n, size=int(rng.integers(0, 3)))))
    calls = [list(range(a, b)) for a, b in zip([0] + cuts, cuts + [n])]
    return dict(total=total, ids=ids, hashes=hashes, parent_hashes=parent_hashes, par=par,
                pinned=pinned, stamps=stamps, k=k, calls=calls)


def test_eviction_peels_leaves_in_lru_order():
    rng = fresh()
    cases = [eviction_case(rng) for _ in range(int(rng.integers(30, 60)))]
    out = run(ALLOC + """
results = []
for c in ARGS["cases"]:
    a = make_alloc(c["total"])
    take_all(a)
    for call in c["calls"]:
        register(a, [c["ids"][i] for i in call], [c["hashes"][i] for i in call],
                 [c["parent_hashes"][i] for i in call])
    set_state(a, c["ids"], refs=[1 if p else 0 for p in c["pinned"]], stamps=c["stamps"])
    avail = a.total_avail
    ok = evict(a, c["k"])
    results.append(dict(ok=ok, kept=registered(a), freed=a.total_avail - avail,
                        hashes=[int(a.block_hashes[i]) for i in c["ids"]],
                        refs=[int(a.block_ref_counts[i]) for i in c["ids"]]))
emit(results=results)
""", args={"cases": cases})
    assert len(out["results"]) == len(cases), f"{len(out['results'])} results for {len(cases)} cases"
    for n, (c, got) in enumerate(zip(cases, out["results"])):
        where = (f"case {n}: blocks {c['ids']}, hashes {c['hashes']}, parent hashes {c['parent_hashes']}, "
                 f"timestamps {c['stamps']}, pinned {c['pinned']}, evicting {c['k']}")
        cached = [not p for p in c["pinned"]]
        if c["k"] > sum(cached):
            assert got["ok"] is False, f"{where}: only {sum(cached)} cached blocks, want False, got {got['ok']}"
            assert got["kept"] == sorted(c["hashes"]) and got["freed"] == 0, \
                f"{where}: a refused eviction changed the cache ({got['kept']}, freed {got['freed']})"
            continue
        evicted = peel(c["ids"], c["par"], c["stamps"], cached, c["k"])
        if evicted is None:
            assert got["ok"] == "AssertionError", (
                f"{where}: the parent graph has a cycle and too few leaves to evict {c['k']} blocks; "
                f"want AssertionError, got {got['ok']}")
            continue
        assert got["ok"] is True, f"{where}: evict_lru_blocks returned {got['ok']}"
        gone = {c["hashes"][i] for i in evicted}
        want = sorted(set(c["hashes"]) - gone)
        assert got["kept"] == want, (
            f"{where}: still registered {got['kept']}, want {want} "
            f"(leaf-first LRU evicts {[c['ids'][i] for i in evicted]})")
        assert got["freed"] == c["k"], f"{where}: total_avail grew by {got['freed']}, want {c['k']}"
        want_hashes = [-1 if h in gone else h for h in c["hashes"]]
        assert got["hashes"] == want_hashes, f"{where}: block_hashes {got['hashes']}, want {want_hashes}"
        want_refs = [1 if p else 0 for p in c["pinned"]]
        assert got["refs"] == want_refs, f"{where}: reference counts {got['refs']}, want {want_refs}"


# --------------------------------------------------------------------------------------------
# Persistent parent/child bookkeeping

def forest_scenario(rng):
    n = int(rng.integers(6, 13))
    extra = int(rng.integers(3, 6))  # the chain registered just before reset()
    total = n + extra + int(rng.integers(2, 8)) + 1
    pool = [int(i) for i in rng.permutation(total - 1)]
    ids, reset_ids = pool[:n], pool[n:n + extra]
    hashes = draw_hashes(rng, n + extra)
    hashes, reset_hashes = hashes[:n], hashes[n:]
    unknown = draw_hashes(rng, 1, avoid=hashes + reset_hashes)[0]
    # index order is a topological order; calls are contiguous runs of it, each listed in a
    # random order (a parent may come later in its call's list than its child)
    cuts = sorted(set(int(x) for x in rng.choice(np.arange(1, n), size=int(rng.integers(2, 5)), replace=False)))
    groups = [list(range(a, b)) for a, b in zip([0] + cuts, cuts + [n])]
    group_of = {i: g for g, members in enumerate(groups) for i in members}
    no_parents = int(rng.integers(0, len(groups))) if rng.random() < 0.5 else None
    par, parent_hash = [], []
    for i in range(n):
        g = group_of[i]
        if g == no_parents:
            par.append(None)
            parent_hash.append(0)
            continue
        u = rng.random()
        if i == 0 or u < 0.2:
            par.append(None)
            parent_hash.append(0)
        elif u < 0.3:
            par.append(None)
            parent_hash.append(unknown)
        else:
            p = int(rng.integers(0, i))
            par.append(p)
            parent_hash.append(hashes[p])
    # make sure one call lists a parent after its child
    forced = None
    for g, members in enumerate(groups):
        if g != no_parents and len(members) >= 2:
            a, b = members[0], members[-1]
            par[b], parent_hash[b] = a, hashes[a]
            forced = g
            break
    calls = []
    for g, members in enumerate(groups):
        if g == forced or rng.random() < 0.5:
            order = list(reversed(members))
        else:
            order = [int(x) for x in rng.permutation(members)]
        calls.append(dict(members=order, none=g == no_parents))
    if rng.random() < 0.5:
        stamps = [int(s) for s in rng.integers(1, 4, size=n)]
    else:
        stamps = [int(s) for s in rng.integers(1, 100, size=n)]
    steps = []
    left = n
    while left > 0:
        k = int(min(left, rng.integers(1, 4)))
        steps.append(k)
        left -= k
    steps.append(int(rng.integers(1, 3)))  # nothing left: refused
    # REF_ZERO: a chain registered with parent hashes; attribute queries over both policies;
    # registration calls whose parent_hashes length does or does not match
    rz_hashes = draw_hashes(rng, int(rng.integers(2, 6)))
    attrs = ["block_parent_id", "block_child_count", "block_timestamps", "block_hashes", "block_ref_counts"]
    queries = [[bool(rng.random() < 0.5), attrs[int(rng.integers(0, len(attrs)))]] for _ in range(int(rng.integers(6, 12)))]
    lengths = []
    for _ in range(int(rng.integers(4, 9))):
        m = int(rng.integers(1, 4))
        p = m if rng.random() < 0.4 else max(0, m + int(rng.choice([-2, -1, 1, 2])))
        lengths.append([bool(rng.random() < 0.5), m, p])
    return dict(total=total, ids=ids, hashes=hashes, parent_hash=parent_hash, par=par, calls=calls,
                stamps=stamps, steps=steps, reset_ids=reset_ids, reset_hashes=reset_hashes,
                rz_total=len(rz_hashes) + int(rng.integers(2, 6)) + 1, rz_hashes=rz_hashes,
                queries=queries, lengths=lengths, len_hashes=draw_hashes(rng, 3))


def expected_forest(s, alive):
    """parent ids, child counts and hashes of the scenario's blocks with only `alive` registered."""
    ids = s["ids"]
    parent = [ids[s["par"][i]] if i in alive and s["par"][i] in alive else -1 for i in range(len(ids))]
    children = [sum(1 for j in alive if s["par"][j] == i) if i in alive else 0 for i in range(len(ids))]
    hashes = [s["hashes"][i] if i in alive else -1 for i in range(len(ids))]
    return dict(parent=parent, children=children, hashes=hashes)


def test_forest_bookkeeping_persists_across_calls():
    rng = fresh()
    s = forest_scenario(rng)
    out = run(ALLOC + """
S = ARGS["s"]
a = make_alloc(S["total"])
take_all(a)
ids = S["ids"]
for call in S["calls"]:
    m = call["members"]
    register(a, [ids[i] for i in m], [S["hashes"][i] for i in m],
             None if call["none"] else [S["parent_hash"][i] for i in m])
after_register = forest(a, ids)
set_state(a, ids, refs=[0] * len(ids), stamps=S["stamps"])
steps = []
for k in S["steps"]:
    ok = evict(a, k)
    steps.append(dict(ok=ok, kept=registered(a), **forest(a, ids)))
rh = S["reset_hashes"]
register(a, S["reset_ids"], rh, [0] + rh[:-1])
before_reset = forest(a, S["reset_ids"])
a.reset()
after_reset = dict(parents=[int(x) for x in a.block_parent_id.tolist()],
                   children=[int(x) for x in a.block_child_count.tolist()],
                   registered=registered(a))
rz = make_alloc(S["rz_total"], lru=False)
rz_ids = take_all(rz)[:len(S["rz_hashes"])]
register(rz, rz_ids, S["rz_hashes"], [0] + S["rz_hashes"][:-1])
attrs = [hasattr(make_alloc(8, lru=lru), name) for lru, name in S["queries"]]
lengths = []
for lru, m, p in S["lengths"]:
    b = make_alloc(8, lru=lru)
    blocks = take_all(b)[:m]
    try:
        b.register_kv_block_hashes(blocks, S["len_hashes"][:m], [0] * p)
        lengths.append("accepted")
    except AssertionError:
        lengths.append("AssertionError")
emit(after_register=after_register, steps=steps, before_reset=before_reset, after_reset=after_reset,
     rz_registered=registered(rz), attrs=attrs, lengths=lengths)
""", args={"s": s})
    ids, n = s["ids"], len(s["ids"])
    calls = [[ids[i] for i in c["members"]] for c in s["calls"]]
    want = expected_forest(s, set(range(n)))
    got = out["after_register"]
    for key, attr in (("parent", "block_parent_id"), ("children", "block_child_count"), ("hashes", "block_hashes")):
        assert got[key] == want[key], (
            f"{attr} of blocks {ids} after registering them in calls {calls} (parent hashes "
            f"{s['parent_hash']}, calls without parent_hashes: "
            f"{[i for i, c in enumerate(s['calls']) if c['none']]}): {got[key]}, want {want[key]}")

    alive = set(range(n))
    assert len(out["steps"]) == len(s["steps"]), f"{len(out['steps'])} eviction results for {len(s['steps'])} calls"
    for step_no, (k, step) in enumerate(zip(s["steps"], out["steps"])):
        where = f"call {step_no + 1} of evict_lru_blocks (sizes {s['steps']}, timestamps {s['stamps']})"
        if k > len(alive):
            assert step["ok"] is False, f"{where}: {len(alive)} cached blocks left, evicting {k}: want False, got {step['ok']}"
        else:
            par = [s["par"][i] if i in alive and s["par"][i] in alive else None for i in range(n)]
            cached = [i in alive for i in range(n)]
            evicted = peel(ids, par, s["stamps"], cached, k)
            assert step["ok"] is True, f"{where}: returned {step['ok']}, want True"
            alive -= set(evicted)
        kept = sorted(s["hashes"][i] for i in alive)
        assert step["kept"] == kept, (
            f"{where}: still registered {step['kept']}, want {kept}: a parent whose last child went "
            f"in an earlier call is a leaf now")
        want = expected_forest(s, alive)
        for key in ("parent", "children", "hashes"):
            assert step[key] == want[key], f"{where}: {key} of blocks {ids} {step[key]}, want {want[key]}"

    r = s["reset_ids"]
    want_before = dict(parent=[-1] + r[:-1], children=[1] * (len(r) - 1) + [0], hashes=s["reset_hashes"])
    assert out["before_reset"] == want_before, f"chain {r} registered before reset(): {out['before_reset']}, want {want_before}"
    want_reset = dict(parents=[-1] * s["total"], children=[0] * s["total"], registered=[])
    assert out["after_reset"] == want_reset, f"after reset(): {out['after_reset']}, want all -1 / 0 and nothing registered"
    assert out["rz_registered"] == sorted(s["rz_hashes"]), \
        f"REF_ZERO registration with parent hashes: registered {out['rz_registered']}, want {sorted(s['rz_hashes'])}"
    lru_attrs = {"block_parent_id", "block_child_count", "block_timestamps", "block_hashes", "block_ref_counts"}
    want_attrs = [name in lru_attrs if lru else name in {"block_hashes", "block_ref_counts"} for lru, name in s["queries"]]
    assert out["attrs"] == want_attrs, (
        f"allocator attributes for (LRU?, name) {s['queries']}: {out['attrs']}, want {want_attrs} "
        f"(only an LRU allocator keeps block_parent_id and block_child_count)")
    want_lengths = ["accepted" if m == p else "AssertionError" for _, m, p in s["lengths"]]
    assert out["lengths"] == want_lengths, (
        f"register_kv_block_hashes with (LRU?, len(block_ids), len(parent_hashes)) {s['lengths']}: "
        f"{out['lengths']}, want {want_lengths}")


# --------------------------------------------------------------------------------------------
# Availability

def available(avail, evictable, potential, need):
    return avail >= need or avail + evictable - potential >= need


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


def make_context(block_size):
    DynamicInferenceContext.ROUNDER = 64
    DynamicInferenceContext.TOKEN_ROUNDER = 64
    DynamicInferenceContext.REQUEST_ROUNDER = 64
    model = TransformerConfig(
        params_dtype=torch.float32, num_layers=4, kv_channels=8, num_attention_heads=2,
        hidden_size=16, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        use_cpu_initialization=True,
    )
    config = InferenceConfig(
        max_sequence_length=1024, buffer_size_gb=0.1, paused_buffer_size_gb=0.02,
        block_size_tokens=block_size, use_flashinfer_fused_rope=None, unified_memory_level=0,
        enable_prefix_caching=True, prefix_caching_eviction_policy=PrefixCachingEvictionPolicy.LRU,
    )
    return DynamicInferenceContext(model_config=model, inference_config=config)


def make_request(ctx, rid, tokens):
    return DynamicInferenceRequest(
        request_id=rid,
        prompt_tokens=torch.tensor([int(t) for t in tokens], dtype=torch.int64, device=DEV),
        sampling_params=SamplingParams(num_tokens_to_generate=10),
        block_size_tokens=ctx.block_size_tokens,
        enable_prefix_caching=True,
    )


def row(ctx, idx, n):
    return [int(ctx.request_to_kv_block_ids[idx][i]) for i in range(n)]


def refs(ctx, ids):
    return [int(ctx.kv_block_allocator.block_ref_counts[i]) for i in ids]


def hashes_of(ctx, ids):
    return [int(ctx.kv_block_allocator.block_hashes[i]) for i in ids]
"""


def block_hashes(tokens, bs):
    """The prompt block hashes DynamicInferenceRequest computes: SHA-256 over the previous
    block's digest (32 zero bytes for the first) and the block's int64 token ids, the first 8
    bytes read little-endian, mod 2**63 - 1, plus 1."""
    arr = np.asarray(tokens, dtype="<i8")
    out, parent = [], b"\0" * 32
    for i in range(len(arr) // bs):
        digest = hashlib.sha256(parent + arr[i * bs:(i + 1) * bs].tobytes()).digest()
        out.append(int.from_bytes(digest[:8], "little") % (2**63 - 1) + 1)
        parent = digest
    return out


class Tokens:
    """Fresh, never repeating token ids (so that no two drawn blocks share a hash by accident)."""

    def __init__(self, rng):
        self.rng, self.next = rng, int(rng.integers(1000, 50000))

    def take(self, count):
        out = list(range(self.next, self.next + count))
        self.next += count + int(self.rng.integers(1, 1000))
        return out


def test_availability_reserves_only_evictable_matches():
    rng = fresh()
    # Allocator: f free blocks, e cached (evictable) blocks, the rest pinned; random queries.
    total = int(rng.integers(14, 40))
    free = int(rng.integers(0, 4))
    evictable = int(rng.integers(1, min(8, total - 1 - free - 1)))
    pinned = int(rng.integers(0, total - 1 - free - evictable))
    ids = [int(i) for i in rng.permutation(total - 1)]
    cached_ids, pinned_ids, free_ids = ids[:evictable], ids[evictable:evictable + pinned], \
        ids[evictable + pinned:evictable + pinned + free]
    reg = cached_ids + pinned_ids
    hashes = draw_hashes(rng, len(reg))
    queries = []
    for _ in range(int(rng.integers(8, 16))):
        need = int(rng.integers(0, free + evictable + 3))
        potential = int(rng.integers(0, evictable + 1))
        queries.append([need, potential if rng.random() < 0.85 else None])
    # one query the free pool cannot answer alone and the reservation decides
    need = free + evictable
    queries.append([need, int(rng.integers(1, evictable + 1))])
    rng.shuffle(queries)
    alloc = run(ALLOC + """
A = ARGS
a = make_alloc(A["total"])
take_all(a)
register(a, A["reg"], A["hashes"], None)
set_state(a, A["cached"], refs=[0] * len(A["cached"]))
a.release_memory_blocks(torch.tensor(A["free"], dtype=torch.int32))
answers = []
for need, potential in A["queries"]:
    if potential is None:
        answers.append(bool(a.is_memory_available(need)))
    else:
        answers.append(bool(a.is_memory_available(need, potential_matched_count=potential)))
emit(avail=int(a.total_avail), evictable=int(a.get_evictable_block_count()), answers=answers)
""", args=dict(total=total, reg=reg, hashes=hashes, cached=cached_ids, free=free_ids, queries=queries))
    assert (alloc["avail"], alloc["evictable"]) == (free, evictable), \
        f"probe setup: {alloc['avail']} free and {alloc['evictable']} evictable blocks, want {free} and {evictable}"
    want = [available(free, evictable, p or 0, n) for n, p in queries]
    assert alloc["answers"] == want, (
        f"is_memory_available with {free} free and {evictable} evictable blocks, for "
        f"(num_blocks, potential_matched_count) {queries}: {alloc['answers']}, want {want}")

    # Context: a cached prefix of m blocks, u unrelated cached blocks, no free block; requests
    # matching the first j blocks of the prefix and needing more blocks ask check_availability,
    # while the prefix is held by a running request (pinned) and after it is released (cached).
    bs = int(rng.choice([16, 32]))
    tok = Tokens(rng)
    m, u = int(rng.integers(2, 5)), int(rng.integers(1, 4))
    prefix = tok.take(m * bs)
    others = [tok.take(bs) for _ in range(u)]
    asks = {"pinned": [], "cached": []}
    for phase, evict_count, reserve in (("pinned", u, False), ("cached", u + m, True)):
        for q in range(int(rng.integers(3, 6))):
            j = int(rng.integers(1, m + 1))
            potential = j if reserve else 0
            if q == 0:
                # the reservation decides: fits only if no match is reserved (or only if the
                # already pinned matches are not reserved again)
                need = evict_count - (j - 1) if reserve else int(rng.integers(max(1, u - j + 1), u + 1))
            else:
                need = int(rng.integers(1, evict_count + 3))
            full, partial = need, 0
            if need > 1 and rng.random() < 0.4:
                full, partial = need - 1, int(rng.integers(1, bs))
            tokens = prefix[:j * bs] + tok.take(full * bs + partial)
            asks[phase].append(dict(tokens=tokens, j=j, need=need,
                                    want=available(0, evict_count, potential, need)))
    out = run(CTX + """
A = ARGS
ctx = make_context(A["bs"])
a = ctx.kv_block_allocator
ctx.add_request(make_request(ctx, 1, A["prefix"]))
shared = row(ctx, 0, A["m"])
for i, t in enumerate(A["others"]):
    ctx.add_request(make_request(ctx, 2 + i, t))
ctx.release_memory_blocks_from_request_indexes(torch.tensor(list(range(1, 1 + len(A["others"])))))
a.total_avail = 0


def ask(queries, first_id):
    return dict(answers=[bool(ctx.check_availability(make_request(ctx, first_id + i, q["tokens"]))[2])
                         for i, q in enumerate(queries)],
                evictable=int(a.get_evictable_block_count()), refs=refs(ctx, shared),
                hashes=hashes_of(ctx, shared))


pinned = ask(A["asks"]["pinned"], 100)
ctx.release_memory_blocks_from_request_indexes(torch.tensor([0]))
cached = ask(A["asks"]["cached"], 200)
emit(pinned=pinned, cached=cached)
""", args=dict(bs=bs, prefix=prefix, m=m, others=others, asks=asks))
    prefix_hashes = block_hashes(prefix, bs)
    for phase, evict_count, ref in (("pinned", u, 1), ("cached", u + m, 0)):
        got = out[phase]
        assert got["evictable"] == evict_count and got["refs"] == [ref] * m and got["hashes"] == prefix_hashes, \
            f"probe setup ({phase}): {got['evictable']} evictable, prefix refs {got['refs']}, hashes {got['hashes']}"
        want = [q["want"] for q in asks[phase]]
        desc = [(q["j"], q["need"]) for q in asks[phase]]
        assert got["answers"] == want, (
            f"no free block, {evict_count} evictable blocks, the {m}-block prefix "
            f"{'pinned by a running request' if ref else 'cached'}: check_availability for requests "
            f"matching j prefix blocks and needing n new blocks, (j, n) {desc}: {got['answers']}, "
            f"want {want} (only matches that are evictable now are reserved)")


def test_matched_blocks_are_pinned_before_eviction():
    rng = fresh()
    bs = int(rng.choice([16, 32]))
    while True:
        L, u = int(rng.integers(3, 6)), int(rng.integers(2, 5))
        j = int(rng.integers(1, L))
        clocks = [int(c) for c in rng.choice(np.arange(1, 200), size=u + 1, replace=False)]
        t_chain, t_others = clocks[0], clocks[1:]
        cap = (L - j) + u  # what eviction can supply once the j matched blocks are pinned
        need = int(rng.integers(1, cap + 1))
        # keep draws where eviction without the pin would take a matched block
        stamps = [t_chain] * L + t_others
        par = [None] + list(range(L - 1)) + [None] * u
        fake_ids = list(range(L + u))  # ids only break ties, and no two stamps tie across chains
        unpinned = peel(fake_ids, par, stamps, [True] * (L + u), need)
        if unpinned is not None and any(i < j for i in unpinned):
            break
    tok = Tokens(rng)
    chain = tok.take(L * bs)
    others = [tok.take(bs) for _ in range(u)]
    full, partial = need, 0
    if need > 1 and rng.random() < 0.4:
        full, partial = need - 1, int(rng.integers(1, bs))
    new_prompt = chain[:j * bs] + tok.take(full * bs + partial)
    t_new = 200 + int(rng.integers(1, 50))
    # a later request matching j2 <= j of the same blocks needs more than eviction can give
    j2 = int(rng.integers(1, j + 1))
    left = cap - need
    big_prompt = chain[:j2 * bs] + tok.take((left + int(rng.integers(1, 3))) * bs)
    out = run(CTX + """
A = ARGS
ctx = make_context(A["bs"])
a = ctx.kv_block_allocator
ctx.prefix_cache_lru_clock = A["t_chain"]
ctx.add_request(make_request(ctx, 1, A["chain"]))
chain = row(ctx, 0, A["L"])
others = []
for i, (t, clock) in enumerate(zip(A["others"], A["t_others"])):
    ctx.prefix_cache_lru_clock = clock
    ctx.add_request(make_request(ctx, 2 + i, t))
    others.append(row(ctx, 1 + i, 1)[0])
ctx.release_memory_blocks_from_request_indexes(torch.tensor(list(range(1 + len(A["others"])))))
ctx.total_request_count = 0
every = chain + others
before = dict(refs=refs(ctx, every), hashes=hashes_of(ctx, every))
a.total_avail = 0

ctx.prefix_cache_lru_clock = A["t_new"]
ctx.add_request(make_request(ctx, 50, A["new"]))
n_table = A["j"] + A["need"]
table = row(ctx, 0, n_table)
placed = dict(table=table, refs=refs(ctx, table), hashes=hashes_of(ctx, table),
              every_hashes=hashes_of(ctx, every), every_refs=refs(ctx, every))

ctx.prefix_cache_lru_clock = A["t_new"] + 1
try:
    ctx.add_request(make_request(ctx, 51, A["big"]))
    failed = None
except BlockOverflowError:
    failed = "BlockOverflowError"
except Exception as e:
    failed = type(e).__name__
after = dict(failed=failed, refs=refs(ctx, table), every_hashes=hashes_of(ctx, every),
             every_refs=refs(ctx, every), requests=int(ctx.total_request_count))
emit(chain=chain, others=others, before=before, placed=placed, after=after)
""", args=dict(bs=bs, chain=chain, L=L, others=others, t_chain=t_chain, t_others=t_others, j=j, need=need,
               new=new_prompt, t_new=t_new, big=big_prompt))
    chain_ids, other_ids = out["chain"], out["others"]
    every = chain_ids + other_ids
    chain_h = block_hashes(chain, bs)
    every_h = chain_h + [block_hashes(t, bs)[0] for t in others]
    assert len(set(every)) == L + u and out["before"] == dict(refs=[0] * (L + u), hashes=every_h), \
        f"probe setup: blocks {every}, {out['before']}"
    # the judge's eviction with the j matched blocks pinned first: chain[j:] hangs from a pinned
    # block (a root now), the unrelated blocks are roots
    stamps = [t_chain] * L + t_others
    par = [None] + list(range(L - 1)) + [None] * u
    cached = [i >= j for i in range(L)] + [True] * u
    evicted = peel(every, par, stamps, cached, need)
    assert evicted is not None, "judge: scenario cannot be peeled"
    got = out["placed"]
    table = got["table"]
    where = (f"{L}-block cached chain {chain_ids} (timestamp {t_chain}), unrelated cached blocks "
             f"{other_ids} (timestamps {t_others}), no free block; a prompt matching the chain's first "
             f"{j} blocks and needing {need} new blocks got block table {table}")
    assert table[:j] == chain_ids[:j], f"{where}: the matched blocks must come first"
    assert len(set(table)) == len(table), f"{where}: a matched block was evicted and handed out again"
    want_new = sorted(every[i] for i in evicted)
    assert sorted(table[j:]) == want_new, (
        f"{where}: want the new blocks to be {want_new} (leaf-first LRU over the cached blocks, the "
        f"matched blocks being pinned first)")
    assert got["refs"] == [1] * len(table), f"{where}: reference counts {got['refs']}"
    want_table_h = block_hashes(new_prompt, bs)[:len(table)]
    want_table_h += [-1] * (len(table) - len(want_table_h))
    assert got["hashes"] == want_table_h, f"{where}: block hashes {got['hashes']}, want {want_table_h}"
    # every block of the chain and the unrelated ones: a block handed out again belongs to the
    # new request now, under its new hash; the others keep theirs, the matched ones pinned
    table_h = dict(zip(table, want_table_h))
    want_every_h = [table_h.get(b, h) for b, h in zip(every, every_h)]
    want_every_refs = [1 if b in table_h else 0 for b in every]
    assert got["every_hashes"] == want_every_h and got["every_refs"] == want_every_refs, (
        f"{where}: the chain and unrelated blocks have hashes {got['every_hashes']} and reference "
        f"counts {got['every_refs']}, want {want_every_h} and {want_every_refs}")

    after = out["after"]
    assert after["failed"] == "BlockOverflowError", (
        f"a request matching {j2} of the same blocks and needing more new blocks than the "
        f"{left} still evictable must fail with BlockOverflowError; got {after['failed']}")
    assert after["refs"] == [1] * len(table), (
        f"after the failed add_request the first request's blocks have reference counts "
        f"{after['refs']}, want {[1] * len(table)}: the failed add must undo its pin of the matched blocks")
    assert after["every_hashes"] == want_every_h and after["every_refs"] == want_every_refs, (
        f"the failed add changed the cached blocks: hashes {after['every_hashes']}, reference counts "
        f"{after['every_refs']}, want {want_every_h} and {want_every_refs}")
    assert after["requests"] == 1, f"the failed add changed total_request_count to {after['requests']}"


def test_context_registers_parent_chain():
    rng = fresh()
    bs = int(rng.choice([16, 32]))
    tok = Tokens(rng)
    nb = int(rng.integers(3, 7))
    rest = int(rng.integers(0, bs))  # a partial last block, or none
    first = tok.take(nb * bs + rest)
    # prefill in 2 or 3 chunks; the first ends after at least one complete block
    count = int(rng.integers(2, 4))
    cuts = sorted(set(int(c) for c in rng.integers(bs, len(first), size=count - 1)))
    chunks = [b - a for a, b in zip([0] + cuts, cuts + [len(first)])]
    s = int(rng.integers(1, nb + 1))  # the second prompt shares the first s blocks
    n2 = int(rng.integers(1, 4))
    rest2 = int(rng.integers(0, bs))
    second = first[:s * bs] + tok.take(n2 * bs + rest2)
    out = run(CTX + """
A = ARGS
ctx = make_context(A["bs"])
a = ctx.kv_block_allocator
req = make_request(ctx, 1, A["first"])
for n, chunk in enumerate(A["chunks"]):
    if n:
        # the engine's next chunk: the request keeps its row and continues where it stopped
        req.remaining_prompt_tokens = req.remaining_prompt_tokens[A["chunks"][n - 1]:]
        req.finished_chunk_token_count += A["chunks"][n - 1]
        ctx.total_request_count -= 1
    ctx.add_request(req, prefill_chunk_length=chunk)
n1 = -(-len(A["first"]) // A["bs"])
n2 = -(-len(A["second"]) // A["bs"])
first = row(ctx, 0, n1)
ctx.add_request(make_request(ctx, 2, A["second"]))
second = row(ctx, 1, n2)
both = first + second[A["s"]:]
emit(first=first, second=second, parent=[int(a.block_parent_id[i]) for i in both],
     children=[int(a.block_child_count[i]) for i in both], hashes=hashes_of(ctx, both))
""", args=dict(bs=bs, first=first, chunks=chunks, second=second, s=s))
    f_ids, s_ids = out["first"], out["second"]
    n1, n2b = -(-len(first) // bs), -(-len(second) // bs)
    assert len(f_ids) == n1 and len(s_ids) == n2b, f"probe setup: block tables {f_ids} {s_ids}"
    assert len(set(f_ids)) == n1 and s_ids[:s] == f_ids[:s] and len(set(f_ids + s_ids[s:])) == n1 + n2b - s, \
        f"probe setup (prefix match of {s} blocks): {f_ids} {s_ids}"
    both = f_ids + s_ids[s:]
    complete1, complete2 = len(first) // bs, len(second) // bs
    want_parent, want_hash = [], []
    h1, h2 = block_hashes(first, bs), block_hashes(second, bs)
    for k in range(n1):
        want_parent.append(f_ids[k - 1] if 0 < k < complete1 else -1)
        want_hash.append(h1[k] if k < complete1 else -1)
    for k in range(s, n2b):
        want_parent.append(s_ids[k - 1] if 0 < k < complete2 else -1)
        want_hash.append(h2[k] if k < complete2 else -1)
    want_children = [sum(1 for p in want_parent if p == b) for b in both]
    where = (f"a {len(first)}-token prompt ({bs}-token blocks {f_ids}) prefilled in chunks of {chunks} "
             f"tokens, then a {len(second)}-token prompt sharing its first {s} blocks (new blocks "
             f"{s_ids[s:]})")
    assert out["hashes"] == want_hash, (
        f"{where}: block_hashes {out['hashes']}, want {want_hash} (every complete block registered "
        f"under its prompt hash, the partial ones not)")
    assert out["parent"] == want_parent, (
        f"{where}: block_parent_id {out['parent']}, want {want_parent} (each complete block's parent "
        f"is the block before it in its prompt, matched, from an earlier chunk or not)")
    assert out["children"] == want_children, \
        f"{where}: block_child_count {out['children']}, want {want_children} for blocks {both}"
