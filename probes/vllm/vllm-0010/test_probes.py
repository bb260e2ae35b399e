"""Hidden probes for vllm-0010 (caller-provided scratch buffers for the 3D Triton attention kernel,
so that decode attention can run inside CUDA graphs).

The judge never imports vllm or torch. Each probe runs one driver in a child process on one GPU:
the driver calls unified_attention (or builds a TritonAttentionMetadataBuilder) with inputs the
judge drew, and sends back the attention output, the scratch buffers as they are afterwards (with
the guard space around them), and GPU memory figures. Every scenario is drawn fresh
(``fresh()``): head counts, head size, thresholds, segment counts, batch sizes, query and KV
lengths, the paged KV cache and block table (float16 values, so both sides see the same
numbers), cudagraph modes and capture sizes. The judge computes the reference attention in
float64 with numpy, derives from the instruction's rules which batches must take the 3D path (and
so write the scratch buffers) and which thresholds a builder must pick, and for the memory probe
compares the GPU memory NVML shows the child using with what gold's child uses on the same
inputs. Every probe runs in a child of its own: a scenario that hangs or crashes fails its probe
only."""

import numpy as np

from infradev_probe import fresh, measure, run

_DRIVER = r'''
import numpy as np
import torch

DEV = torch.device("cuda", 0)


def dev(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(DEV)


def attend(b, scratch):
    from vllm.attention.ops.triton_unified_attention import unified_attention
    q, k, v = dev(b["q"]), dev(b["k"]), dev(b["v"])
    out = torch.zeros_like(q)
    cu, kv_lens, table = dev(b["cu"]), dev(b["kv_lens"]), dev(b["table"])
    torch.cuda.synchronize()
    unified_attention(
        q=q, k=k, v=v, out=out, cu_seqlens_q=cu, max_seqlen_q=int(b["max_q"]),
        seqused_k=kv_lens, max_seqlen_k=int(b["max_kv"]),
        softmax_scale=float(q.shape[2]) ** -0.5, causal=True, window_size=(-1, -1),
        block_table=table, softcap=0, q_descale=None, k_descale=None, v_descale=None,
        **scratch)
    torch.cuda.synchronize()
    return out


def make_scratch(rows, heads, segments, dpad, guard):
    """Three NaN-filled float32 buffers; with guard, each is a view at the start of a larger
    NaN-filled tensor (the rest is guard space that nothing may write)."""
    shapes = [(rows, heads, segments, dpad), (rows, heads, segments), (rows, heads, segments)]
    whole, views = [], []
    for shape in shapes:
        n = int(np.prod(shape))
        t = torch.full((n * guard,), float("nan"), dtype=torch.float32, device=DEV)
        whole.append(t)
        views.append(t[:n].view(shape))
    return whole, views


def kwargs(threshold, segments, views):
    return {"seq_threshold_3D": threshold, "num_par_softmax_segments": segments,
            "softmax_segm_output": views[0], "softmax_segm_max": views[1],
            "softmax_segm_expsum": views[2]}


def choice(args):
    res = []
    for case in args["cases"]:
        b = case["batch"]
        if case["threshold"] is None:
            out = attend(b, {})
            res.append({"out": out})
            continue
        whole, views = make_scratch(case["rows"], b["q"].shape[1], 16, case["dpad"], 1)
        out = attend(b, kwargs(case["threshold"], 16, views))
        res.append({"out": out, "buffers": [w for w in whole]})
    return res


def segments(args):
    res = []
    for case in args["cases"]:
        b = case["batch"]
        whole, views = make_scratch(case["rows"], b["q"].shape[1], case["segments"],
                                    case["dpad"], case["guard"])
        out = attend(b, kwargs(case["threshold"], case["segments"], views))
        res.append({"out": out, "buffers": [w for w in whole]})
    return res


def memory(args):
    b = args["batch"]
    _, views = make_scratch(args["rows"], b["q"].shape[1], 16, args["dpad"], 1)
    scratch = kwargs(args["threshold"], 16, views)
    attend(b, scratch)  # warm up: compile the kernels
    from vllm.attention.ops.triton_unified_attention import unified_attention
    q, k, v = dev(b["q"]), dev(b["k"]), dev(b["v"])
    out = torch.zeros_like(q)
    cu, kv_lens, table = dev(b["cu"]), dev(b["kv_lens"]), dev(b["table"])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(DEV)
    torch.cuda.reset_peak_memory_stats(DEV)
    unified_attention(
        q=q, k=k, v=v, out=out, cu_seqlens_q=cu, max_seqlen_q=int(b["max_q"]),
        seqused_k=kv_lens, max_seqlen_k=int(b["max_kv"]),
        softmax_scale=float(q.shape[2]) ** -0.5, causal=True, window_size=(-1, -1),
        block_table=table, softcap=0, q_descale=None, k_descale=None, v_descale=None,
        **scratch)
    torch.cuda.synchronize()
    extra = int(torch.cuda.max_memory_allocated(DEV) - base)
    return {"out": out, "extra": extra}


class Model:
    def __init__(self, hq, hkv, d):
        self.hq, self.hkv, self.d = hq, hkv, d

    def get_num_attention_heads(self, parallel_config):
        return self.hq

    def get_num_kv_heads(self, parallel_config):
        return self.hkv

    def get_head_size(self):
        return self.d


def builder(args):
    import types
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder
    from vllm.v1.attention.backends.utils import CommonAttentionMetadata
    res = []
    for case in args["cases"]:
        config = types.SimpleNamespace(
            model_config=Model(case["hq"], case["hkv"], case["d"]),
            parallel_config=types.SimpleNamespace(),
            compilation_config=types.SimpleNamespace(
                cudagraph_mode=getattr(CUDAGraphMode, case["mode"]),
                cudagraph_capture_sizes=list(case["sizes"])),
        )
        spec = types.SimpleNamespace(block_size=16)
        b = TritonAttentionMetadataBuilder(spec, ["layers.0.attn"], config, DEV)
        lens = [int(x) for x in case["seq_lens"]]
        n = len(lens)
        common = CommonAttentionMetadata(
            query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=DEV),
            query_start_loc_cpu=torch.arange(n + 1, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEV),
            num_reqs=n, num_actual_tokens=n, max_query_len=1, max_seq_len=max(lens),
            block_table_tensor=torch.zeros((n, (max(lens) + 15) // 16), dtype=torch.int32,
                                           device=DEV),
            slot_mapping=torch.arange(n, dtype=torch.int64, device=DEV) * 16,
        )
        metas = [b.build(0, common), b.build(0, common)]
        bufs = [b.softmax_segm_output, b.softmax_segm_max, b.softmax_segm_expsum]
        entry = {
            "threshold": int(b.seq_threshold_3D),
            "segments": int(b.num_par_softmax_segments),
            "shapes": [list(t.shape) for t in bufs],
            "dtypes": [str(t.dtype) for t in bufs],
            "on_gpu": [t.device.type == "cuda" for t in bufs],
            "meta": [],
        }
        for m in metas:
            mbufs = [m.softmax_segm_output, m.softmax_segm_max, m.softmax_segm_expsum]
            entry["meta"].append({
                "threshold": int(m.seq_threshold_3D),
                "segments": int(m.num_par_softmax_segments),
                "same": [x.data_ptr() == y.data_ptr() and list(x.shape) == list(y.shape)
                         for x, y in zip(mbufs, bufs)],
            })
        res.append(entry)
    return res


SCENARIOS = {"choice": choice, "segments": segments, "memory": memory, "builder": builder}
emit(result=SCENARIOS[ARGS["scenario"]](ARGS))
'''


def _args(scenario, **args):
    args.update(scenario=scenario)
    return args


# ---- the judge's own batches and reference ----

_BS = 16


def _pow2(n):
    return 1 << (int(n) - 1).bit_length()


def _batch(rng, q_lens, kv_lens, hq, hkv, d):
    nblk = [-(-n // _BS) for n in kv_lens]
    num_blocks = sum(nblk) + int(rng.integers(1, 9))
    perm = rng.permutation(num_blocks)
    table = np.zeros((len(kv_lens), max(nblk)), dtype=np.int32)
    at = 0
    for i, n in enumerate(nblk):
        table[i, :n] = perm[at:at + n]
        at += n
    return {
        "q": rng.standard_normal((sum(q_lens), hq, d)).astype(np.float16),
        "k": rng.standard_normal((num_blocks, _BS, hkv, d)).astype(np.float16),
        "v": rng.standard_normal((num_blocks, _BS, hkv, d)).astype(np.float16),
        "cu": np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
        "kv_lens": np.asarray(kv_lens, dtype=np.int32),
        "table": table,
        "max_q": int(max(q_lens)),
        "max_kv": int(max(kv_lens)),
    }


def _reference(b):
    q = b["q"].astype(np.float64)
    k = b["k"].astype(np.float64)
    v = b["v"].astype(np.float64)
    group = q.shape[1] // k.shape[2]
    scale = q.shape[2] ** -0.5
    out = np.zeros_like(q)
    for i, n in enumerate(b["kv_lens"]):
        s, e = int(b["cu"][i]), int(b["cu"][i + 1])
        pos = np.arange(int(n))
        blocks = b["table"][i, pos // _BS]
        keys = np.repeat(k[blocks, pos % _BS], group, axis=1)
        vals = np.repeat(v[blocks, pos % _BS], group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q[s:e], keys) * scale
        qpos = int(n) - (e - s) + np.arange(e - s)
        scores = np.where((pos[None, :] <= qpos[:, None])[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[s:e] = np.einsum("hqk,khd->qhd", p, vals)
    return out


def _check_out(got, b, what):
    want = _reference(b)
    assert isinstance(got, np.ndarray), f"{what}: the output did not come back as an array"
    got = got.astype(np.float64)
    assert got.shape == want.shape, f"{what}: output shape {got.shape}, want {want.shape}"
    assert np.isfinite(got).all(), f"{what}: the output holds NaN or infinities"
    err = np.abs(got - want)
    bad = err > 2e-2 + 2e-2 * np.abs(want)
    if bad.any():
        tok, head, _ = (int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} output values differ from the reference attention "
            f"(largest error {err.max():.3g}; first at token {tok}, head {head})")


def _heads(rng, min_group=1):
    group = int(rng.choice([g for g in (1, 2, 4, 8) if g >= min_group]))
    hkv = int(rng.choice([1, 2, 4]))
    return hkv * group, hkv, int(rng.choice([64, 128]))


def _kv_lens(rng, n, lo=17, hi=300):
    return [int(x) for x in rng.integers(lo, hi, n)]


def _decode(rng, n, hq, hkv, d, lo=17, hi=300):
    return _batch(rng, [1] * n, _kv_lens(rng, n, lo, hi), hq, hkv, d)


def _choice_cases():
    """Scratch for 16 segments, NaN-filled. The expected path follows the instruction: 3D
    exactly when the scratch is given, every query length is 1 and the number of sequences is at
    most seq_threshold_3D."""
    rng = fresh()
    cases = []
    # Exactly the threshold (with several query heads per KV head, so that the launch grid has
    # more query blocks than sequences).
    hq, hkv, d = _heads(rng, min_group=2)
    t = int(rng.integers(max(2, 16 // (hq // hkv)), 25))
    cases.append({"name": f"{t} decodes, threshold {t}", "batch": _decode(rng, t, hq, hkv, d),
                  "threshold": t, "rows": t, "dpad": _pow2(d), "path": "3d"})
    # Below the threshold.
    hq, hkv, d = _heads(rng)
    t = int(rng.integers(3, 25))
    n = int(rng.integers(1, t))
    cases.append({"name": f"{n} decodes, threshold {t}", "batch": _decode(rng, n, hq, hkv, d),
                  "threshold": t, "rows": t, "dpad": _pow2(d), "path": "3d"})
    # Above the threshold.
    hq, hkv, d = _heads(rng)
    t = int(rng.integers(1, 17))
    n = t + int(rng.integers(1, 9))
    cases.append({"name": f"{n} decodes, threshold {t}", "batch": _decode(rng, n, hq, hkv, d),
                  "threshold": t, "rows": t, "dpad": _pow2(d), "path": "2d"})
    # A prefill among decodes, within the threshold.
    hq, hkv, d = _heads(rng)
    n = int(rng.integers(2, 7))
    q_lens = [1] * n
    q_lens[int(rng.integers(n))] = int(rng.integers(2, 9))
    kv = [int(x) + ql for x, ql in zip(rng.integers(17, 250, n), q_lens)]
    t = n + int(rng.integers(0, 6))
    cases.append({"name": f"a prefill among {n} sequences, threshold {t}",
                  "batch": _batch(rng, q_lens, kv, hq, hkv, d), "threshold": t, "rows": t,
                  "dpad": _pow2(d), "path": "2d"})
    # No scratch given.
    hq, hkv, d = _heads(rng)
    n = int(rng.integers(1, 9))
    cases.append({"name": f"{n} decodes without scratch buffers",
                  "batch": _decode(rng, n, hq, hkv, d), "threshold": None, "path": "2d"})
    order = rng.permutation(len(cases))
    return [cases[i] for i in order]


def _segment_cases():
    """Scratch sized for fewer segments than the usual 16, each buffer at the start of a NaN-filled
    tensor several times its size (room for a 16-segment layout and more)."""
    rng = fresh()
    cases = []
    for s in rng.permutation([2, 4, 8])[:2]:
        s = int(s)
        hq, hkv, d = _heads(rng)
        rows = int(rng.integers(4, 17))
        # Enough sequences that a 16-segment layout of them runs past a buffer made for s.
        n = int(rng.integers(-(-rows // 2) + 1, rows + 1))
        cases.append({"name": f"{n} decodes, {s} segments, threshold {rows}",
                      "batch": _decode(rng, n, hq, hkv, d, 100, 700), "threshold": rows,
                      "rows": rows, "segments": s, "dpad": _pow2(d), "guard": 16 // s + 2})
    return cases


def _strip(case):
    return {k: v for k, v in case.items() if k not in ("name", "path")}


# The most NVML may show the submission's child using above gold's child on the same inputs:
# room for a small tensor or two of the caching allocator's (2 MiB segments) and driver noise;
# scratch of the call's own is at least 48 MiB in this scenario.
_NVML_SLACK = 16 << 20
# What the child's own allocator counter may show during the measured call.
_MEMORY_LIMIT = 256 << 10

_FULL_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def test_kernel_choice_follows_threshold():
    # With scratch buffers given, a decode-only batch of at most seq_threshold_3D sequences runs
    # the 3D kernel (which writes the scratch); more sequences, a prefill in the batch, or no
    # scratch runs the 2D kernel (which leaves the NaN-filled scratch untouched). Every output
    # matches the reference.
    cases = _choice_cases()
    got = run(_DRIVER, _args("choice", cases=[_strip(c) for c in cases]), timeout=600,
              allow_nan=True)["result"]
    assert isinstance(got, list) and len(got) == len(cases), f"results for {len(cases)} cases expected"
    for case, r in zip(cases, got):
        b = case["batch"]
        _check_out(r["out"], b, case["name"])
        if case["threshold"] is None:
            continue
        hq, n = b["q"].shape[1], len(b["kv_lens"])
        shapes = [(case["rows"], hq, 16, case["dpad"]), (case["rows"], hq, 16), (case["rows"], hq, 16)]
        bufs = r["buffers"]
        assert isinstance(bufs, list) and len(bufs) == 3
        for x, shape in zip(bufs, shapes):
            assert isinstance(x, np.ndarray) and x.size == int(np.prod(shape)), (
                f"{case['name']}: a scratch buffer came back with the wrong size")
        out_buf, max_buf, sum_buf = bufs
        if case["path"] == "3d":
            # Segment 0 of every sequence holds keys, so every 3D kernel writes it.
            seg_max = max_buf.reshape(shapes[1])[:n, :, 0]
            seg_sum = sum_buf.reshape(shapes[2])[:n, :, 0]
            assert np.isfinite(seg_max).all() and np.isfinite(seg_sum).all(), (
                f"{case['name']}: the given scratch buffers were not written for every sequence "
                f"and head: the batch did not run on the 3D kernel with the given buffers")
        else:
            for what, x in (("softmax_segm_output", out_buf), ("softmax_segm_max", max_buf),
                            ("softmax_segm_expsum", sum_buf)):
                assert np.isnan(x).all(), (
                    f"{case['name']}: {what} was written although this batch must run on the 2D kernel")


def test_scratch_sized_by_segment_count():
    # num_par_softmax_segments other than 16: the 3D kernel and its reduction use the given
    # count, stay inside the given buffers (the guard space after each stays NaN), and the output
    # matches the reference.
    cases = _segment_cases()
    got = run(_DRIVER, _args("segments", cases=[_strip(c) for c in cases]), timeout=600,
              allow_nan=True)["result"]
    assert isinstance(got, list) and len(got) == len(cases), f"results for {len(cases)} cases expected"
    for case, r in zip(cases, got):
        b = case["batch"]
        _check_out(r["out"], b, case["name"])
        hq = b["q"].shape[1]
        rows, s = case["rows"], case["segments"]
        sizes = [rows * hq * s * case["dpad"], rows * hq * s, rows * hq * s]
        names = ("softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum")
        assert isinstance(r["buffers"], list) and len(r["buffers"]) == 3
        for what, whole, size in zip(names, r["buffers"], sizes):
            assert isinstance(whole, np.ndarray) and whole.size == size * case["guard"], (
                f"{case['name']}: {what} came back with the wrong size")
            guard = whole[size:]
            written = int((~np.isnan(guard)).sum())
            assert written == 0, (
                f"{case['name']}: {written} values written past the end of {what} "
                f"(shaped for {s} segments)")


def test_no_gpu_allocation_on_the_3d_path():
    # A decode batch on the 3D path with the scratch given allocates no GPU memory of its own:
    # NVML shows the child using no more than gold's child on the same inputs (scratch of the
    # call's own would be at least 48 MiB), its allocator shows no allocation during the call,
    # and its output matches the reference.
    rng = fresh()
    hkv = int(rng.choice([4, 8]))  # 4 to 16 query heads per KV head
    hq = int(rng.choice([32, 64]))
    d = int(rng.choice([128, 256])) if hq == 64 else 256
    n = int(rng.integers(96, 161))
    threshold = n + int(rng.integers(0, 33))
    b = _decode(rng, n, hq, hkv, d, 20, 96)
    args = _args("memory", batch=b, threshold=threshold, rows=threshold, dpad=_pow2(d))
    want, gold = measure(_DRIVER, args, timeout=600, gpu=True, repository="reference")
    got, mine = measure(_DRIVER, args, timeout=600, gpu=True)
    r = got["result"]
    _check_out(r["out"], b, f"{n} decodes on the 3D path")
    assert gold.gpu_peak_bytes is not None and mine.gpu_peak_bytes is not None, \
        "probe setup: NVML gave no GPU memory figures"
    assert mine.gpu_peak_bytes <= gold.gpu_peak_bytes + _NVML_SLACK, (
        f"NVML shows the child using {mine.gpu_peak_bytes / 2**20:.1f} MiB of GPU memory, "
        f"{(mine.gpu_peak_bytes - gold.gpu_peak_bytes) / 2**20:.1f} MiB more than the reference "
        f"implementation on the same {n}-sequence 3D-path batch, although the scratch buffers "
        f"were given")
    extra = r["extra"]
    assert isinstance(extra, int) and extra < _MEMORY_LIMIT, (
        f"unified_attention allocated {extra / 2**20:.2f} MiB of GPU memory during a 3D-path "
        f"call although the scratch buffers were given")


def _builder_cases(rng):
    modes = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
    picked = list(rng.permutation(modes))
    # Two more, so that every draw has at least two of the full modes, in any order.
    picked += list(rng.choice(list(_FULL_MODES), 2))
    cases = []
    for mode in picked:
        hkv = int(rng.choice([1, 2, 3, 4, 8, 16]))
        hq = hkv * int(rng.choice([1, 2, 4]))
        d = int(rng.choice([64, 80, 96, 128, 256]))
        base = 128 // hkv
        pool = set(int(x) for x in rng.integers(1, 257, int(rng.integers(2, 10))))
        if rng.integers(2):
            # A tie: two capture sizes equally far from 128 // num_kv_heads.
            gap = int(rng.integers(1, max(2, base)))
            pool |= {base - gap, base + gap} if base - gap >= 1 else {base + gap}
        sizes = [int(x) for x in rng.permutation(sorted(pool))]
        want = min(sizes, key=lambda x: abs(x - base)) if mode in _FULL_MODES else base
        lens = [int(x) for x in rng.integers(1, 200, int(rng.integers(1, 6)))]
        cases.append({"hq": hq, "hkv": hkv, "d": d, "mode": mode, "sizes": sizes,
                      "seq_lens": lens, "threshold": want, "dpad": _pow2(d)})
    return cases


def test_builder_threshold_and_scratch():
    # The builder's threshold is 128 // num_kv_heads, replaced by the closest capture size (the
    # first on a tie) in the full CUDA graph modes; it allocates the three float32 scratch buffers
    # once, shaped by that threshold, and every metadata it builds carries them and the threshold.
    rng = fresh()
    cases = _builder_cases(rng)
    keys = ("hq", "hkv", "d", "mode", "sizes", "seq_lens")
    got = run(_DRIVER, _args("builder", cases=[{k: c[k] for k in keys} for c in cases]),
              timeout=600)["result"]
    assert isinstance(got, list) and len(got) == len(cases), f"results for {len(cases)} builders expected"
    for case, r in zip(cases, got):
        what = (f"builder with {case['hq']} query heads over {case['hkv']} KV heads, head size "
                f"{case['d']}, cudagraph_mode {case['mode']}, capture sizes {case['sizes']}")
        t = case["threshold"]
        assert r["threshold"] == t, f"{what}: seq_threshold_3D is {r['threshold']}, want {t}"
        assert r["segments"] == 16, f"{what}: num_par_softmax_segments is {r['segments']}, want 16"
        want = [[t, case["hq"], 16, case["dpad"]], [t, case["hq"], 16], [t, case["hq"], 16]]
        assert r["shapes"] == want, f"{what}: scratch shapes {r['shapes']}, want {want}"
        assert r["dtypes"] == ["torch.float32"] * 3, f"{what}: scratch dtypes {r['dtypes']}"
        assert r["on_gpu"] == [True] * 3, f"{what}: scratch buffers not on the GPU"
        assert isinstance(r["meta"], list) and len(r["meta"]) == 2
        for i, m in enumerate(r["meta"]):
            assert m["threshold"] == t and m["segments"] == 16, (
                f"{what}: metadata {i} carries threshold {m['threshold']} and "
                f"{m['segments']} segments, want {t} and 16")
            assert m["same"] == [True] * 3, (
                f"{what}: metadata {i} does not carry the builder's own scratch buffers "
                f"(same tensor per buffer: {m['same']})")
