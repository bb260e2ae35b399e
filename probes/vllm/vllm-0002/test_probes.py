"""Hidden probes for vllm-0002 (sliding-window attention in the V1 KV cache manager).

The judge never imports vllm. Every probe draws its scenario fresh (block sizes, windows, prompt
and decode lengths, token ids, pool sizes, how many requests share a prefix and in which order
they end, spec shapes and memory limits), runs a driver over the submission in a child process,
and checks what comes back (table layouts with the null block as 0, free-block counts, hit
lengths, byte counts, spec kinds) against what the judge computes itself from the
instruction's contract."""

from infradev_probe import fresh, run

_PRELUDE = r"""
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
    return KVCacheManager(config, max_model_len=1 << 16, enable_caching=caching,
                          num_preallocate_tokens=0)


def request(rid, tokens):
    return Request(request_id=rid, prompt=None, prompt_token_ids=[int(t) for t in tokens],
                   multi_modal_inputs=None, multi_modal_hashes=None,
                   multi_modal_placeholders=None,
                   sampling_params=SamplingParams(max_tokens=100000), eos_token_id=None,
                   arrival_time=0, lora_request=None)


def ids(m, blocks):
    # The null block is sent as 0; any other block as its id (a real block with id 0 as -1).
    out = []
    for b in blocks:
        if b is m.block_pool.null_block:
            out.append(0)
        else:
            out.append(-1 if b.block_id == 0 else int(b.block_id))
    return out


def free_ids(m):
    return [int(b.block_id) for b in m.block_pool.free_block_queue.get_all_free_blocks()]
"""

_DECODE = _PRELUDE + r"""
rows = []
for s in ARGS["settings"]:
    m = manager(sw_spec(s["block_size"], s["window"]), s["num_blocks"], s["caching"])
    req = request("r", s["prompt"])
    assert m.allocate_slots(req, len(s["prompt"])) is not None
    req.num_computed_tokens = len(s["prompt"])
    tables, free = [ids(m, m.req_to_blocks["r"])], [int(m.block_pool.get_num_free_blocks())]
    for t in s["decode"]:
        req.append_output_token_ids(int(t))
        assert m.allocate_slots(req, 1) is not None, "allocate_slots refused a decode step"
        req.num_computed_tokens += 1
        tables.append(ids(m, m.req_to_blocks["r"]))
        free.append(int(m.block_pool.get_num_free_blocks()))
    m.free(req)
    rows.append({"tables": tables, "free": free,
                 "free_after": int(m.block_pool.get_num_free_blocks()),
                 "free_ids_after": free_ids(m)})
emit(rows=rows)
"""

_NULL = _PRELUDE + r"""
m = manager(sw_spec(ARGS["block_size"], ARGS["window"]), ARGS["num_blocks"])
prompt = ARGS["prompt"]
a = request("a", prompt)
a_blocks = ids(m, m.allocate_slots(a, len(prompt)))
a.num_computed_tokens = len(prompt)
m.free(a)
out = {"a": a_blocks, "free": [int(m.block_pool.get_num_free_blocks())], "hits": []}
live = []
for i, tokens in enumerate(ARGS["requests"]):
    r = request("b%d" % i, tokens)
    computed, n = m.get_computed_blocks(r)
    out["hits"].append({"ids": ids(m, computed), "tokens": int(n)})
    assert m.allocate_slots(r, len(tokens) - n, computed) is not None, "allocate_slots refused"
    r.num_computed_tokens = len(tokens)
    live.append(r)
    out["free"].append(int(m.block_pool.get_num_free_blocks()))
for i in ARGS["free_order"]:
    m.free(live[i])
    out["free"].append(int(m.block_pool.get_num_free_blocks()))
out["free_ids"] = free_ids(m)
# Take every free block: none may be the null block.
n = out["free"][-1] * ARGS["block_size"]
c = request("c", range(900000, 900000 + n))
blocks = m.allocate_slots(c, n)
out["c_blocks"] = None if blocks is None else ids(m, blocks)
out["free_after_c"] = int(m.block_pool.get_num_free_blocks())
m.free(c)
out["free_end"] = int(m.block_pool.get_num_free_blocks())
emit(**out)
"""

_ALIGNED = _PRELUDE + r"""
rows = []
for case in ARGS["cases"]:
    m = manager(sw_spec(case["block_size"], case["window"]), case["num_blocks"])
    a = request("a", case["a"])
    a_blocks = ids(m, m.allocate_slots(a, len(case["a"])))
    a.num_computed_tokens = len(case["a"])
    b = request("b", case["b"])
    computed, n = m.get_computed_blocks(b)
    rows.append({"a": a_blocks, "hit": ids(m, computed), "tokens": int(n)})
emit(rows=rows)
"""

_MEMORY = r"""
import types

import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

rows = []
specs = []
for c in ARGS["cases"]:
    cfg = types.SimpleNamespace(
        model_config=types.SimpleNamespace(max_model_len=c["max_model_len"]),
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=c["batched"]))
    try:
        if c["kind"] == "full":
            spec = FullAttentionSpec(block_size=c["block_size"], num_kv_heads=c["heads"],
                                     head_size=c["head_size"], dtype=torch.float16,
                                     use_mla=c["mla"])
        else:
            spec = SlidingWindowSpec(block_size=c["block_size"], num_kv_heads=c["heads"],
                                     head_size=c["head_size"], dtype=torch.float16,
                                     use_mla=c["mla"], sliding_window=c["window"])
    except Exception as e:
        rows.append({"raised": type(e).__name__})
        continue
    rows.append({"page": int(spec.page_size_bytes),
                 "max": int(spec.max_memory_usage_bytes(cfg)), "type_id": str(spec.type_id)})
emit(rows=rows)
"""

_UNIFY = r"""
import torch
from vllm.v1.core.kv_cache_utils import unify_hybrid_kv_cache_specs
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
rows = []
for case in ARGS["cases"]:
    specs = {}
    for name, kind, bs, heads, head_size, dtype, mla, window in case:
        if kind == "full":
            specs[name] = FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=head_size,
                                            dtype=DTYPES[dtype], use_mla=mla)
        else:
            specs[name] = SlidingWindowSpec(block_size=bs, num_kv_heads=heads, head_size=head_size,
                                            dtype=DTYPES[dtype], use_mla=mla, sliding_window=window)
    unify_hybrid_kv_cache_specs(specs)
    rows.append({name: [type(s).__name__, int(s.block_size), int(s.num_kv_heads),
                        int(s.head_size), str(s.dtype).replace("torch.", ""), bool(s.use_mla),
                        getattr(s, "sliding_window", None)]
                 for name, s in specs.items()})
emit(rows=rows)
"""


def _cdiv(a, b):
    return -(-a // b)


def _tokens(rng, n, lo, hi):
    return [int(t) for t in rng.integers(lo, hi, size=n)]


def _sw_hit(bs, window, cached_blocks, search_blocks):
    """The judge's sliding-window hit when blocks [0, cached_blocks) are cached and the search
    covers search_blocks blocks: (hit blocks, positions among the cached blocks, -1 = null)."""
    c = _cdiv(window - 1, bs)
    h = min(cached_blocks, search_blocks)
    return h, [-1 if i < h - c else i for i in range(h)]


def _search_blocks(num_tokens, bs):
    """Blocks the search covers: the request's whole blocks, less the last one when the tokens
    are exactly whole blocks (that block is recomputed)."""
    n = num_tokens // bs
    return n - 1 if num_tokens % bs == 0 else n


def _positions(hit, a_blocks):
    where = {b: i for i, b in enumerate(a_blocks)}
    return [-1 if b == 0 else where.get(b, -2) for b in hit]


def test_sliding_window_decode_frees_out_of_window_blocks():
    rng = fresh()
    settings = []
    for _ in range(5):
        bs = int(rng.integers(1, 9))
        # A window larger than a block: with prefix caching on, gold's manager cannot cache a
        # block whose predecessor already left a window of at most one block.
        window = int(rng.integers(bs + 1, 6 * bs + 3))
        prompt = int(rng.integers(1, 5 * bs + 20))
        decode = int(rng.integers(2 * window, 2 * window + 40))
        settings.append({
            "block_size": bs, "window": window, "caching": bool(rng.integers(2)),
            "num_blocks": _cdiv(prompt + decode, bs) + int(rng.integers(2, 24)),
            "prompt": _tokens(rng, prompt, 0, 20000), "decode": _tokens(rng, decode, 20000, 40000)})
    got = run(_DECODE, {"settings": settings})
    assert len(got["rows"]) == len(settings), "the driver returned a row per setting"
    for s, r in zip(settings, got["rows"]):
        bs, w, total = s["block_size"], s["window"], s["num_blocks"] - 1
        where = f"block_size={bs} window={w} caching={s['caching']} pool of {s['num_blocks']}"
        p = len(s["prompt"])
        steps = [(0, p)] + [(p + i, 1) for i in range(len(s["decode"]))]
        assert len(r["tables"]) == len(steps) and len(r["free"]) == len(steps), f"{where}: one table per step"
        for (computed, n), table, free in zip(steps, r["tables"], r["free"]):
            length = _cdiv(computed + n, bs)
            removed = max(0, (computed - w + 1) // bs)
            at = f"{where}, {computed} computed + {n} new"
            assert len(table) == length, f"{at}: table {table}, want {length} entries"
            assert table[:removed] == [0] * removed, (
                f"{at}: table {table}; the first {removed} blocks hold only tokens outside the "
                f"window and must be the null block")
            live = table[removed:]
            assert all(b > 0 for b in live), f"{at}: table {table} has the null block (or block 0) inside the window"
            assert len(set(live)) == len(live), f"{at}: table {table} holds a block twice"
            want_free = total - (length - removed)
            assert free == want_free, (
                f"{at}: {free} blocks free, want {want_free} ({length - removed} in the window of "
                f"{total}): blocks outside the window were not given back to the pool")
        assert r["free_after"] == total, f"{where}: after free() {r['free_after']} of {total} blocks are free"
        assert sorted(r["free_ids_after"]) == list(range(1, total + 1)), (
            f"{where}: after free() the free queue is not blocks 1..{total} once each")


def test_null_block_is_never_free_nor_handed_out():
    rng = fresh()
    bs = int(rng.integers(2, 7))
    window = int(rng.integers(2, 4 * bs + 2))
    c = _cdiv(window - 1, bs)
    p = int(rng.integers((c + 3) * bs, (c + 10) * bs))
    prompt = _tokens(rng, p, 0, 20000)
    k = int(rng.integers(2, 6))
    reqs, expect = [], []
    for i in range(k):
        cut = int(rng.integers((c + 2) * bs, p + 1))
        tokens = prompt[:cut] + _tokens(rng, int(rng.integers(1, 3 * bs)), 20000 * (i + 1) + 1, 20000 * (i + 2))
        h, pos = _sw_hit(bs, window, cut // bs, _search_blocks(len(tokens), bs))
        reqs.append(tokens)
        expect.append((h, pos, _cdiv(len(tokens), bs) - h))
    a_n = _cdiv(p, bs)
    num_blocks = 1 + a_n + sum(e[2] for e in expect) + int(rng.integers(2, 12))
    order = [int(i) for i in rng.permutation(k)]
    args = {"block_size": bs, "window": window, "num_blocks": num_blocks, "prompt": prompt,
            "requests": reqs, "free_order": order}
    out = run(_NULL, args)
    total = num_blocks - 1
    where = (f"block size {bs}, window {window}, pool of {num_blocks}, a {p}-token prompt cached "
             f"then {k} requests sharing {[len(t) for t in reqs]} tokens")
    assert len(out["a"]) == a_n and 0 not in out["a"] and -1 not in out["a"], (
        f"{where}: the first request got blocks {out['a']}, want {a_n} real ones")
    assert len(out["hits"]) == k, f"{where}: one hit per request"
    for i, (hit, (h, pos, _)) in enumerate(zip(out["hits"], expect)):
        got_pos = _positions(hit["ids"], out["a"])
        assert hit["tokens"] == h * bs and got_pos == pos, (
            f"{where}: request {i} hits {hit['tokens']} tokens at positions {got_pos} of the first "
            f"request's blocks, want {h * bs} at {pos} (-1 is the null block)")
    # Used blocks: the distinct cached blocks in the live requests' windows plus their own.
    def used(live):
        shared = set()
        for i in live:
            shared.update(x for x in expect[i][1] if x >= 0)
        return len(shared) + sum(expect[i][2] for i in live)
    want = [total] + [total - used(range(i + 1)) for i in range(k)]
    for j in range(k):
        want.append(total - used(order[j + 1:]))
    assert out["free"] == want, (
        f"{where}, freed in order {order}: free blocks after each allocate / free {out['free']}, "
        f"want {want}")
    assert sorted(out["free_ids"]) == list(range(1, total + 1)), (
        f"{where}: once every request is freed the free queue is not blocks 1..{total} once each")
    assert out["c_blocks"] is not None and len(out["c_blocks"]) == total, (
        f"{where}: taking all {total} free blocks gave {out['c_blocks']}")
    assert sorted(out["c_blocks"]) == list(range(1, total + 1)), (
        f"{where}: taking every free block handed out {sorted(out['c_blocks'])}, want blocks 1..{total}")
    assert out["free_after_c"] == 0 and out["free_end"] == total, (
        f"{where}: free blocks {out['free_after_c']} with every block taken and {out['free_end']} "
        f"after, want 0 and {total}")


def test_block_aligned_prompt_keeps_the_window_of_its_recomputed_block():
    rng = fresh()
    cases = []
    for i in range(8):
        bs = int(rng.integers(2, 9))
        window = int(rng.integers(2, 4 * bs + 2))
        c = _cdiv(window - 1, bs)
        a_len = int(rng.integers((c + 3) * bs, (c + 12) * bs))
        a = _tokens(rng, a_len, 0, 20000)
        if i < 5:  # a prompt of whole blocks, all of them cached
            n = int(rng.integers(c + 2, a_len // bs + 1))
            b = a[:n * bs]
        else:  # a prompt that does not end at a block boundary, or that goes past a
            n = int(rng.integers(c + 1, a_len + 2 * bs))
            b = (a + _tokens(rng, 2 * bs, 20000, 40000))[:n]
            if len(b) % bs == 0:
                b = b + _tokens(rng, 1, 40000, 50000)
        cases.append({"block_size": bs, "window": window, "num_blocks": 2 * _cdiv(a_len, bs) + 8,
                      "a": a, "b": b})
    order = [int(i) for i in rng.permutation(len(cases))]
    cases = [cases[i] for i in order]
    got = run(_ALIGNED, {"cases": cases})
    assert len(got["rows"]) == len(cases), "the driver returned a row per case"
    for case, r in zip(cases, got["rows"]):
        bs, w = case["block_size"], case["window"]
        h, pos = _sw_hit(bs, w, len(case["a"]) // bs, _search_blocks(len(case["b"]), bs))
        got_pos = _positions(r["hit"], r["a"])
        assert r["tokens"] == h * bs and got_pos == pos, (
            f"block size {bs}, window {w}, a {len(case['b'])}-token prompt after a cached "
            f"{len(case['a'])}-token one it shares {min(len(case['a']), len(case['b']))} tokens with: "
            f"hit {r['tokens']} tokens at positions {got_pos}, want {h * bs} at {pos} "
            f"(-1 is the null block)")


def test_sliding_window_memory_bound():
    rng = fresh()
    cases = []
    for _ in range(12):
        kind = str(rng.choice(["full", "sliding"]))
        bs = int(rng.choice([1, 4, 8, 16, 32, 64]))
        window = int(rng.integers(2, 8193))
        max_len = int(rng.integers(256, 65537))
        # Sometimes a window and batch that pass max_model_len.
        batched = int(rng.integers(1, 16385)) if rng.random() < 0.7 else int(rng.integers(max_len, 2 * max_len))
        cases.append({"kind": kind, "block_size": bs, "heads": int(rng.integers(1, 17)),
                      "head_size": int(rng.choice([32, 64, 80, 96, 128, 256])), "window": window,
                      "max_model_len": max_len, "batched": batched,
                      "mla": bool(rng.random() < 0.25)})
    # Two sliding-window specs that differ only in their window, and two only in their block
    # size, for type_id.
    base = dict(cases[0], kind="sliding", mla=False)
    cases.append(dict(base, window=base["window"] + int(rng.integers(1, 100))))
    cases.append(dict(base, block_size=base["block_size"] * 2))
    cases.append(base)
    got = run(_MEMORY, {"cases": cases})
    assert len(got["rows"]) == len(cases), "the driver returned a row per case"
    keys = {}
    for c, r in zip(cases, got["rows"]):
        where = (f"{c['kind']} spec block {c['block_size']}, {c['heads']} heads of {c['head_size']}, "
                 f"use_mla={c['mla']}, window {c['window']}, max_model_len {c['max_model_len']}, "
                 f"batch {c['batched']}")
        if c["kind"] == "sliding" and c["mla"]:
            assert r == {"raised": "AssertionError"}, f"{where}: want AssertionError, got {r}"
            continue
        assert "raised" not in r, f"{where}: raised {r.get('raised')}"
        page = (1 if c["mla"] else 2) * c["block_size"] * c["heads"] * c["head_size"] * 2
        assert r["page"] == page, f"{where}: page_size_bytes {r['page']}, want {page}"
        if c["kind"] == "full":
            want = _cdiv(c["max_model_len"], c["block_size"]) * page
        else:
            tokens = min(c["window"] - 1 + c["batched"], c["max_model_len"])
            want = (_cdiv(tokens, c["block_size"]) + 1) * page
        assert r["max"] == want, f"{where}: max_memory_usage_bytes {r['max']}, want {want}"
        key = (c["kind"], c["block_size"], page, c["window"] if c["kind"] == "sliding" else None)
        keys.setdefault(r["type_id"], set()).add(key)
    clash = {t: k for t, k in keys.items() if len(k) > 1}
    assert not clash, f"type_id does not tell these specs apart: {clash}"


def _unify_case(rng, what):
    n = int(rng.integers(2, 8))
    if what == "mixed":
        kinds = ["full", "sliding"] + [str(rng.choice(["full", "sliding"])) for _ in range(n - 2)]
    else:
        kinds = [what] * n
    kinds = [kinds[i] for i in rng.permutation(n)]
    layers = []
    for i, kind in enumerate(kinds):
        layers.append([f"model.layers.{int(rng.integers(1000))}.{i}.attn", kind,
                       int(rng.choice([8, 16, 32])), int(rng.integers(1, 9)),
                       int(rng.choice([32, 64, 128])), str(rng.choice(["float16", "bfloat16", "float32"])),
                       bool(kind == "full" and rng.random() < 0.3), int(rng.integers(2, 4097))])
    return layers


def test_hybrid_specs_fall_back_to_full_attention():
    rng = fresh()
    whats = ["mixed", "mixed", "mixed", "sliding", "sliding", "full"]
    cases = [_unify_case(rng, whats[i]) for i in rng.permutation(len(whats))]
    got = run(_UNIFY, {"cases": cases})
    assert len(got["rows"]) == len(cases), "the driver returned a row per case"
    for case, r in zip(cases, got["rows"]):
        mixed = len({layer[1] for layer in case}) == 2
        want = {}
        for name, kind, bs, heads, hs, dtype, mla, window in case:
            if kind == "sliding" and not mixed:
                want[name] = ["SlidingWindowSpec", bs, heads, hs, dtype, mla, window]
            else:
                want[name] = ["FullAttentionSpec", bs, heads, hs, dtype, mla, None]
        where = ("a model with layers " + ", ".join(f"{l[0]} ({l[1]})" for l in case))
        assert r == want, (
            f"{where}: after unify_hybrid_kv_cache_specs the dict holds {r}, want {want} "
            f"(sliding-window layers become full attention, in place, only next to full-attention "
            f"layers)")
