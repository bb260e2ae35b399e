"""Hidden probes for vllm-0001 (KV cache groups with different block sizes).

The judge never imports vllm. Every probe draws its scenario fresh (hashes, block sizes, windows,
token ids, chunk sizes, which blocks are evicted, where the second request diverges, pool sizes,
layer shapes), runs a driver over the submission in a child process, and checks the plain data
that comes back against what the judge computes itself from the instruction's contract (hit
lengths, where each hit block sits among the first request's blocks, merged hashes, unified
block sizes, block counts) and, for the layer grouping, against the same driver over the gold
tree (``reference``)."""

import math

from infradev_probe import fresh, reference, run, same

# Reference children run as a user with no passwd entry; torch asks getpass for a user name
# when vllm is imported, which then needs one in the environment.
_ENV = {"USER": "probe", "LOGNAME": "probe"}

# Driver helpers shared by the scenarios. A hybrid KV cache config with one full-attention group
# and one sliding-window group (in the order the case says), requests hashed at the case's hash
# block size, and a manager over them.
_PRELUDE = r"""
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import BlockHash, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        SlidingWindowSpec)
from vllm.v1.request import Request

init_none_hash(sha256)


def hybrid(case):
    groups = [
        KVCacheGroupSpec(["full"], FullAttentionSpec(case["full"], 1, 1, torch.float32)),
        KVCacheGroupSpec(["sw"], SlidingWindowSpec(case["sw"], 1, 1, torch.float32,
                                                   sliding_window=case["window"])),
    ]
    if case["sw_first"]:
        groups.reverse()
    return KVCacheConfig(num_blocks=case["num_blocks"], kv_cache_tensors=[], kv_cache_groups=groups)


def order(cfg):
    return [g.layer_names[0] for g in cfg.kv_cache_groups]


def request(rid, tokens, hash_block_size):
    return Request(request_id=rid, prompt_token_ids=[int(t) for t in tokens],
                   sampling_params=SamplingParams(max_tokens=100000), pooling_params=None,
                   eos_token_id=None,
                   block_hasher=get_request_block_hasher(hash_block_size, sha256))


def manager(case):
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    cfg = hybrid(case)
    m = KVCacheManager(kv_cache_config=cfg, max_model_len=1 << 16,
                       hash_block_size=case["hash"], enable_caching=True)
    return m, order(cfg)


def by_group(names, blocks):
    return {n: [int(b) for b in ids] for n, ids in zip(names, blocks.get_block_ids())}


def prefill_then_hit(m, names, case):
    # Request a: its prompt in chunks, then decode steps of one token; request b: a prefix of
    # a's tokens and tokens of its own. Returns a's blocks (in allocation order), b's hit and
    # the free blocks once both are freed.
    a = request("a", case["prompt"], case["hash"])
    ids = {n: [] for n in names}
    for n in case["chunks"]:
        new = m.allocate_slots(a, n)
        assert new is not None, "allocate_slots refused a chunk"
        for g, got in by_group(names, new).items():
            ids[g] += got
        a.num_computed_tokens += n
    for t in case["decode"]:
        a.append_output_token_ids(int(t))
        new = m.allocate_slots(a, 1)
        assert new is not None, "allocate_slots refused a decode step"
        for g, got in by_group(names, new).items():
            ids[g] += got
        a.num_computed_tokens += 1
    b = request("b", case["b_tokens"], case["hash"])
    computed, hit = m.get_computed_blocks(b)
    hit_ids = by_group(names, computed)
    new = m.allocate_slots(b, len(case["b_tokens"]) - hit, hit, computed)
    assert new is not None, "allocate_slots refused the second request"
    m.free(a)
    m.free(b)
    return {"ids": ids, "hit": int(hit), "hit_ids": hit_ids,
            "free_after": int(m.block_pool.get_num_free_blocks())}
"""

_VIEW = _PRELUDE + r"""
from vllm.v1.core.kv_cache_utils import BlockHashListWithBlockSize


def show(x):
    return bytes(x).hex() if isinstance(x, bytes) else "not bytes: " + type(x).__name__


rows = []
for c in ARGS["cases"]:
    hashes = [BlockHash(bytes.fromhex(h)) for h in ARGS["hashes"][:c["n"]]]
    v = BlockHashListWithBlockSize(hashes, c["hash"], c["hash"] * c["ratio"])
    out = {"len": len(v), "items": [show(v[i]) for i in c["index"]], "iter": [show(x) for x in v]}
    slices = []
    for s in c["slices"]:
        got = v[slice(*s)]
        slices.append([show(x) for x in got] if type(got) is list else "not a list: " + type(got).__name__)
    out["slices"] = slices
    rows.append(out)
emit(rows=rows)
"""

_CHUNKED = _PRELUDE + r"""
rows = []
for case in ARGS["cases"]:
    m, names = manager(case)
    rows.append(prefill_then_hit(m, names, case))
emit(rows=rows)
"""

_ALIGN = _PRELUDE + r"""
rows = []
for case in ARGS["cases"]:
    m, names = manager(case)
    a = request("a", case["prompt"], case["hash"])
    new = m.allocate_slots(a, len(case["prompt"]))
    assert new is not None
    ids = by_group(names, new)
    pool = m.block_pool
    for g in names:
        for idx in case["evict"][g]:
            blk = pool.blocks[ids[g][idx]]
            pool.cached_block_hash_to_block.pop(blk.block_hash, blk.block_id)
    b = request("b", case["b_tokens"], case["hash"])
    computed, hit = m.get_computed_blocks(b)
    rows.append({"ids": ids, "hit": int(hit), "hit_ids": by_group(names, computed)})
emit(rows=rows)
"""

_GROUPS = r"""
import types

import torch
from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

ns = types.SimpleNamespace
cfg = ns(scheduler_config=ns(disable_hybrid_kv_cache_manager=False),
         cache_config=ns(num_gpu_blocks_override=None))
rows = []
for case in ARGS["cases"]:
    specs = {}
    for name, kind, heads, head_size in case["layers"]:
        if kind == "full":
            specs[name] = FullAttentionSpec(case["block_size"], heads, head_size, torch.float16)
        else:
            specs[name] = SlidingWindowSpec(case["block_size"], heads, head_size, torch.float16,
                                            sliding_window=case["window"])
    try:
        gs = get_kv_cache_groups(cfg, specs)
    except Exception as e:
        rows.append({"error": type(e).__name__})
        continue
    conf = get_kv_cache_config_from_groups(cfg, gs, case["memory"])
    rows.append({
        "groups": [{
            "layers": [str(n) for n in g.layer_names],
            "kind": type(g.kv_cache_spec).__name__,
            "block_size": int(g.kv_cache_spec.block_size),
            "heads": int(g.kv_cache_spec.num_kv_heads),
            "head_size": int(g.kv_cache_spec.head_size),
            "window": getattr(g.kv_cache_spec, "sliding_window", None),
            "page": int(g.kv_cache_spec.page_size_bytes),
        } for g in gs],
        "num_blocks": int(conf.num_blocks),
        "tensors": [[int(t.size), [str(n) for n in t.shared_by]] for t in conf.kv_cache_tensors],
    })
emit(rows=rows)
"""

_SCHEDULER = _PRELUDE + r"""
import types

from vllm.v1.core.sched.scheduler import Scheduler

ns = types.SimpleNamespace
rows = []
for case in ARGS["cases"]:
    vcfg = ns(
        scheduler_config=ns(max_num_seqs=8, max_num_batched_tokens=8192, policy="fcfs",
                            disable_hybrid_kv_cache_manager=False),
        cache_config=ns(num_gpu_blocks=case["num_blocks"], enable_prefix_caching=True,
                        num_gpu_blocks_override=None),
        lora_config=None, kv_events_config=None, kv_transfer_config=None,
        ec_transfer_config=None, speculative_config=None,
        parallel_config=ns(decode_context_parallel_size=1, prefill_context_parallel_size=1,
                           data_parallel_rank=0, pipeline_parallel_size=1),
        model_config=ns(is_encoder_decoder=False, max_model_len=1 << 16,
                        is_multimodal_model=False),
    )
    cfg = hybrid(case)
    s = Scheduler(vllm_config=vcfg, kv_cache_config=cfg, structured_output_manager=None,
                  block_size=case["hash"])
    rows.append(prefill_then_hit(s.kv_cache_manager, order(cfg), case))
emit(rows=rows)
"""


def _cdiv(a, b):
    return -(-a // b)


# ---- the judge's own model of the contract ----

def _ref_hit(case, cached, max_len):
    """The largest hit the instruction allows: a multiple of lcm(F, O), at most max_len, with
    every full-attention block before it and the sliding window's blocks before it cached."""
    full, sw = case["full"], case["sw"]
    step = math.lcm(full, sw)
    need = _cdiv(case["window"] - 1, sw)
    hit = max_len // step * step
    while hit > 0:
        if all(i in cached["full"] for i in range(hit // full)) and all(
                i in cached["sw"] for i in range(max(0, hit // sw - need), hit // sw)):
            break
        hit -= step
    return hit


def _ref_positions(case, hit):
    """Where each returned block sits among the first request's blocks of its group (-1: the
    null block): the full-attention prefix, and the sliding window with null blocks before it."""
    need = _cdiv(case["window"] - 1, case["sw"])
    n = hit // case["sw"]
    return {"full": list(range(hit // case["full"])),
            "sw": [-1 if i < n - need else i for i in range(n)]}


def _positions(r):
    """The hit blocks of a child's row, as positions among that child's first-request blocks."""
    out = {}
    for g, hit_ids in r["hit_ids"].items():
        last = {b: i for i, b in enumerate(r["ids"].get(g, []))}
        out[g] = [-1 if b == 0 else last.get(b, -2) for b in hit_ids]
    return out


def _block_sizes(rng, unit, max_lcm=12):
    """Two block sizes, multiples of unit, not both unit, with a small lcm: either larger, one
    dividing the other or neither."""
    while True:
        kf, ko = (int(x) for x in rng.integers(1, 7, size=2))
        if (kf, ko) != (1, 1) and math.lcm(kf, ko) <= max_lcm:
            return unit * kf, unit * ko


def _chunks(rng, total):
    """A random split of total tokens into at least three chunks."""
    out, left = [], total
    top = max(2, total // 3)
    while left > 0:
        n = min(left, int(rng.integers(1, top + 1)))
        out.append(n)
        left -= n
    return out


def _tokens(rng, n, lo=0, hi=30000):
    return [int(t) for t in rng.integers(lo, hi, size=n)]


def _chunked_case(rng, unit, full=None, sw=None):
    if full is None:
        full, sw = _block_sizes(rng, unit)
    prompt = int(rng.integers(3 * max(full, sw), 3 * max(full, sw) + 260))
    decode = int(rng.integers(math.lcm(full, sw), math.lcm(full, sw) + 60))
    a_tokens = _tokens(rng, prompt + decode)
    total = prompt + decode
    cut = int(rng.integers(total // 2, total + 1))
    extra = int(rng.integers(0, 12))
    return {
        "hash": unit, "full": full, "sw": sw, "sw_first": bool(rng.integers(2)),
        "window": int(rng.integers(2, 4 * max(full, sw) + 2)),
        "num_blocks": 4 * (total // unit) + int(rng.integers(64, 200)),
        "prompt": a_tokens[:prompt], "chunks": _chunks(rng, prompt), "decode": a_tokens[prompt:],
        "b_tokens": a_tokens[:cut] + _tokens(rng, extra, 30000, 32000), "cut": cut,
    }


def _check_chunked(case, r, where):
    total = len(case["prompt"]) + len(case["decode"])
    # Every full block of a (its prompt and its decoded tokens) is cached; b shares a's first
    # `cut` tokens and then differs, so its blocks up to `cut` are the cached ones.
    shared = min(case["cut"], total)
    cached = {"full": set(range(shared // case["full"])), "sw": set(range(shared // case["sw"]))}
    want = _ref_hit(case, cached, len(case["b_tokens"]) - 1)
    assert r["hit"] == want, f"{where}: the second request hits {r['hit']} tokens, want {want}"
    got = _positions(r)
    want_pos = _ref_positions(case, want)
    assert got == want_pos, (
        f"{where}: the hit blocks are not the first request's blocks at the positions the hit "
        f"covers (positions {got}, want {want_pos}; -1 is the null block, -2 a block the first "
        f"request never got)")
    assert r["free_after"] == case["num_blocks"] - 1, (
        f"{where}: after freeing both requests {r['free_after']} of {case['num_blocks']} blocks "
        f"are free, want {case['num_blocks'] - 1} (all but the null block)")


def _describe(case):
    order = "sliding window first" if case["sw_first"] else "full attention first"
    return (f"hash block size {case['hash']}, full attention block {case['full']}, sliding window "
            f"{case['window']} with block {case['sw']} ({order})")


# ---- probes ----

def test_merged_block_hashes():
    rng = fresh()
    n_hashes = int(rng.integers(20, 48))
    hashes = [rng.bytes(int(rng.integers(4, 41))).hex() for _ in range(n_hashes)]
    cases = []
    for _ in range(8):
        n = int(rng.integers(1, n_hashes + 1))
        ratio = int(rng.integers(1, 7))
        k = n // ratio
        slices = []
        for _ in range(10):
            def bound():
                return None if rng.random() < 0.25 else int(rng.integers(-k - 3, k + 4))
            step = None if rng.random() < 0.3 else int(rng.choice([-3, -2, -1, 1, 2, 3]))
            slices.append([bound(), bound(), step])
        index = [int(i) for i in rng.permutation(k)[:6]] if k else []
        cases.append({"n": n, "ratio": ratio, "hash": int(rng.choice([1, 4, 8, 16, 32])),
                      "index": index, "slices": slices})
    got = run(_VIEW, {"hashes": hashes, "cases": cases})
    assert len(got["rows"]) == len(cases), "the driver returned a row per case"
    for c, r in zip(cases, got["rows"]):
        n, ratio = c["n"], c["ratio"]
        want = ["".join(hashes[i * ratio:(i + 1) * ratio]) for i in range(n // ratio)]
        where = (f"{n} hashes at block size {c['hash']} viewed at block size "
                 f"{c['hash'] * ratio}")
        assert r["len"] == len(want), f"{where}: len {r['len']}, want {len(want)}"
        assert r["items"] == [want[i] for i in c["index"]], (
            f"{where}: view[i] is not the concatenation of hashes i*{ratio} .. i*{ratio}+{ratio - 1}")
        assert r["iter"] == want, f"{where}: iterating does not yield view[0], view[1], ..."
        for s, g in zip(c["slices"], r["slices"]):
            assert g == want[slice(*s)], f"{where}: view[slice{tuple(s)}] is {g}, want {want[slice(*s)]}"


def test_incremental_caching_keys_whole_blocks():
    rng = fresh()
    unit = int(rng.choice([8, 16]))
    cases = [_chunked_case(rng, unit) for _ in range(4)]
    got = run(_CHUNKED, {"cases": cases})
    assert len(got["rows"]) == len(cases), "the driver returned a row per case"
    for case, r in zip(cases, got["rows"]):
        where = (f"{_describe(case)}: {len(case['prompt'])}-token prompt in chunks "
                 f"{case['chunks']} + {len(case['decode'])} decode steps, second request shares "
                 f"{case['cut']} tokens")
        _check_chunked(case, r, where)


def _align_case(rng, unit):
    full, sw = _block_sizes(rng, unit)
    step = math.lcm(full, sw)
    n = int(rng.integers(2 * step, min(10 * step, 1600) + 1))
    tokens = _tokens(rng, n)
    window = int(rng.integers(2, 4 * max(full, sw) + 2))
    need = _cdiv(window - 1, sw)
    nf, nsw = n // full, n // sw
    cut = n if rng.random() < 0.35 else int(rng.integers(step, n + 1))
    extra = int(rng.integers(0, 10))
    evict = {"full": set(), "sw": set()}
    how = int(rng.choice([0, 1, 1, 2, 3, 4, 4]))
    top = min(cut, n) // sw
    if how == 4:  # the block that ends the last aligned boundary, and maybe one more
        end = (min(cut, n, cut + extra - 1) // step * step) // sw
        if end:
            evict["sw"].add(end - 1)
        if end > 1 and rng.random() < 0.5:
            evict["sw"].add(int(rng.integers(end - 1)))
    elif how == 1:  # a few sliding-window blocks near the end of the shared prefix
        span = list(range(max(0, top - need - 2 * step // sw), top))
        if span:
            for i in rng.choice(span, size=min(len(span), int(rng.integers(1, 4))), replace=False):
                evict["sw"].add(int(i))
    elif how == 2:  # scattered sliding-window blocks
        p = float(rng.uniform(0.1, 0.4))
        evict["sw"] = {i for i in range(nsw) if rng.random() < p}
    elif how == 3:  # a full-attention block, and maybe a sliding-window one
        if nf:
            evict["full"].add(int(rng.integers(nf)))
        if nsw and rng.random() < 0.5:
            evict["sw"].add(int(rng.integers(nsw)))
    return {
        "hash": unit, "full": full, "sw": sw, "sw_first": bool(rng.integers(2)), "window": window,
        "num_blocks": 4 * (n // unit) + int(rng.integers(64, 200)),
        "prompt": tokens, "b_tokens": tokens[:cut] + _tokens(rng, extra, 30000, 32000), "cut": cut,
        "evict": {g: sorted(v) for g, v in evict.items()},
    }


def test_hybrid_hit_is_aligned_and_keeps_its_window():
    rng = fresh()
    unit = int(rng.choice([8, 16]))
    cases = [_align_case(rng, unit) for _ in range(36)]
    got = run(_ALIGN, {"cases": cases})
    assert len(got["rows"]) == len(cases), "the driver returned a row per case"
    bad = []
    for case, r in zip(cases, got["rows"]):
        n = len(case["prompt"])
        shared = min(case["cut"], n)
        cached = {g: {i for i in range(shared // case[g]) if i < n // case[g]} - set(case["evict"][g])
                  for g in ("full", "sw")}
        want = _ref_hit(case, cached, len(case["b_tokens"]) - 1)
        want_pos = _ref_positions(case, want)
        got_pos = _positions(r)
        if r["hit"] != want or got_pos != want_pos:
            bad.append(f"{_describe(case)}, {n} cached tokens, evicted {case['evict']}, second "
                       f"request shares {case['cut']} of {len(case['b_tokens'])} tokens: hit "
                       f"{r['hit']} at positions {got_pos}, want {want} at {want_pos}")
    assert not bad, f"{len(bad)} of {len(cases)} wrong hits (-1 is the null block):\n" + "\n".join(bad[:6])


def _page(heads, head_size, block_size):
    return 2 * block_size * heads * head_size * 2  # K and V, float16


def _group_case(rng, want):
    """Layers of both kinds with random shapes; want: 'full-smaller', 'sw-smaller', 'apart'
    (pages that do not divide) or 'any'."""
    block_size = int(rng.choice([8, 16, 32]))
    while True:
        n = int(rng.integers(2, 9))
        kinds = ["full", "sw"] + [str(rng.choice(["full", "sw"])) for _ in range(n - 2)]
        kinds = [kinds[i] for i in rng.permutation(n)]
        shapes = {"full": (int(rng.choice([1, 2, 4, 8])), int(rng.choice([32, 64, 96, 128, 192, 256]))),
                  "sw": (int(rng.choice([1, 2, 4, 8])), int(rng.choice([32, 64, 96, 128, 192, 256])))}
        # Now and then a layer of its own shape.
        layers = []
        for i, kind in enumerate(kinds):
            heads, head_size = shapes[kind]
            if rng.random() < 0.15:
                heads = int(rng.choice([1, 2, 4, 8]))
            layers.append([f"model.layers.{i}.attn", kind, heads, head_size])
        pages = [_page(h, s, block_size) for _, _, h, s in layers]
        top = max(pages)
        apart = any(top % p for p in pages)
        full_small = any(p < top for (_, k, _, _), p in zip(layers, pages) if k == "full")
        sw_small = any(p < top for (_, k, _, _), p in zip(layers, pages) if k == "sw")
        ok = {"apart": apart, "full-smaller": not apart and full_small,
              "sw-smaller": not apart and sw_small and not full_small, "any": True}[want]
        if ok:
            break
    return {"layers": layers, "block_size": block_size, "window": int(rng.integers(17, 4097)),
            "memory": int(rng.integers(1 << 22, 1 << 28))}


def test_page_sizes_unified_by_block_size():
    rng = fresh()
    kinds = ["full-smaller", "full-smaller", "sw-smaller", "apart", "any", "any", "any"]
    cases = [_group_case(rng, kinds[i]) for i in rng.permutation(len(kinds))]
    args = {"cases": cases}
    got = run(_GROUPS, args, env=_ENV)
    assert len(got["rows"]) == len(cases), "the driver returned a row per case"
    for case, r in zip(cases, got["rows"]):
        bs = case["block_size"]
        layers = {name: (kind, heads, hs) for name, kind, heads, hs in case["layers"]}
        pages = {name: _page(h, s, bs) for name, (_, h, s) in layers.items()}
        top = max(pages.values())
        where = f"block size {bs}, layers " + ", ".join(
            f"{n} ({k}, {h} heads of {s})" for n, (k, h, s) in layers.items())
        if any(top % p for p in pages.values()):
            assert r.get("error") == "NotImplementedError", (
                f"{where}: pages cannot be unified, want NotImplementedError, got {r}")
            continue
        assert "error" not in r, f"{where}: raised {r.get('error')}"
        seen = {}
        for g in r["groups"]:
            assert g["page"] == top, f"{where}: group {g['layers']} has page {g['page']}, want {top}"
            for name in g["layers"]:
                assert name in layers, f"{where}: group {g['layers']} holds an unknown layer {name}"
                kind, heads, hs = layers[name]
                want = ("FullAttentionSpec" if kind == "full" else "SlidingWindowSpec",
                        bs * (top // pages[name]), heads, hs,
                        None if kind == "full" else case["window"])
                have = (g["kind"], g["block_size"], g["heads"], g["head_size"], g["window"])
                assert have == want, f"{where}: layer {name} has spec {have}, want {want}"
                seen[name] = seen.get(name, 0) + 1
        assert seen == {name: 1 for name in layers}, f"{where}: layers not grouped once each: {seen}"
        group_len = max(len(g["layers"]) for g in r["groups"])
        want_blocks = case["memory"] // top // group_len
        assert r["num_blocks"] == want_blocks, f"{where}: {r['num_blocks']} blocks, want {want_blocks}"
        assert [t[0] for t in r["tensors"]] == [top * want_blocks] * group_len, (
            f"{where}: tensor sizes {[t[0] for t in r['tensors']]}, want {group_len} of {top * want_blocks}")
    # The grouping itself (which layers share a group, the tensors' sharing) is the existing
    # equal-page grouping over the unified specs: the same as gold's on these layers.
    same(got, reference(_GROUPS, args, env=_ENV))


def test_scheduler_hashes_at_its_block_size():
    rng = fresh()
    unit = int(rng.choice([8, 16, 32]))
    cases = []
    for i in range(3):
        while True:
            full, sw = _block_sizes(rng, unit, max_lcm=6)
            case = _chunked_case(rng, unit, full, sw)
            first = case["sw"] if case["sw_first"] else case["full"]
            # The first case's first group has the larger block size.
            if i > 0 or first > min(full, sw):
                break
        cases.append(case)
    got = run(_SCHEDULER, {"cases": cases})
    assert len(got["rows"]) == len(cases), "the driver returned a row per case"
    for case, r in zip(cases, got["rows"]):
        where = (f"Scheduler(block_size={unit}) over {_describe(case)}: "
                 f"{len(case['prompt'])}-token prompt in chunks {case['chunks']} + "
                 f"{len(case['decode'])} decode steps, second request shares {case['cut']} tokens")
        _check_chunked(case, r, where)
