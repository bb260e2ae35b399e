"""Hidden probes for vllm-0002 (sliding-window attention in the V1 KV cache manager).

The judge never imports vllm. One child process drives the KV cache manager, block pool and
KV cache specs through every scenario (each in its own try block, so one failing scenario
does not hide the others) and sends back block ids (the null block as 0), free-block
counts and byte counts; each probe checks its scenario against what the judge computes from
the instruction's contract."""

import functools

from infradev_probe import run

_DRIVER = """
import traceback
import types

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        SlidingWindowSpec)
from vllm.v1.request import Request


def sw_spec(block_size, window):
    return SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32, use_mla=False, sliding_window=window)


def manager(spec, num_blocks, caching=True):
    config = KVCacheConfig(num_blocks=num_blocks, tensors={},
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return KVCacheManager(config, max_model_len=8192, enable_caching=caching,
                          num_preallocate_tokens=0)


def request(rid, tokens):
    return Request(request_id=rid, prompt=None, prompt_token_ids=list(tokens),
                   multi_modal_inputs=None, multi_modal_hashes=None,
                   multi_modal_placeholders=None,
                   sampling_params=SamplingParams(max_tokens=1000), eos_token_id=None,
                   arrival_time=0, lora_request=None)


def ids(m, blocks):
    # The null block is sent as 0; any other block as its id (a real block with id 0 is an error).
    out = []
    for b in blocks:
        if b is m.block_pool.null_block:
            out.append(0)
        else:
            out.append(-1 if b.block_id == 0 else b.block_id)
    return out


def free_ids(m):
    return [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]


def decode(args):
    rows = []
    for block_size, window, caching in args["settings"]:
        m = manager(sw_spec(block_size, window), 64, caching)
        total = m.block_pool.get_num_free_blocks()
        req = request("r", range(100, 110))
        assert m.allocate_slots(req, 10) is not None
        req.num_computed_tokens = 10
        tables, free = [ids(m, m.req_to_blocks["r"])], [m.block_pool.get_num_free_blocks()]
        for step in range(40):
            req.append_output_token_ids(500 + step)
            assert m.allocate_slots(req, 1) is not None
            req.num_computed_tokens += 1
            tables.append(ids(m, m.req_to_blocks["r"]))
            free.append(m.block_pool.get_num_free_blocks())
        m.free(req)
        rows.append({"block_size": block_size, "window": window, "caching": caching,
                     "tables": tables, "free": free, "total": total,
                     "free_after": m.block_pool.get_num_free_blocks(),
                     "free_ids_after": free_ids(m)})
    return rows


def null_block(args):
    # Prefix hits of a sliding-window request are padded with the null block; the pool must
    # never count it as free nor hand it out, however often hits touch it and frees drop it.
    m = manager(sw_spec(4, 8), 20)
    total = m.block_pool.get_num_free_blocks()
    prompt = list(range(24))
    a = request("a", prompt)
    m.allocate_slots(a, 24)
    a.num_computed_tokens = 24
    m.free(a)
    out = {"total": total, "hits": [], "free": [m.block_pool.get_num_free_blocks()]}
    live = []
    for i in range(3):
        r = request("b%d" % i, prompt + [900 + i, 901, 902])
        computed, n = m.get_computed_blocks(r)
        out["hits"].append([ids(m, computed), n])
        assert m.allocate_slots(r, 27 - n, computed) is not None
        r.num_computed_tokens = 27
        live.append(r)
        out["free"].append(m.block_pool.get_num_free_blocks())
    for r in live:
        m.free(r)
        out["free"].append(m.block_pool.get_num_free_blocks())
    out["free_ids"] = free_ids(m)
    # Take every free block: none may be the null block.
    c = request("c", range(1000, 1000 + 4 * out["free"][-1]))
    blocks = m.allocate_slots(c, 4 * out["free"][-1])
    out["c_blocks"] = None if blocks is None else ids(m, blocks)
    out["free_after_c"] = m.block_pool.get_num_free_blocks()
    m.free(c)
    out["free_end"] = m.block_pool.get_num_free_blocks()
    return out


def aligned_hit(args):
    rows = []
    for window, length in args["cases"]:
        m = manager(sw_spec(4, window), 40)
        a = request("a", range(24))
        a_blocks = ids(m, m.allocate_slots(a, 24))
        a.num_computed_tokens = 24
        b = request("b", range(length))
        computed, n = m.get_computed_blocks(b)
        rows.append({"window": window, "length": length, "a": a_blocks,
                     "hit": ids(m, computed), "tokens": n})
    return rows


def memory(args):
    rows = []
    for kind, block_size, heads, head_size, window, max_model_len, batched in args["cases"]:
        cfg = types.SimpleNamespace(
            model_config=types.SimpleNamespace(max_model_len=max_model_len),
            scheduler_config=types.SimpleNamespace(max_num_batched_tokens=batched))
        if kind == "full":
            spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads,
                                     head_size=head_size, dtype=torch.float16, use_mla=False)
        else:
            spec = SlidingWindowSpec(block_size=block_size, num_kv_heads=heads,
                                     head_size=head_size, dtype=torch.float16, use_mla=False,
                                     sliding_window=window)
        rows.append([spec.page_size_bytes, spec.max_memory_usage_bytes(cfg)])
    try:
        SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float16,
                          use_mla=True, sliding_window=128)
        mla = "accepted"
    except AssertionError:
        mla = "AssertionError"
    except Exception as e:
        mla = type(e).__name__
    type_ids = [sw_spec(16, 128).type_id, sw_spec(16, 256).type_id,
                FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1,
                                  dtype=torch.float32, use_mla=False).type_id]
    return {"rows": rows, "mla": mla, "type_ids": type_ids}


def unify(args):
    from vllm.v1.core.kv_cache_utils import unify_hybrid_kv_cache_specs

    def full(bs):
        return FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=8,
                                 dtype=torch.float16, use_mla=False)

    def sw(bs, w):
        return SlidingWindowSpec(block_size=bs, num_kv_heads=2, head_size=8,
                                 dtype=torch.float16, use_mla=False, sliding_window=w)

    def describe(specs):
        out = {}
        for name, s in specs.items():
            out[name] = [type(s).__name__, s.block_size, s.num_kv_heads, s.head_size,
                         str(s.dtype), s.use_mla, getattr(s, "sliding_window", None)]
        return out

    cases = {
        "mixed": {"a": full(16), "b": sw(16, 128), "c": sw(16, 256)},
        "sliding_only": {"a": sw(16, 128), "b": sw(16, 128)},
        "full_only": {"a": full(16), "b": full(16)},
    }
    result = {}
    for name, specs in cases.items():
        ret = unify_hybrid_kv_cache_specs(specs)
        result[name] = {"specs": describe(specs), "returned_none": ret is None or ret is specs}
    return result


results = {}
for name in ("decode", "null_block", "aligned_hit", "memory", "unify"):
    try:
        results[name] = {"ok": True, "value": globals()[name](ARGS.get(name, {}))}
    except Exception:
        results[name] = {"ok": False, "error": traceback.format_exc()}
emit(**results)
"""

_ARGS = {
    "decode": {"settings": [[4, 8, True], [4, 10, False], [2, 5, True], [4, 17, True], [4, 6, False]]},
    "aligned_hit": {"cases": [[8, 24], [13, 24], [8, 26], [13, 27], [8, 20]]},
    "memory": {"cases": [
        ["sliding", 16, 8, 128, 4096, 32768, 2048],
        ["sliding", 16, 8, 128, 4096, 5000, 2048],
        ["sliding", 32, 2, 64, 1000, 131072, 8192],
        ["sliding", 16, 4, 64, 17, 4096, 16],
        ["full", 16, 8, 128, None, 32768, 2048],
        ["full", 16, 8, 128, None, 1000, 2048],
    ]},
}


def _cdiv(a, b):
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _results():
    return run(_DRIVER, _ARGS)


def _scenario(name):
    r = _results()[name]
    if not r["ok"]:
        raise AssertionError("the code under test raised:\n" + r["error"][-6000:])
    return r["value"]


def test_sliding_window_decode_frees_out_of_window_blocks():
    for r in _scenario("decode"):
        bs, w = r["block_size"], r["window"]
        where = f"block_size={bs} window={w} caching={r['caching']}"
        steps = [(0, 10)] + [(10 + s, 1) for s in range(40)]
        seen = set()
        for (computed, n), table, free in zip(steps, r["tables"], r["free"]):
            length = _cdiv(computed + n, bs)
            removed = max(0, (computed - w + 1) // bs)
            want_nulls = [0] * removed
            assert len(table) == length, f"{where}, {computed} computed + {n}: table {table}, want {length} entries"
            assert table[:removed] == want_nulls, (
                f"{where}, {computed} computed: table {table}; the first {removed} blocks hold only "
                f"tokens outside the window and must be the null block")
            live = table[removed:]
            assert all(b > 0 for b in live), f"{where}, {computed} computed: table {table} has the null block (or block 0) inside the window"
            assert len(set(live)) == len(live), f"{where}: table {table} holds a block twice"
            assert r["total"] - free == len(live), (
                f"{where}, {computed} computed: {r['total'] - free} blocks in use, but the request holds "
                f"{len(live)}: blocks outside the window were not given back to the pool")
            seen.update(live)
        assert r["free_after"] == r["total"], f"{where}: after free() {r['free_after']} of {r['total']} blocks are free"
        assert 0 not in r["free_ids_after"], f"{where}: the null block is in the free queue after free()"
        assert len(set(r["free_ids_after"])) == len(r["free_ids_after"]), f"{where}: a block is twice in the free queue"


def test_null_block_is_never_free_nor_handed_out():
    out = _scenario("null_block")
    total = out["total"]
    for hit, n in out["hits"]:
        # 27 tokens: 6 full blocks are cached; the window (8 tokens, 2 blocks) needs the last two.
        assert n == 24 and len(hit) == 6, f"prefix hit {hit} ({n} tokens), want 6 blocks / 24 tokens"
        assert hit[:4] == [0, 0, 0, 0] and all(b > 0 for b in hit[4:]), f"prefix hit {hit}: want 4 null blocks then 2 cached blocks"
    assert out["free"][0] == total, "the pool must be fully free after the first request is freed"
    # Each hit request holds 2 shared cached blocks and 1 block of its own.
    want = [total, total - 3, total - 4, total - 5, total - 4, total - 3, total]
    assert out["free"] == want, f"free blocks after each allocate / free: {out['free']}, want {want}"
    assert 0 not in out["free_ids"], "the null block is in the free queue"
    assert len(set(out["free_ids"])) == len(out["free_ids"]) == total, f"free queue {out['free_ids']}: want {total} distinct blocks"
    assert out["c_blocks"] is not None and len(out["c_blocks"]) == total, f"taking every free block gave {out['c_blocks']}"
    assert 0 not in out["c_blocks"] and -1 not in out["c_blocks"], f"the null block was handed out as a real block: {out['c_blocks']}"
    assert out["free_after_c"] == 0 and out["free_end"] == total


def test_block_aligned_prompt_keeps_the_window_of_its_recomputed_block():
    for r in _scenario("aligned_hit"):
        w, length, a = r["window"], r["length"], r["a"]
        full = min(length // 4, 6)
        # A prompt made of whole cached blocks recomputes its last block, so the hit stops one
        # block short; within the hit, the blocks the window of the next token reaches are real.
        hit_blocks = full - 1 if length == 4 * full and length // 4 <= 6 else full
        first_needed = max(0, (hit_blocks * 4 - w + 1) // 4)
        want = [0] * first_needed + a[first_needed:hit_blocks]
        assert r["tokens"] == 4 * hit_blocks and r["hit"] == want, (
            f"window {w}, prompt of {length} tokens after a cached 24-token prompt with blocks {a}: "
            f"hit {r['hit']} ({r['tokens']} tokens), want {want} ({4 * hit_blocks} tokens)")


def test_sliding_window_memory_bound():
    out = _scenario("memory")
    for case, (page, got) in zip(_ARGS["memory"]["cases"], out["rows"]):
        kind, bs, heads, head_size, window, max_len, batched = case
        assert page == 2 * bs * heads * head_size * 2, f"{case}: page_size_bytes {page}"
        if kind == "full":
            want = _cdiv(max_len, bs) * page
        else:
            tokens = min(window - 1 + batched, max_len)
            want = (_cdiv(tokens, bs) + 1) * page
        assert got == want, f"{case}: max_memory_usage_bytes {got}, want {want}"
    assert out["mla"] == "AssertionError", f"SlidingWindowSpec(use_mla=True): {out['mla']}, want AssertionError"
    t = out["type_ids"]
    assert len(set(t)) == 3, f"type_id must tell windows and attention kinds apart: {t}"


def test_hybrid_specs_fall_back_to_full_attention():
    out = _scenario("unify")
    mixed = out["mixed"]["specs"]
    for name in ("a", "b", "c"):
        kind, bs, heads, head_size, dtype, mla, window = mixed[name]
        assert kind == "FullAttentionSpec" and window is None, f"mixed model, layer {name}: {mixed[name]}, want a FullAttentionSpec"
        assert [bs, heads, head_size, dtype, mla] == [16, 2, 8, "torch.float16", False], f"layer {name} lost its shape: {mixed[name]}"
    for name in ("a", "b"):
        kind, *_, window = out["sliding_only"]["specs"][name]
        assert kind == "SlidingWindowSpec" and window == 128, (
            f"a model with only sliding-window layers must keep them: {out['sliding_only']['specs'][name]}")
        assert out["full_only"]["specs"][name][0] == "FullAttentionSpec"
    assert all(v["returned_none"] for v in out.values()), "unify_hybrid_kv_cache_specs updates the dict in place"
