"""Hidden probes for vllm-0001 (KV cache groups with different block sizes).

The judge never imports vllm. One child process drives the V1 KV cache code through every
scenario (each in its own try block, so one failing scenario does not hide the others) and
sends back plain data: hashes as hex, block ids, hit lengths, group layouts. Each probe checks
its scenario against references the judge computes itself from the instruction's contract."""

import functools
import hashlib
import math

from infradev_probe import run

_DRIVER = r"""
import traceback
import types

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import BlockHash, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        SlidingWindowSpec)
from vllm.v1.request import Request

init_none_hash(sha256)
HASH = 16
ns = types.SimpleNamespace


def hybrid(full_bs, sw_bs, window, num_blocks):
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["full"], FullAttentionSpec(full_bs, 1, 1, torch.float32)),
        KVCacheGroupSpec(["sw"], SlidingWindowSpec(sw_bs, 1, 1, torch.float32,
                                                   sliding_window=window)),
    ])


def request(rid, tokens):
    return Request(request_id=rid, prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=1000), pooling_params=None,
                   eos_token_id=None, block_hasher=get_request_block_hasher(HASH, sha256))


def manager(cfg):
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    return KVCacheManager(kv_cache_config=cfg, max_model_len=8192, hash_block_size=HASH,
                          enable_caching=True)


def add_ids(acc, blocks):
    for g, ids in zip(acc, blocks.get_block_ids()):
        g.extend(ids)


def view(args):
    from vllm.v1.core.kv_cache_utils import BlockHashListWithBlockSize
    hashes = [BlockHash(bytes.fromhex(h)) for h in args["hashes"]]
    rows = []
    for n, ratio in args["cases"]:
        v = BlockHashListWithBlockSize(hashes[:n], HASH, HASH * ratio)
        k = len(v)
        items = [v[i] for i in range(min(k, n))]
        rows.append({
            "n": n, "ratio": ratio, "len": k,
            "items": [bytes(x).hex() for x in items],
            "bytes": all(isinstance(x, bytes) for x in items),
            "iter": [bytes(x).hex() for x in v],
            "slices": [[bytes(x).hex() for x in v[slice(*s)]] for s in args["slices"]],
            "slice_is_list": isinstance(v[0:k], list),
        })
    return rows


def prefill_then_hit(m, case):
    prompt, chunk, decode = case["prompt"], case["chunk"], case["decode"]
    free0 = m.block_pool.get_num_free_blocks()
    a = request("a", range(1000, 1000 + prompt))
    ids = ([], [])
    done = 0
    while done < prompt:
        n = min(chunk, prompt - done)
        new = m.allocate_slots(a, n)
        assert new is not None, "allocate_slots refused a chunk"
        add_ids(ids, new)
        a.num_computed_tokens += n
        done += n
    for step in range(decode):
        a.append_output_token_ids(5000 + step)
        new = m.allocate_slots(a, 1)
        assert new is not None, "allocate_slots refused a decode step"
        add_ids(ids, new)
        a.num_computed_tokens += 1
    b_tokens = list(a.all_token_ids) + [7, 7, 7]
    b = request("b", b_tokens)
    computed, hit = m.get_computed_blocks(b)
    hit_ids = [list(x) for x in computed.get_block_ids()]
    new = m.allocate_slots(b, len(b_tokens) - hit, hit, computed)
    assert new is not None, "allocate_slots refused the second request"
    m.free(a)
    m.free(b)
    return {"ids": ids, "hit": hit, "hit_ids": hit_ids, "b_len": len(b_tokens),
            "free_before": free0, "free_after": m.block_pool.get_num_free_blocks()}


def chunked(args):
    rows = []
    for case in args["cases"]:
        m = manager(hybrid(case["full"], case["sw"], case["window"], 600))
        rows.append(prefill_then_hit(m, case))
    return rows


def align(args):
    rows = []
    for case in args["cases"]:
        m = manager(hybrid(case["full"], case["sw"], case["window"], 300))
        n = case["blocks16"] * 16
        a = request("a", range(2000, 2000 + n))
        new = m.allocate_slots(a, n)
        assert new is not None
        ids = [list(x) for x in new.get_block_ids()]
        pool = m.block_pool
        for g, evict in ((0, case["evict_full"]), (1, case["evict_sw"])):
            for idx in evict:
                blk = pool.blocks[ids[g][idx]]
                pool.cached_block_hash_to_block.pop(blk.block_hash, blk.block_id)
        b_tokens = list(a.all_token_ids)[:case["b_len"]]
        b_tokens += [9] * (case["b_len"] - len(b_tokens))
        b = request("b", b_tokens)
        computed, hit = m.get_computed_blocks(b)
        rows.append({"ids": ids, "hit": hit,
                     "hit_ids": [list(x) for x in computed.get_block_ids()]})
    return rows


def make_spec(kind, head, block_size=16):
    if kind == "full":
        return FullAttentionSpec(block_size, 2, head, torch.float16)
    return SlidingWindowSpec(block_size, 2, head, torch.float16, sliding_window=128)


def groups(args):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups, get_kv_cache_groups
    cfg = ns(scheduler_config=ns(disable_hybrid_kv_cache_manager=False),
             cache_config=ns(num_gpu_blocks_override=None))
    rows = []
    for case in args["cases"]:
        specs = {name: make_spec(kind, head) for name, kind, head in case["layers"]}
        try:
            gs = get_kv_cache_groups(cfg, specs)
        except Exception as e:
            rows.append({"error": type(e).__name__})
            continue
        conf = get_kv_cache_config_from_groups(cfg, gs, case["memory"])
        rows.append({
            "groups": [{
                "layers": list(g.layer_names),
                "kind": type(g.kv_cache_spec).__name__,
                "block_size": g.kv_cache_spec.block_size,
                "heads": g.kv_cache_spec.num_kv_heads,
                "head_size": g.kv_cache_spec.head_size,
                "window": getattr(g.kv_cache_spec, "sliding_window", None),
                "page": g.kv_cache_spec.page_size_bytes,
            } for g in gs],
            "num_blocks": conf.num_blocks,
            "tensors": [[t.size, list(t.shared_by)] for t in conf.kv_cache_tensors],
        })
    return rows


def scheduler(args):
    from vllm.v1.core.sched.scheduler import Scheduler
    rows = []
    for case in args["cases"]:
        vcfg = ns(
            scheduler_config=ns(max_num_seqs=8, max_num_batched_tokens=4096, policy="fcfs",
                                disable_hybrid_kv_cache_manager=False),
            cache_config=ns(num_gpu_blocks=600, enable_prefix_caching=True,
                            num_gpu_blocks_override=None),
            lora_config=None, kv_events_config=None, kv_transfer_config=None,
            ec_transfer_config=None, speculative_config=None,
            parallel_config=ns(decode_context_parallel_size=1,
                               prefill_context_parallel_size=1, data_parallel_rank=0,
                               pipeline_parallel_size=1),
            model_config=ns(is_encoder_decoder=False, max_model_len=8192,
                            is_multimodal_model=False),
        )
        s = Scheduler(vllm_config=vcfg,
                      kv_cache_config=hybrid(case["full"], case["sw"], case["window"], 600),
                      structured_output_manager=None, block_size=HASH)
        rows.append(prefill_then_hit(s.kv_cache_manager, case))
    return rows


results = {}
for name in ("view", "chunked", "align", "groups", "scheduler"):
    try:
        results[name] = {"ok": True, "value": globals()[name](ARGS[name])}
    except Exception:
        results[name] = {"ok": False, "error": traceback.format_exc()}
emit(**results)
"""


def _cdiv(a, b):
    return -(-a // b)


def _hashes(n):
    # Hashes of different lengths, so a wrong split or join shows.
    return [hashlib.sha256(b"h%d" % i).digest()[: 8 + (i % 5) * 6].hex() for i in range(n)]


_SLICES = [[None, None, None], [1, None, None], [None, -1, None], [None, None, 2],
           [1, 3, None], [-2, None, None], [None, None, -1], [5, 1, -2], [0, 100, None]]

_CHUNKED = [
    {"full": 32, "sw": 16, "window": 32, "prompt": 150, "chunk": 40, "decode": 45},
    {"full": 16, "sw": 32, "window": 64, "prompt": 170, "chunk": 24, "decode": 37},
    {"full": 48, "sw": 16, "window": 40, "prompt": 200, "chunk": 56, "decode": 50},
    {"full": 32, "sw": 16, "window": 48, "prompt": 99, "chunk": 7, "decode": 70},
]


def _align_cases():
    cases = []
    for full, sw, window in ((32, 16, 32), (32, 16, 64), (16, 32, 64), (64, 16, 33), (16, 48, 90)):
        nf, ns_ = 12 * 16 // full, 12 * 16 // sw
        patterns = [([], []), ([], [ns_ - 1]), ([], [ns_ - 2]), ([], [ns_ - 1, ns_ - 4]),
                    ([nf - 1], []), ([], [1]), ([], [ns_ - 3]), ([nf - 2], [ns_ - 5]),
                    ([], [ns_ - 1, ns_ - 2, ns_ - 3]), ([], list(range(1, ns_, 2)))]
        for evict_full, evict_sw in patterns:
            evict_full = [i for i in evict_full if 0 <= i < nf]
            evict_sw = [i for i in evict_sw if 0 <= i < ns_]
            for b_len in (12 * 16 + 5, 12 * 16, 8 * 16 + 3):
                cases.append({"full": full, "sw": sw, "window": window, "blocks16": 12,
                              "evict_full": evict_full, "evict_sw": evict_sw, "b_len": b_len})
    return cases


def _group_cases():
    m = 1 << 24
    return [
        {"layers": [["f0", "full", 64], ["s0", "sw", 32]], "memory": m},
        {"layers": [["f0", "full", 32], ["s0", "sw", 128]], "memory": m},
        {"layers": [["f0", "full", 64], ["f1", "full", 64], ["s0", "sw", 16], ["s1", "sw", 16]],
         "memory": m},
        {"layers": [["f0", "full", 64], ["s0", "sw", 64]], "memory": m},
        {"layers": [["f0", "full", 64], ["s0", "sw", 96]], "memory": m},
        {"layers": [["f0", "full", 48], ["s0", "sw", 96], ["s1", "sw", 96]], "memory": 3 * m},
    ]


_ARGS = {
    "view": {"hashes": _hashes(13), "cases": [[13, 1], [13, 2], [12, 3], [13, 4], [7, 2], [3, 4]],
             "slices": _SLICES},
    "chunked": {"cases": _CHUNKED},
    "align": {"cases": _align_cases()},
    "groups": {"cases": _group_cases()},
    "scheduler": {"cases": [_CHUNKED[0], _CHUNKED[1]]},
}


@functools.lru_cache(maxsize=None)
def _results():
    return run(_DRIVER, _ARGS)


def _scenario(name):
    r = _results()[name]
    if not r["ok"]:
        raise AssertionError("the code under test raised:\n" + r["error"][-6000:])
    return r["value"]


def _ref_hit(full, sw, window, cached_full, cached_sw, max_len):
    """The largest hit the instruction allows, and the block ids it returns per group."""
    step = math.lcm(full, sw)
    need = _cdiv(window - 1, sw)
    hit = max_len // step * step
    while hit > 0:
        if all(i in cached_full for i in range(hit // full)) and all(
                i in cached_sw for i in range(max(0, hit // sw - need), hit // sw)):
            break
        hit -= step
    return hit


def _ref_ids(hit, full, sw, window, full_ids, sw_ids):
    need = _cdiv(window - 1, sw)
    n = hit // sw
    return [list(full_ids[: hit // full]), [0 if i < n - need else sw_ids[i] for i in range(n)]]


def test_merged_block_hashes():
    hashes = _ARGS["view"]["hashes"]
    for r in _scenario("view"):
        n, ratio = r["n"], r["ratio"]
        want = ["".join(hashes[i * ratio:(i + 1) * ratio]) for i in range(n // ratio)]
        where = f"{n} hashes at block size 16 viewed at block size {16 * ratio}"
        assert r["len"] == len(want), f"{where}: len {r['len']}, want {len(want)}"
        assert r["items"] == want, f"{where}: view[i] is not the concatenation of its {ratio} hashes"
        assert r["bytes"], f"{where}: items are not bytes"
        assert r["iter"] == want, f"{where}: iteration differs from indexing"
        assert r["slice_is_list"], f"{where}: a slice did not return a list"
        for s, got in zip(_ARGS["view"]["slices"], r["slices"]):
            assert got == want[slice(*s)], f"{where}: view[slice{tuple(s)}] wrong"


def test_incremental_caching_keys_whole_blocks():
    # A request prefilled in chunks and then decoded token by token caches every full block
    # of both groups under the hashes of exactly its own tokens: a second request with the same
    # tokens hits all of them (aligned to the lcm) and gets the first request's blocks.
    for case, r in zip(_ARGS["chunked"]["cases"], _scenario("chunked")):
        full, sw, window = case["full"], case["sw"], case["window"]
        total = case["prompt"] + case["decode"]
        full_ids, sw_ids = r["ids"]
        assert len(full_ids) >= total // full and len(sw_ids) >= total // sw
        want = _ref_hit(full, sw, window, set(range(total // full)), set(range(total // sw)),
                        r["b_len"] - 1)
        where = (f"full attention block {full}, sliding window {window} with block {sw}, "
                 f"{case['prompt']}-token prompt in chunks of {case['chunk']} + "
                 f"{case['decode']} decode steps")
        assert r["hit"] == want, f"{where}: second request hits {r['hit']} tokens, want {want}"
        assert r["hit_ids"] == _ref_ids(want, full, sw, window, full_ids, sw_ids), (
            f"{where}: hit blocks {r['hit_ids']} are not the first request's blocks")
        assert r["free_after"] == r["free_before"], (
            f"{where}: freeing both requests left {r['free_before'] - r['free_after']} blocks held")


def test_hybrid_hit_is_aligned_and_keeps_its_window():
    bad = []
    for case, r in zip(_ARGS["align"]["cases"], _scenario("align")):
        full, sw, window = case["full"], case["sw"], case["window"]
        n = case["blocks16"] * 16
        full_ids, sw_ids = r["ids"]
        cached_full = set(range(n // full)) - set(case["evict_full"])
        cached_sw = set(range(n // sw)) - set(case["evict_sw"])
        want = _ref_hit(full, sw, window, cached_full, cached_sw, case["b_len"] - 1)
        want_ids = _ref_ids(want, full, sw, window, full_ids, sw_ids)
        if r["hit"] != want or r["hit_ids"] != want_ids:
            bad.append(f"full {full} / sliding window {window} block {sw}, evicted full "
                       f"{case['evict_full']} sw {case['evict_sw']}, {case['b_len']} tokens: "
                       f"hit {r['hit']} {r['hit_ids']}, want {want} {want_ids}")
    assert not bad, f"{len(bad)} wrong hits:\n" + "\n".join(bad[:8])


def _page(head, block_size):
    return 2 * block_size * 2 * head * 2  # K and V, 2 heads, float16


def test_page_sizes_unified_by_block_size():
    for case, r in zip(_ARGS["groups"]["cases"], _scenario("groups")):
        layers = {name: (kind, head) for name, kind, head in case["layers"]}
        pages = {name: _page(head, 16) for name, (kind, head) in layers.items()}
        top = max(pages.values())
        where = "layers " + ", ".join(f"{n} ({k}, head {h})" for n, (k, h) in layers.items())
        if any(top % p for p in pages.values()):
            assert r.get("error") == "NotImplementedError", (
                f"{where}: pages cannot be unified, want NotImplementedError, got {r}")
            continue
        assert "error" not in r, f"{where}: raised {r.get('error')}"
        seen = {}
        for g in r["groups"]:
            assert g["page"] == top, f"{where}: group {g['layers']} has page {g['page']}, want {top}"
            for name in g["layers"]:
                kind, head = layers[name]
                want_kind = "FullAttentionSpec" if kind == "full" else "SlidingWindowSpec"
                want_bs = 16 * (top // pages[name])
                got = (g["kind"], g["block_size"], g["heads"], g["head_size"], g["window"])
                want = (want_kind, want_bs, 2, head, None if kind == "full" else 128)
                assert got == want, f"{where}: layer {name} got {got}, want {want}"
                seen[name] = seen.get(name, 0) + 1
        assert seen == {name: 1 for name in layers}, f"{where}: layers not grouped once each: {seen}"
        group_len = max(len(g["layers"]) for g in r["groups"])
        want_blocks = case["memory"] // top // group_len
        assert r["num_blocks"] == want_blocks, f"{where}: {r['num_blocks']} blocks, want {want_blocks}"
        assert all(size == top * want_blocks for size, _ in r["tensors"]), (
            f"{where}: tensor sizes {r['tensors']}")


def test_scheduler_hashes_at_its_block_size():
    # A Scheduler built with block_size 16 over groups of block sizes 32 and 16 gives its KV
    # cache manager the hash block size 16: requests hashed at 16 hit the prefix cache.
    for case, r in zip(_ARGS["scheduler"]["cases"], _scenario("scheduler")):
        full, sw, window = case["full"], case["sw"], case["window"]
        total = case["prompt"] + case["decode"]
        full_ids, sw_ids = r["ids"]
        want = _ref_hit(full, sw, window, set(range(total // full)), set(range(total // sw)),
                        r["b_len"] - 1)
        where = f"scheduler block size 16, groups of block sizes {full} and {sw}"
        assert r["hit"] == want, f"{where}: second request hits {r['hit']} tokens, want {want}"
        assert r["hit_ids"] == _ref_ids(want, full, sw, window, full_ids, sw_ids)
