"""Hidden probes for megatron-0005 (hybrid-model KV/Mamba memory split derived from max_requests).

The judge never imports megatron or torch. Children build DynamicInferenceContext objects on a
CUDA device (no process group: tensor and pipeline parallel size 1) and send back block counts,
state shapes, CUDA allocator figures and log records; the judge recomputes the expected split
from the instruction's rule with its own arithmetic, and checks the memory a context takes against
the GPU's used memory it reads through NVML itself."""

import math
import re

from infradev_probe import measure, run

PRELUDE = """
import dataclasses
import gc
import logging
from unittest import mock

import torch

from megatron.core.inference.config import InferenceConfig, MambaInferenceStateConfig
from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
from megatron.core.ssm.mamba_hybrid_layer_allocation import Symbols
from megatron.core.transformer.transformer_config import TransformerConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SYMBOLS = {"M": Symbols.MAMBA, "A": Symbols.ATTENTION}


def make_context(cfg, **extra):
    layers = cfg["layers"]
    mamba = None
    if "M" in layers:
        mamba = MambaInferenceStateConfig(
            [SYMBOLS[c] for c in layers],
            tuple(cfg["conv"]),
            tuple(cfg["ssm"]),
            DTYPES[cfg["conv_dtype"]],
            DTYPES[cfg["ssm_dtype"]],
        )
    model = TransformerConfig(
        params_dtype=torch.float32,
        num_layers=len(layers),
        kv_channels=cfg["kv_channels"],
        num_attention_heads=cfg["heads"],
    )
    kw = dict(
        max_sequence_length=cfg["max_seq"],
        buffer_size_gb=cfg["buffer_gb"],
        paused_buffer_size_gb=cfg["paused_gb"],
        block_size_tokens=cfg["block_tokens"],
        max_tokens=cfg["max_tokens"],
        mamba_inference_state_config=mamba,
        max_requests=cfg["max_requests"],
        unified_memory_level=0,
    )
    if cfg.get("ratio") is not None:
        kw["mamba_memory_ratio"] = cfg["ratio"]
    if cfg.get("spec"):
        kw["num_speculative_tokens"] = cfg["spec"]
    kw.update(extra)
    return DynamicInferenceContext(model_config=model, inference_config=InferenceConfig(**kw))


def describe(ctx):
    out = dict(
        total=ctx.kv_block_allocator.total_count,
        paused=ctx.kv_block_allocator.paused_count,
        max_requests=ctx.max_requests,
    )
    if getattr(ctx, "mamba_conv_states", None) is not None:
        out["conv_rows"] = ctx.mamba_conv_states.shape[1]
        out["ssm_rows"] = ctx.mamba_ssm_states.shape[1]
    return out
"""

GIB = 1024**3
MIB = 1 << 20
ITEMSIZE = {"float32": 4, "bfloat16": 2}


def cfg(layers, **kw):
    base = dict(layers=layers, heads=4, kv_channels=32, block_tokens=64, conv=(256, 4), ssm=(4, 32, 16),
                conv_dtype="float32", ssm_dtype="float32", buffer_gb=0.02, paused_gb=0.005,
                max_requests=None, max_seq=512, max_tokens=2048, ratio=None, spec=0)
    base.update(kw)
    return base


def block_bytes(c):
    """KV block size: fp32 keys and values of every attention layer for block_tokens tokens."""
    return 4 * 2 * c["layers"].count("A") * c["block_tokens"] * c["heads"] * c["kv_channels"]


def mamba_bytes_per_request(c):
    one = (math.prod(c["conv"]) * ITEMSIZE[c["conv_dtype"]]
           + math.prod(c["ssm"]) * ITEMSIZE[c["ssm_dtype"]]) * c["layers"].count("M")
    return one + (one * (c["spec"] + 1) if c["spec"] else 0)


def budgets(c):
    b = int(c["buffer_gb"] * GIB)
    p = 0 if c["paused_gb"] is None else int(c["paused_gb"] * GIB)
    return b, p


def expected_split(c):
    """The max_requests rule: reserve exactly max_requests requests' Mamba state out of the
    whole budget and scale both KV budgets down by that share."""
    b, p = budgets(c)
    needed = c["max_requests"] * mamba_bytes_per_request(c)
    ratio = needed / (b + p)
    b2 = int(b * (1.0 - ratio))
    p2 = int(p * (1.0 - ratio))
    bs = block_bytes(c)
    return dict(total=max(2, b2 // bs), paused=p2 // bs)


SPLIT_CASES = [
    cfg("MAMA", max_requests=24),
    cfg("AMM", heads=8, kv_channels=16, block_tokens=128, conv=(512, 4), ssm=(8, 16, 32),
        conv_dtype="bfloat16", buffer_gb=0.03, paused_gb=None, max_requests=8),
    cfg("MA", heads=8, kv_channels=64, conv=(544, 4), ssm=(8, 64, 16), buffer_gb=0.04, paused_gb=0.01,
        max_requests=12, spec=2),
]


def test_max_requests_split_block_counts():
    out = run(PRELUDE + """
emit(results=[describe(make_context(c)) for c in ARGS["cases"]])
""", args={"cases": SPLIT_CASES})
    for c, got in zip(SPLIT_CASES, out["results"]):
        want = expected_split(c)
        where = (f"layers {c['layers']}, max_requests {c['max_requests']}, speculative tokens {c['spec']}, "
                 f"buffer {c['buffer_gb']} GB, paused {c['paused_gb']} GB")
        assert got["total"] == want["total"], f"{where}: {got['total']} KV blocks, want {want['total']}"
        assert got["paused"] == want["paused"], f"{where}: {got['paused']} paused KV blocks, want {want['paused']}"
        assert got["max_requests"] == c["max_requests"], f"{where}: max_requests became {got['max_requests']}"
        assert got.get("conv_rows") == c["max_requests"] and got.get("ssm_rows") == c["max_requests"], \
            f"{where}: Mamba states sized for {got.get('conv_rows')} / {got.get('ssm_rows')} requests"


MEMORY_CASE = cfg("MAMA", heads=8, kv_channels=128, block_tokens=256, conv=(1024, 4), ssm=(8, 64, 64),
                  buffer_gb=0.25, paused_gb=0.01, max_requests=32, max_seq=1024, spec=3)


# The judge's own reading, through NVML from outside the child: the GPU's used memory with the
# context built, above a child that only holds a CUDA context, may differ from the budget by the
# allocator's rounding and the kernels the construction loads, not by a buffer.
OBSERVED_SLACK_LOW, OBSERVED_SLACK_HIGH = 32 * MIB, 128 * MIB


def test_kv_and_mamba_state_fill_the_budget():
    # The reference holds a CUDA context and runs nothing of the repository.
    _, without = measure("""
import torch
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
""", gpu=True, repository=False)
    out, usage = measure(PRELUDE + """
gc.collect()
torch.cuda.synchronize()
base = torch.cuda.memory_allocated()
ctx = make_context(ARGS["case"])
torch.cuda.synchronize()
emit(delta=torch.cuda.memory_allocated() - base, **describe(ctx))
""", args={"case": MEMORY_CASE}, gpu=True)
    b, p = budgets(MEMORY_CASE)
    bs = block_bytes(MEMORY_CASE)
    low, high = b - bs, b + p + 8 * MIB
    seen = usage.gpu_peak_bytes - without.gpu_peak_bytes
    assert low - OBSERVED_SLACK_LOW <= seen <= high + OBSERVED_SLACK_HIGH, (
        f"building the context raised the GPU's used memory (read through NVML by the judge) "
        f"{seen / MIB:.1f} MiB above a child holding only a CUDA context, want between "
        f"{(low - OBSERVED_SLACK_LOW) / MIB:.1f} and {(high + OBSERVED_SLACK_HIGH) / MIB:.1f} MiB")
    assert low <= out["delta"] <= high, (
        f"the context allocated {out['delta'] / MIB:.1f} MiB on the GPU ({out['total']} KV blocks of "
        f"{bs / MIB:.0f} MiB, Mamba state for {MEMORY_CASE['max_requests']} requests with "
        f"{MEMORY_CASE['spec']} speculative tokens), want between {low / MIB:.1f} and {high / MIB:.1f} MiB: "
        f"KV cache plus Mamba state must fill, and stay within, buffer_size_gb + paused_buffer_size_gb")


RATIO_CASE = cfg("MAMA", max_requests=16, ratio=0.3)
PLAIN_CASE = cfg("AAA", max_requests=16)
AUTO_CASE = cfg("MAMA")


def test_ratio_and_non_hybrid_paths_are_unchanged():
    out = run(PRELUDE + """
emit(ratio=describe(make_context(ARGS["ratio"])), plain=describe(make_context(ARGS["plain"])),
     auto=describe(make_context(ARGS["auto"])))
""", args={"ratio": RATIO_CASE, "plain": PLAIN_CASE, "auto": AUTO_CASE})
    b, p = budgets(RATIO_CASE)
    bs = block_bytes(RATIO_CASE)
    want = dict(total=max(2, int(b * 0.7) // bs), paused=int(p * 0.7) // bs)
    got = out["ratio"]
    assert (got["total"], got["paused"]) == (want["total"], want["paused"]), \
        f"mamba_memory_ratio=0.3 with max_requests=16: {got['total']} / {got['paused']} KV blocks, " \
        f"want {want['total']} / {want['paused']} (an explicit ratio wins over the max_requests split)"
    assert got["max_requests"] == 16, f"mamba_memory_ratio with max_requests: max_requests became {got['max_requests']}"

    bs = block_bytes(PLAIN_CASE)
    got = out["plain"]
    assert (got["total"], got["paused"]) == (max(2, b // bs), p // bs), \
        f"attention-only model with max_requests=16: {got['total']} / {got['paused']} KV blocks, " \
        f"want {max(2, b // bs)} / {p // bs} (the whole budget goes to KV blocks)"

    bs = block_bytes(AUTO_CASE) + mamba_bytes_per_request(AUTO_CASE)
    got = out["auto"]
    assert (got["total"], got["paused"]) == (max(2, b // bs), p // bs), \
        f"hybrid model without max_requests or ratio: {got['total']} / {got['paused']} KV blocks, " \
        f"want {max(2, b // bs)} / {p // bs} (budget divided by KV block plus one request's Mamba state)"


# One request's Mamba state is exactly 1 MiB (fp32 conv 2048x4 and SSM 8x64x496, one Mamba
# layer) and the budget exactly 64 MiB, so 64 requests need the whole budget.
TIGHT = cfg("MA", conv=(2048, 4), ssm=(8, 64, 496), buffer_gb=0.0625, paused_gb=None)


def test_oversubscribed_mamba_state_is_refused():
    out = run(PRELUDE + """
results = {}
for n in (63, 64, 65):
    case = dict(ARGS["case"], max_requests=n)
    try:
        results[str(n)] = ["ok", describe(make_context(case))]
    except AssertionError as e:
        results[str(n)] = ["AssertionError", str(e)]
    except Exception as e:
        results[str(n)] = [type(e).__name__, str(e)]
    gc.collect()
    torch.cuda.empty_cache()
emit(**results)
""", args={"case": TIGHT})
    assert mamba_bytes_per_request(TIGHT) == MIB and sum(budgets(TIGHT)) == 64 * MIB, "probe setup"
    assert out["63"][0] == "ok", f"63 requests (1 MiB left for KV blocks) must fit: {out['63']}"
    assert out["63"][1]["total"] == MIB // block_bytes(TIGHT), f"63 requests: {out['63'][1]}"
    for n in ("64", "65"):
        assert out[n][0] == "AssertionError", \
            f"max_requests={n} needs {n} MiB of Mamba state out of a 64 MiB budget: got {out[n][0]}, want an AssertionError"


def test_summary_logged_only_when_verbose():
    out = run(PRELUDE + """
from megatron.core.inference.contexts.dynamic_context import get_mem_size_str

records = []

class Grab(logging.Handler):
    def emit(self, record):
        records.append([record.levelno, record.getMessage()])

root = logging.getLogger()
root.setLevel(logging.DEBUG)
root.addHandler(Grab())

def mentions():
    found = [m for level, m in records if level >= logging.INFO and "DynamicInferenceContext" in m]
    records.clear()
    return found

case = ARGS["case"]
records.clear()
make_context(case)
quiet = mentions()
with mock.patch("torch.distributed.get_rank", return_value=0):
    ctx = make_context(case, verbose=True)
loud = mentions()
with mock.patch("torch.distributed.get_rank", return_value=1):
    make_context(case, verbose=True)
other_rank = mentions()
emit(quiet=quiet, loud=loud, other_rank=other_rank, total=ctx.kv_block_allocator.total_count,
     max_requests=ctx.max_requests, fields=[f.name for f in dataclasses.fields(InferenceConfig)],
     zero=get_mem_size_str(0))
""", args={"case": cfg("MAMA", max_requests=24)})
    assert out["quiet"] == [], f"without verbose the context logged {out['quiet']}"
    assert out["other_rank"] == [], f"verbose on rank 1 logged {out['other_rank']}; only rank 0 logs"
    assert len(out["loud"]) == 1, f"verbose on rank 0: want one summary record, got {out['loud']}"
    text = out["loud"][0]
    assert text.splitlines()[0].strip() == "DynamicInferenceContext: configuration summary", \
        f"the summary's first line is {text.splitlines()[0]!r}"
    m = re.search(r"max_requests:\s*(\d+)", text)
    assert m and int(m.group(1)) == out["max_requests"], f"summary without the right max_requests line:\n{text}"
    m = re.search(r"total_blocks:\s*(\d+)", text)
    assert m and int(m.group(1)) == out["total"], f"summary without the right total_blocks line:\n{text}"
    assert "verbose" not in out["fields"], "verbose must be an init-only argument, not a stored InferenceConfig field"
    assert out["zero"] == "0 bytes", f"get_mem_size_str(0) returned {out['zero']!r}"
