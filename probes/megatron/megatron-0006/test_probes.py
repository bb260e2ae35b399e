"""Hidden probes for megatron-0006 (int64 block and Mamba decode indices in the inference
bookkeeping buffers).

The judge never imports megatron or torch. Children build ContextGPUView and
DynamicInferenceContext objects on a CUDA device (no process group: tensor and pipeline parallel
size 1) and send back, per field, its dtype, shape and byte offset inside the backing buffer, or
the values that arrive on the GPU after the per-step transfer. The judge recomputes the expected
layout from the table in the instruction with its own arithmetic."""

from infradev_probe import run

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


def expected_layout(T, R, K, C):
    """{field: (offset, dtype, shape)} and the buffer's total size, by the instruction's table:
    fields back to back in order; with Mamba fields (C > 0) the fewest bytes of padding before
    mamba_batch_indices_decode that make its offset a multiple of 8."""
    out, off = {}, 0
    for gpu, _, dtype, size, shape in TOKEN_AND_REQUEST:
        s = shape(T, R, K, C)
        out[gpu] = (off, dtype, s)
        n = size
        for d in s:
            n *= d
        off += n
    if C > 0:
        off += (-off) % 8
        for gpu, _, dtype, size, shape in MAMBA:
            s = shape(T, R, K, C)
            out[gpu] = (off, dtype, s)
            n = size
            for d in s:
                n *= d
            off += n
    return out, off


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

# (max_requests, max_tokens, max_kv_blocks, max_mamba_chunks): the bytes before the Mamba section
# are an odd multiple of 4 in the first, third, fifth and sixth cases (4 bytes of padding before a
# Mamba section; the third and sixth have none, so no padding) and a multiple of 8 in the second
# and fourth.
VIEW_CASES = [
    dict(R=5, T=34, K=8, C=3),
    dict(R=4, T=16, K=8, C=3),
    dict(R=3, T=17, K=5, C=0),
    dict(R=7, T=130, K=3, C=9),
    dict(R=1, T=3, K=1, C=1),
    dict(R=6, T=21, K=2, C=0),
]


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


def test_gpu_view_layout():
    out = run(PRELUDE + """
from megatron.core.inference.contexts.gpu_view import ContextGPUView

NAMES = ARGS["names"]
results = []
for c in ARGS["cases"]:
    try:
        v = ContextGPUView(max_requests=c["R"], max_tokens=c["T"], max_kv_blocks=c["K"],
                           device=torch.device("cuda"), max_mamba_chunks=c["C"])
    except Exception as e:
        results.append(dict(error=f"{type(e).__name__}: {e}"))
        continue
    results.append(dict(
        fields=describe(v._buf, {n: getattr(v, n) for n in NAMES}),
        total=v._buf.numel() * v._buf.element_size(),
        buf_dtype=str(v._buf.dtype).replace("torch.", ""),
        buf_device=v._buf.device.type,
    ))
emit(results=results)
""", args={"cases": VIEW_CASES, "names": GPU_NAMES})
    for c, got in zip(VIEW_CASES, out["results"]):
        where = f"ContextGPUView(max_requests={c['R']}, max_tokens={c['T']}, max_kv_blocks={c['K']}, max_mamba_chunks={c['C']})"
        assert "error" not in got, f"{where} raised {got.get('error')}"
        assert got["buf_dtype"] == "uint8" and got["buf_device"] == "cuda", \
            f"{where}: _buf is {got['buf_dtype']} on {got['buf_device']}, want one uint8 buffer on the GPU"
        total = check_layout(where, got["fields"], c["T"], c["R"], c["K"], c["C"], GPU_NAMES)
        assert got["total"] == total, f"{where}: _buf holds {got['total']} bytes, want exactly {total}"


# Contexts whose own dimensions make the bytes before the Mamba section an odd multiple of 4
# (first: 4 bytes of padding), a multiple of 8 (second), and an attention-only model (third).
CONTEXT_CASES = [
    dict(layers="MAMA", max_requests=5, max_tokens=334, max_seq=512, block=64, chunk=128),
    dict(layers="MA", max_requests=8, max_tokens=256, max_seq=300, block=32, chunk=64),
    dict(layers="AA", max_requests=3, max_tokens=101, max_seq=200, block=64, chunk=128),
]


def test_context_cpu_mirror_matches_gpu_view():
    out = run(CONTEXT_PRELUDE + """
results = []
for c in ARGS["cases"]:
    try:
        ctx = make_context(c)
    except Exception as e:
        results.append(dict(error=f"{type(e).__name__}: {e}"))
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
""", args={"cases": CONTEXT_CASES, "gpu": GPU_NAMES, "cpu": CPU_NAMES})
    for c, got in zip(CONTEXT_CASES, out["results"]):
        where = f"DynamicInferenceContext(layers {c['layers']}, max_requests {c['max_requests']}, max_tokens {c['max_tokens']})"
        assert "error" not in got, f"{where} raised {got.get('error')}"
        d = got["dims"]
        if "M" not in c["layers"]:
            assert d["C"] == 0, f"{where}: an attention-only context has {d['C']} Mamba chunks"
        T, R, K, C = d["T"], d["R"], d["K"], d["C"]
        assert got["cpu_device"] == "cpu" and got["pinned"], f"{where}: _cpu_bookkeeping_buf must stay in pinned CPU memory"
        total = check_layout(f"{where}, GPU view", got["gpu"], T, R, K, C, GPU_NAMES)
        cpu_names = [g for g in GPU_NAMES]
        if C == 0:
            cpu_names = [f[0] for f in TOKEN_AND_REQUEST]
        check_layout(f"{where}, CPU bookkeeping buffer", got["cpu"], T, R, K, C, cpu_names)
        assert got["gpu_total"] == total and got["cpu_total"] == total, (
            f"{where}: CPU buffer {got['cpu_total']} bytes, GPU buffer {got['gpu_total']} bytes, want both {total}")


TRANSFER_CASE = dict(layers="MAMA", max_requests=5, max_tokens=334, max_seq=512, block=64, chunk=128)


def test_transfer_carries_wide_indices():
    T = TRANSFER_CASE["max_tokens"]
    R = TRANSFER_CASE["max_requests"]
    # Block indices past 2**31 and 2**32 (an int32 slot cannot hold them), Mamba slot indices
    # past 2**31, and recognisable values in the neighbouring int32 fields.
    block_idx = [(1 << 31) + 7 * i if i % 3 else (1 << 32) + i for i in range(T)]
    decode = [(1 << 31) + 1000 + 11 * i for i in range(R)]
    local = [(i * 13) % 64 for i in range(T)]
    req_idx = [i % R for i in range(T)]
    pos = [1 << 40 | i for i in range(T)]
    prefill = [100 + i for i in range(R)]
    out = run(CONTEXT_PRELUDE + """
ctx = make_context(ARGS["case"])
ctx.token_to_block_idx.copy_(torch.tensor(ARGS["block_idx"], dtype=torch.int64))
ctx.token_to_pos_ids.copy_(torch.tensor(ARGS["pos"], dtype=torch.int64))
ctx.token_to_local_position_within_kv_block.copy_(torch.tensor(ARGS["local"], dtype=torch.int32))
ctx.token_to_request_idx.copy_(torch.tensor(ARGS["req_idx"], dtype=torch.int32))
ctx._cpu_mamba_batch_indices_decode.copy_(torch.tensor(ARGS["decode"], dtype=torch.int64))
ctx._cpu_mamba_batch_indices_prefill.copy_(torch.tensor(ARGS["prefill"], dtype=torch.int32))
ctx.transfer_bookkeeping_to_gpu()
torch.cuda.synchronize()
v = ctx.gpu_view
emit(block_idx=v.token_to_block_idx.cpu().tolist(), block_dtype=str(v.token_to_block_idx.dtype),
     pos=v.token_to_pos_ids.cpu().tolist(), local=v.token_to_local_position_within_kv_block.cpu().tolist(),
     req_idx=v.token_to_request_idx.cpu().tolist(), decode=v.mamba_batch_indices_decode.cpu().tolist(),
     decode_dtype=str(v.mamba_batch_indices_decode.dtype), prefill=v.mamba_batch_indices_prefill.cpu().tolist())
""", args=dict(case=TRANSFER_CASE, block_idx=block_idx, decode=decode, local=local, req_idx=req_idx, pos=pos,
               prefill=prefill))
    assert out["block_dtype"] == "torch.int64", f"gpu_view.token_to_block_idx is {out['block_dtype']}"
    assert out["decode_dtype"] == "torch.int64", f"gpu_view.mamba_batch_indices_decode is {out['decode_dtype']}"
    for name, want in (("token_to_block_idx", block_idx), ("token_to_pos_ids", pos),
                       ("token_to_local_position_within_kv_block", local), ("token_to_request_idx", req_idx),
                       ("mamba_batch_indices_decode", decode), ("mamba_batch_indices_prefill", prefill)):
        key = {"token_to_block_idx": "block_idx", "token_to_pos_ids": "pos",
               "token_to_local_position_within_kv_block": "local", "token_to_request_idx": "req_idx",
               "mamba_batch_indices_decode": "decode", "mamba_batch_indices_prefill": "prefill"}[name]
        got = out[key]
        bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        assert len(got) == len(want) and not bad, (
            f"after transfer_bookkeeping_to_gpu, gpu_view.{name} differs from the CPU values at "
            f"{len(bad)} positions (first {bad[:3]}: got {[got[i] for i in bad[:3]]}, want {[want[i] for i in bad[:3]]})")
