"""Hidden probes for megatron-0006 (int64 block and Mamba decode indices in the inference
bookkeeping buffers).

The judge never imports megatron or torch. Every size and value is drawn fresh for each attempt.
Children build ContextGPUView and DynamicInferenceContext objects on a CUDA device (no process
group: tensor and pipeline parallel size 1) and send back, per field, its dtype, shape and byte
offset inside the backing buffer, or the values that arrive on the GPU after the per-step
transfer. The judge recomputes the expected layout from the table in the instruction with its own
arithmetic, and knows the values it had the child write."""

import numpy as np

from infradev_probe import fresh, run

# The layout the instruction specifies: (GPU view field, CPU field in DynamicInferenceContext,
# dtype, item size, shape as a function of T, R, K, C).
TOKEN_AND_REQUEST = [
    ("token_to_input_ids", "token_to_input_ids", "int64", 8, lambda T, R, K, C: [T]),
    ("token_to_pos_ids", "token_to_pos_ids", "int64", 8, lambda T, R, K, C: [T]),
    ("token_to_block_idx", "token_to_block_idx", "int64", 8, lambda T, R, K, C: [T]),
    ("token_to_local_position_within_kv_block", "token_to_local_position_within_kv_block", "int32", 4,
     lambda T, R, K, C: [T]),
    ("token_to_request_idx", "token_to_request_idx", "int32", 4, lambda T, R, K, C: [T]),
    ("token_to_position_in_request", "token_to_position_in_request", "int32", 4, lambda T, R, K, C: [T]),
    ("request_in_prefill_status", "_staging_request_in_prefill_status", "int32", 4, lambda T, R, K, C: [R]),
    ("request_query_lengths", "_staging_request_query_lengths", "int32", 4, lambda T, R, K, C: [R]),
    ("request_kv_length_offsets", "_staging_request_kv_length_offsets", "int32", 4, lambda T, R, K, C: [R]),
    ("temperature", "_staging_temperature", "float32", 4, lambda T, R, K, C: [R]),
    ("top_k", "_staging_top_k", "int32", 4, lambda T, R, K, C: [R]),
    ("top_p", "_staging_top_p", "float32", 4, lambda T, R, K, C: [R]),
    ("active_request_last_token_idxs", "active_request_last_token_idxs", "int32", 4, lambda T, R, K, C: [R]),
    ("mha_query_lengths", "_cpu_mha_query_lengths", "int32", 4, lambda T, R, K, C: [R]),
    ("mha_cu_query_seq_lengths", "_cpu_mha_cu_query_seq_lengths", "int32", 4, lambda T, R, K, C: [R + 1]),
    ("mha_kv_seq_lengths", "_cpu_mha_kv_seq_lengths", "int32", 4, lambda T, R, K, C: [R]),
    ("mha_cu_kv_seq_lengths", "_cpu_mha_cu_kv_seq_lengths", "int32", 4, lambda T, R, K, C: [R + 1]),
    ("mha_block_table", "_cpu_mha_block_table", "int32", 4, lambda T, R, K, C: [R, K]),
]
MAMBA = [
    ("mamba_batch_indices_decode", "_cpu_mamba_batch_indices_decode", "int64", 8, lambda T, R, K, C: [R]),
    ("mamba_batch_indices_prefill", "_cpu_mamba_batch_indices_prefill", "int32", 4, lambda T, R, K, C: [R]),
    ("mamba_seq_idx", "_cpu_mamba_seq_idx", "int32", 4, lambda T, R, K, C: [1, T]),
    ("mamba_cu_seqlens", "_cpu_mamba_cu_seqlens", "int32", 4, lambda T, R, K, C: [R + 1]),
    ("mamba_cu_chunk_seqlens", "_cpu_mamba_cu_chunk_seqlens", "int32", 4, lambda T, R, K, C: [C + 1]),
    ("mamba_last_chunk_indices", "_cpu_mamba_last_chunk_indices", "int32", 4, lambda T, R, K, C: [R]),
    ("mamba_seq_idx_for_varlen", "_cpu_mamba_seq_idx_for_varlen", "int32", 4, lambda T, R, K, C: [C]),
    ("mamba_conv_seq_idx", "_cpu_mamba_conv_seq_idx", "int32", 4, lambda T, R, K, C: [T]),
    ("mamba_conv_seq_start", "_cpu_mamba_conv_seq_start", "int32", 4, lambda T, R, K, C: [T]),
]
GPU_NAMES = [f[0] for f in TOKEN_AND_REQUEST + MAMBA]
CPU_NAMES = [f[1] for f in TOKEN_AND_REQUEST + MAMBA]
# Fields transfer_bookkeeping_to_gpu refreshes from other state before its copy (the request
# staging slots); the transfer probe writes every other field.
REFRESHED = {"request_in_prefill_status", "request_query_lengths", "request_kv_length_offsets",
             "temperature", "top_k", "top_p"}


def expected_layout(T, R, K, C):
    """{field: (offset, dtype, shape)} and the buffer's total size, by the instruction's table:
    fields back to back in order; with Mamba fields (C > 0) the fewest bytes of padding before
    mamba_batch_indices_decode that make its offset a multiple of 8."""
    out, off = {}, 0
    for gpu, _, dtype, size, shape in TOKEN_AND_REQUEST:
        s = shape(T, R, K, C)
        out[gpu] = (off, dtype, s)
        off += size * int(np.prod(s))
    if C > 0:
        off += (-off) % 8
        for gpu, _, dtype, size, shape in MAMBA:
            s = shape(T, R, K, C)
            out[gpu] = (off, dtype, s)
            off += size * int(np.prod(s))
    return out, off


def needs_pad(T, R, K):
    """Whether the bytes before the Mamba section are an odd multiple of 4."""
    _, before = expected_layout(T, R, K, 0)
    return before % 8 != 0


PRELUDE = """
import torch

def describe(buf, fields):
    \"\"\"Per field: [byte offset in buf, dtype name, shape], or None when the field is None.\"\"\"
    base = buf.data_ptr()
    out = {}
    for name, t in fields.items():
        if t is None:
            out[name] = None
        else:
            out[name] = [t.data_ptr() - base, str(t.dtype).replace("torch.", ""), list(t.shape)]
    return out
"""

CONTEXT_PRELUDE = PRELUDE + """
from megatron.core.inference.config import InferenceConfig, MambaInferenceStateConfig
from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
from megatron.core.ssm.mamba_hybrid_layer_allocation import Symbols
from megatron.core.transformer.transformer_config import TransformerConfig

def make_context(c):
    layers = c["layers"]
    mamba = None
    if "M" not in layers:
        # An attention-only context asks parallel_state for its pipeline rank; there is no
        # process group here, so fix the rank and size the way a single-rank setup reports them.
        from megatron.core import parallel_state
        parallel_state.set_pipeline_model_parallel_rank(0)
        parallel_state.set_pipeline_model_parallel_world_size(1)
    if "M" in layers:
        mamba = MambaInferenceStateConfig(
            [Symbols.MAMBA if s == "M" else Symbols.ATTENTION for s in layers],
            (64, 4), (2, 16, 8), torch.float32, torch.float32, mamba_chunk_size=c["chunk"])
    model = TransformerConfig(params_dtype=torch.float32, num_layers=len(layers), kv_channels=16,
                              num_attention_heads=2)
    cfg = InferenceConfig(max_sequence_length=c["max_seq"], buffer_size_gb=0.004,
                          block_size_tokens=c["block"], max_tokens=c["max_tokens"],
                          max_requests=c["max_requests"], mamba_inference_state_config=mamba,
                          unified_memory_level=0)
    return DynamicInferenceContext(model_config=model, inference_config=cfg)

def dims(ctx):
    return dict(T=ctx.max_tokens, R=ctx.max_requests, K=ctx.max_kv_block_count,
                C=getattr(ctx, "_max_mamba_chunks", 0))
"""


def check_layout(where, got, T, R, K, C, names):
    want, total = expected_layout(T, R, K, C)
    for name in names:
        if name not in want:
            assert got[name] is None, f"{where}: {name} must be None without Mamba fields, got {got[name]}"
            continue
        assert got[name] is not None, f"{where}: {name} is None"
        off, dtype, shape = want[name]
        assert got[name][1] == dtype, f"{where}: {name} has dtype {got[name][1]}, want {dtype}"
        assert list(got[name][2]) == shape, f"{where}: {name} has shape {got[name][2]}, want {shape}"
        assert got[name][0] == off, f"{where}: {name} starts at byte {got[name][0]}, want {off}"
    return total


def view_cases(rng):
    """Random view sizes covering: Mamba fields needing 4 bytes of padding, Mamba fields needing
    none, and no Mamba fields with the token and request bytes ending off an 8-byte boundary."""
    kinds = ["pad", "nopad", "none_odd"] + [str(rng.choice(["pad", "nopad", "none_odd", "none_even"]))
                                           for _ in range(int(rng.integers(2, 6)))]
    rng.shuffle(kinds)
    cases = []
    for kind in kinds:
        while True:
            R, T, K = int(rng.integers(1, 40)), int(rng.integers(1, 400)), int(rng.integers(1, 20))
            pad = needs_pad(T, R, K)
            if kind in ("pad", "none_odd") and not pad or kind in ("nopad", "none_even") and pad:
                continue
            C = int(rng.integers(1, 30)) if kind in ("pad", "nopad") else 0
            cases.append(dict(R=R, T=T, K=K, C=C))
            break
    return cases


def test_gpu_view_layout():
    rng = fresh()
    cases = view_cases(rng)
    out = run(PRELUDE + """
from megatron.core.inference.contexts.gpu_view import ContextGPUView

NAMES = ARGS["names"]
results = []
for c in ARGS["cases"]:
    try:
        v = ContextGPUView(max_requests=c["R"], max_tokens=c["T"], max_kv_blocks=c["K"],
                           device=torch.device("cuda"), max_mamba_chunks=c["C"])
    except Exception as e:
        results.append(dict(error=type(e).__name__))
        continue
    results.append(dict(
        fields=describe(v._buf, {n: getattr(v, n) for n in NAMES}),
        total=v._buf.numel() * v._buf.element_size(),
        buf_dtype=str(v._buf.dtype).replace("torch.", ""),
        buf_device=v._buf.device.type,
    ))
emit(results=results)
""", args={"cases": cases, "names": GPU_NAMES})
    assert len(out["results"]) == len(cases), f"{len(out['results'])} results for {len(cases)} views"
    for c, got in zip(cases, out["results"]):
        where = f"ContextGPUView(max_requests={c['R']}, max_tokens={c['T']}, max_kv_blocks={c['K']}, max_mamba_chunks={c['C']})"
        assert "error" not in got, f"{where} raised {got.get('error')}"
        total = check_layout(where, got["fields"], c["T"], c["R"], c["K"], c["C"], GPU_NAMES)
        assert got["total"] == total, f"{where}: _buf holds {got['total']} bytes, want exactly {total}"
    for c, got in zip(cases, out["results"]):
        assert got["buf_dtype"] == "uint8" and got["buf_device"] == "cuda", \
            f"ContextGPUView({c}): _buf is {got['buf_dtype']} on {got['buf_device']}, want one uint8 buffer on the GPU"


def context_case(rng, kind):
    """A context whose own dimensions give: hybrid with 4 bytes of padding ("pad"), hybrid
    without ("nopad"), or attention-only with the fields ending off ("attn_odd") or on
    ("attn_even") an 8-byte boundary."""
    while True:
        block = int(rng.choice([16, 32, 64, 128]))
        max_seq = int(rng.integers(64, 1200))
        R = int(rng.integers(1, 24))
        T = int(rng.integers(max(R, 8), 700))
        K = -(-max_seq // block)
        pad = needs_pad(T, R, K)
        if kind in ("pad", "attn_odd") and not pad or kind in ("nopad", "attn_even") and pad:
            continue
        n = int(rng.integers(2, 6))
        if kind.startswith("attn"):
            layers = "A" * n
        else:
            layers = "".join("M" if rng.random() < 0.5 else "A" for _ in range(n))
            if "M" not in layers or "A" not in layers:
                continue
        return dict(layers=layers, max_requests=R, max_tokens=T, max_seq=max_seq, block=block,
                    chunk=int(rng.choice([32, 64, 128, 256])))


def expected_dims(c):
    R, T = c["max_requests"], c["max_tokens"]
    C = T // c["chunk"] + R if "M" in c["layers"] else 0
    return dict(T=T, R=R, K=-(-c["max_seq"] // c["block"]), C=C)


def test_context_cpu_mirror_matches_gpu_view():
    rng = fresh()
    kinds = ["pad", "nopad", "attn_odd"] + [str(rng.choice(["pad", "nopad", "attn_odd", "attn_even"]))
                                            for _ in range(int(rng.integers(0, 3)))]
    rng.shuffle(kinds)
    cases = [context_case(rng, k) for k in kinds]
    out = run(CONTEXT_PRELUDE + """
results = []
for c in ARGS["cases"]:
    try:
        ctx = make_context(c)
    except Exception as e:
        results.append(dict(error=type(e).__name__))
        continue
    cpu = {}
    for g, n in zip(ARGS["gpu"], ARGS["cpu"]):
        cpu[g] = getattr(ctx, n, None)
    buf = ctx._cpu_bookkeeping_buf
    results.append(dict(
        dims=dims(ctx),
        cpu=describe(buf, cpu),
        gpu=describe(ctx.gpu_view._buf, {g: getattr(ctx.gpu_view, g) for g in ARGS["gpu"]}),
        cpu_total=buf.numel() * buf.element_size(),
        gpu_total=ctx.gpu_view._buf.numel() * ctx.gpu_view._buf.element_size(),
        cpu_device=buf.device.type,
        pinned=bool(buf.is_pinned()),
    ))
emit(results=results)
""", args={"cases": cases, "gpu": GPU_NAMES, "cpu": CPU_NAMES})
    assert len(out["results"]) == len(cases), f"{len(out['results'])} results for {len(cases)} contexts"
    for c, got in zip(cases, out["results"]):
        where = (f"DynamicInferenceContext(layers {c['layers']}, max_requests {c['max_requests']}, max_tokens "
                 f"{c['max_tokens']}, max_sequence_length {c['max_seq']}, block_size_tokens {c['block']}, "
                 f"mamba_chunk_size {c['chunk']})")
        assert "error" not in got, f"{where} raised {got.get('error')}"
        d = expected_dims(c)
        assert got["dims"] == d, f"{where}: max_tokens, max_requests, max_kv_block_count, _max_mamba_chunks are {got['dims']}, want {d}"
        T, R, K, C = d["T"], d["R"], d["K"], d["C"]
        assert got["cpu_device"] == "cpu" and got["pinned"], f"{where}: _cpu_bookkeeping_buf must stay in pinned CPU memory"
        total = check_layout(f"{where}, GPU view", got["gpu"], T, R, K, C, GPU_NAMES)
        cpu_names = GPU_NAMES if C else [f[0] for f in TOKEN_AND_REQUEST]
        check_layout(f"{where}, CPU bookkeeping buffer", got["cpu"], T, R, K, C, cpu_names)
        assert got["gpu_total"] == total and got["cpu_total"] == total, (
            f"{where}: CPU buffer {got['cpu_total']} bytes, GPU buffer {got['gpu_total']} bytes, want both {total}")


def test_transfer_carries_wide_indices():
    rng = fresh()
    # bytes before the Mamba section an odd multiple of 4: decode indices sit after padding
    case = context_case(rng, "pad")
    d = expected_dims(case)
    T, R, K, C = d["T"], d["R"], d["K"], d["C"]
    shapes = {f[0]: (f[2], f[4](T, R, K, C)) for f in TOKEN_AND_REQUEST + MAMBA}
    values = {}
    for name, (dtype, shape) in shapes.items():
        if name in REFRESHED:
            continue
        if dtype == "int64":
            # past 2**31 and 2**32: an int32 slot cannot hold them
            v = rng.integers(1 << 31, 1 << 40, size=shape, dtype=np.int64)
            v[rng.random(shape) < 0.3] = rng.integers(0, 1 << 16)
        else:
            v = rng.integers(-(1 << 31), 1 << 31, size=shape, dtype=np.int64).astype(np.int32)
        values[name] = v
    cpu_of = {f[0]: f[1] for f in TOKEN_AND_REQUEST + MAMBA}
    out = run(CONTEXT_PRELUDE + """
import numpy as np
ctx = make_context(ARGS["case"])
for name, v in ARGS["values"].items():
    getattr(ctx, ARGS["cpu_of"][name]).copy_(torch.from_numpy(np.ascontiguousarray(v)))
ctx.transfer_bookkeeping_to_gpu()
torch.cuda.synchronize()
v = ctx.gpu_view
emit(got={name: getattr(v, name).cpu().numpy() for name in ARGS["values"]},
     dtypes={name: str(getattr(v, name).dtype).replace("torch.", "") for name in ARGS["values"]})
""", args=dict(case=case, values=values, cpu_of=cpu_of))
    want_dtypes = {name: shapes[name][0] for name in values}
    assert out["dtypes"] == want_dtypes, f"gpu_view field dtypes {out['dtypes']}, want {want_dtypes}"
    where = (f"a hybrid context (layers {case['layers']}, max_requests {R}, max_tokens {T}, "
             f"{K} KV blocks per request, {C} Mamba chunks)")
    for name, want in values.items():
        got = out["got"][name]
        assert got.shape == want.shape, f"{where}: gpu_view.{name} has shape {got.shape}, want {want.shape}"
        bad = np.flatnonzero(got.astype(np.int64).ravel() != want.astype(np.int64).ravel())
        assert bad.size == 0, (
            f"{where}: after transfer_bookkeeping_to_gpu, gpu_view.{name} differs from what was written "
            f"to ctx.{cpu_of[name]} at {bad.size} of {want.size} positions (first {bad[:3].tolist()}: got "
            f"{got.ravel()[bad[:3]].tolist()}, want {want.ravel()[bad[:3]].tolist()})")
