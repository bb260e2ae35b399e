"""Hidden probes for vllm-0010 (caller-provided scratch buffers for the 3D Triton attention kernel,
so that decode attention can run inside CUDA graphs).

The judge never imports vllm or torch. Each probe runs one driver in a child process on one GPU:
the driver calls unified_attention (or builds a TritonAttentionMetadataBuilder) with inputs the
judge made, and sends back the attention output, the scratch buffers as they are afterwards (with
the guard space around them), and GPU memory figures. The judge makes every query, paged KV cache
and block table itself (float16 values, so both sides see the same numbers), computes the
reference attention in float64 with numpy, and derives from the instruction's rules which batches
must take the 3D path (and so write the scratch buffers) and which thresholds a builder must pick.
Every probe runs in a child of its own: a scenario that hangs or crashes fails its probe only."""

import functools

import numpy as np

from infradev_probe import run

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
        common = CommonAttentionMetadata(
            query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV),
            query_start_loc_cpu=torch.tensor([0, 1, 2], dtype=torch.int32),
            seq_lens=torch.tensor([5, 9], dtype=torch.int32, device=DEV),
            num_reqs=2, num_actual_tokens=2, max_query_len=1, max_seq_len=9,
            block_table_tensor=torch.zeros((2, 4), dtype=torch.int32, device=DEV),
            slot_mapping=torch.tensor([4, 24], dtype=torch.int64, device=DEV),
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


def _drive(scenario, timeout=600, **args):
    args.update(scenario=scenario)
    return run(_DRIVER, args, timeout=timeout)["result"]


# ---- the judge's own batches and reference ----

_BS = 16


def _batch(seed, q_lens, kv_lens, hq, hkv, d):
    rng = np.random.default_rng(seed)
    nblk = [-(-n // _BS) for n in kv_lens]
    num_blocks = sum(nblk) + 5
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
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: output shape {got.shape}, want {want.shape}"
    err = np.abs(got - want)
    bad = err > 2e-2 + 2e-2 * np.abs(want)
    if bad.any():
        tok, head, _ = (int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} output values differ from the reference attention "
            f"(largest error {err.max():.3g}; first at token {tok}, head {head})")


def _decode(seed, kv_lens, hq=8, hkv=2, d=64):
    return _batch(seed, [1] * len(kv_lens), kv_lens, hq, hkv, d)


def _kv_lens(seed, n, lo=17, hi=300):
    return [int(x) for x in np.random.default_rng(seed).integers(lo, hi, n)]


# Eight query heads over two KV heads, head size 64 (scratch rows padded to 64), 16 segments.
# The expected path follows the instruction: 3D exactly when the scratch is given, every query
# length is 1 and the number of sequences is at most seq_threshold_3D.
_CHOICE = [
    {"name": "6 decodes, threshold 8", "batch": _decode(1, _kv_lens(1, 6)), "threshold": 8,
     "rows": 8, "dpad": 64, "path": "3d"},
    {"name": "8 decodes, threshold 8", "batch": _decode(2, _kv_lens(2, 8)), "threshold": 8,
     "rows": 8, "dpad": 64, "path": "3d"},
    {"name": "12 decodes, threshold 8", "batch": _decode(3, _kv_lens(3, 12)), "threshold": 8,
     "rows": 8, "dpad": 64, "path": "2d"},
    {"name": "a prefill among decodes, threshold 8",
     "batch": _batch(4, [1, 5, 1], [200, 37, 90], 8, 2, 64), "threshold": 8, "rows": 8,
     "dpad": 64, "path": "2d"},
    {"name": "16 decodes, one query head per KV head, threshold 16",
     "batch": _decode(5, _kv_lens(5, 16), hq=4, hkv=4), "threshold": 16, "rows": 16,
     "dpad": 64, "path": "3d"},
    {"name": "6 decodes without scratch buffers", "batch": _decode(6, _kv_lens(6, 6)),
     "threshold": None, "path": "2d"},
]

# Scratch sized for fewer segments than the usual 16, each buffer at the start of a NaN-filled
# tensor four times its size.
_SEGMENTS = [
    {"name": "5 decodes, 4 segments, threshold 6", "batch": _decode(11, _kv_lens(11, 5, 100, 700)),
     "threshold": 6, "rows": 6, "segments": 4, "dpad": 64, "guard": 4},
    {"name": "7 decodes, 8 segments, threshold 7", "batch": _decode(12, _kv_lens(12, 7, 60, 500)),
     "threshold": 7, "rows": 7, "segments": 8, "dpad": 64, "guard": 4},
]

# Sixteen decodes, 32 query heads over 4 KV heads: scratch of this size would be 2 MiB.
_MEMORY = {"batch": _decode(21, _kv_lens(21, 16, 20, 64), hq=32, hkv=4), "threshold": 16,
           "rows": 16, "dpad": 64}
_MEMORY_LIMIT = 256 << 10

_BUILDERS = [
    {"hq": 32, "hkv": 8, "d": 128, "mode": "NONE", "sizes": [], "threshold": 16, "dpad": 128},
    {"hq": 32, "hkv": 8, "d": 96, "mode": "FULL_AND_PIECEWISE", "sizes": [1, 2, 4, 12, 40, 64],
     "threshold": 12, "dpad": 128},
    {"hq": 16, "hkv": 2, "d": 64, "mode": "PIECEWISE", "sizes": [1, 2, 4, 8], "threshold": 64,
     "dpad": 64},
    {"hq": 12, "hkv": 3, "d": 80, "mode": "FULL_DECODE_ONLY",
     "sizes": [1, 2, 4, 8, 16, 24, 32, 48], "threshold": 48, "dpad": 128},
    {"hq": 8, "hkv": 1, "d": 64, "mode": "FULL", "sizes": [1, 2, 4, 8, 16, 32, 64, 96, 256],
     "threshold": 96, "dpad": 64},
]


def _strip(case):
    return {k: v for k, v in case.items() if k not in ("name", "path")}


@functools.lru_cache(maxsize=None)
def _scenario(name):
    if name == "choice":
        return _drive("choice", cases=[_strip(c) for c in _CHOICE])
    if name == "segments":
        return _drive("segments", cases=[_strip(c) for c in _SEGMENTS])
    if name == "memory":
        return _drive("memory", **_MEMORY)
    return _drive("builder", cases=[{k: c[k] for k in ("hq", "hkv", "d", "mode", "sizes")}
                                    for c in _BUILDERS])


def test_kernel_choice_follows_threshold():
    # With scratch buffers given, a decode-only batch of at most seq_threshold_3D sequences runs
    # the 3D kernel (which writes the scratch); more sequences, a prefill in the batch, or no
    # scratch runs the 2D kernel (which leaves the NaN-filled scratch untouched). Every output
    # matches the reference.
    got = _scenario("choice")
    assert len(got) == len(_CHOICE), f"{len(got)} results for {len(_CHOICE)} cases"
    for case, r in zip(_CHOICE, got):
        b = case["batch"]
        _check_out(r["out"], b, case["name"])
        if case["threshold"] is None:
            continue
        out_buf, max_buf, sum_buf = (np.asarray(x) for x in r["buffers"])
        n = len(b["kv_lens"])
        hq = b["q"].shape[1]
        if case["path"] == "3d":
            seg_max = max_buf.reshape(case["rows"], hq, 16)[:n, :, 0]
            assert not np.isnan(seg_max).any(), (
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
    got = _scenario("segments")
    assert len(got) == len(_SEGMENTS), f"{len(got)} results for {len(_SEGMENTS)} cases"
    for case, r in zip(_SEGMENTS, got):
        _check_out(r["out"], case["batch"], case["name"])
        hq = case["batch"]["q"].shape[1]
        sizes = [case["rows"] * hq * case["segments"] * case["dpad"],
                 case["rows"] * hq * case["segments"], case["rows"] * hq * case["segments"]]
        for what, whole, n in zip(("softmax_segm_output", "softmax_segm_max", "softmax_segm_expsum"),
                                  r["buffers"], sizes):
            guard = np.asarray(whole)[n:]
            written = int((~np.isnan(guard)).sum())
            assert written == 0, (
                f"{case['name']}: {written} values written past the end of {what} "
                f"(shaped for {case['segments']} segments)")


def test_no_gpu_allocation_on_the_3d_path():
    # A decode batch on the 3D path with the scratch given allocates no GPU memory of its own
    # (scratch of its size would be 2 MiB), and its output matches the reference.
    r = _scenario("memory")
    _check_out(r["out"], _MEMORY["batch"], "16 decodes on the 3D path")
    assert r["extra"] < _MEMORY_LIMIT, (
        f"unified_attention allocated {r['extra'] / 2**20:.2f} MiB of GPU memory during a 3D-path "
        f"call although the scratch buffers were given")


def test_builder_threshold_and_scratch():
    # The builder's threshold is 128 // num_kv_heads, replaced by the closest capture size in the
    # full CUDA graph modes; it allocates the three float32 scratch buffers once, shaped by that
    # threshold, and every metadata it builds carries them and the threshold.
    got = _scenario("builder")
    assert len(got) == len(_BUILDERS), f"{len(got)} results for {len(_BUILDERS)} builders"
    for case, r in zip(_BUILDERS, got):
        what = (f"builder with {case['hkv']} KV heads, cudagraph_mode {case['mode']}, "
                f"capture sizes {case['sizes']}")
        t = case["threshold"]
        assert r["threshold"] == t, f"{what}: seq_threshold_3D is {r['threshold']}, want {t}"
        assert r["segments"] == 16, f"{what}: num_par_softmax_segments is {r['segments']}, want 16"
        want = [[t, case["hq"], 16, case["dpad"]], [t, case["hq"], 16], [t, case["hq"], 16]]
        assert r["shapes"] == want, f"{what}: scratch shapes {r['shapes']}, want {want}"
        assert r["dtypes"] == ["torch.float32"] * 3, f"{what}: scratch dtypes {r['dtypes']}"
        assert all(r["on_gpu"]), f"{what}: scratch buffers not on the GPU"
        for i, m in enumerate(r["meta"]):
            assert m["threshold"] == t and m["segments"] == 16, (
                f"{what}: metadata {i} carries threshold {m['threshold']} and "
                f"{m['segments']} segments, want {t} and 16")
            assert all(m["same"]), (
                f"{what}: metadata {i} does not carry the builder's own scratch buffers "
                f"(same tensor per buffer: {m['same']})")
