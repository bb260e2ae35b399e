"""Hidden probes for megatron-0009 (Mamba prefix-cache scratch sized by the per-step token budget).

The judge never imports megatron or torch. Children open a one-rank gloo group (the context only
reads group ranks and sizes), build hybrid DynamicInferenceContext objects with Mamba prefix
caching on one CUDA device (or MambaMetadata objects directly) and send back plain figures:
the context's max_tokens / max_requests / block size, buffer shapes and byte sizes, recorded
extraction offsets, exceptions and the configuration summary. The judge computes the expected
scratch bound, per-slot size, durable slot count, budget threshold and extraction offsets itself
from the instruction's rules and the configurations it chose.
"""

import math
import re

from infradev_probe import run

PRELUDE = """
import logging
import socket

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.core.inference.config import (
    InferenceConfig,
    MambaInferenceStateConfig,
    PrefixCachingEvictionPolicy,
)
from megatron.core.inference.contexts.dynamic_context import DynamicInferenceContext
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

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_context(c, verbose=False):
    DynamicInferenceContext.ROUNDER = 64
    DynamicInferenceContext.TOKEN_ROUNDER = 64
    DynamicInferenceContext.REQUEST_ROUNDER = 64
    mamba = MambaInferenceStateConfig(
        layer_type_list=list(c["layers"]),
        conv_states_shape=tuple(c["conv"]),
        ssm_states_shape=tuple(c["ssm"]),
        conv_states_dtype=DTYPES[c["conv_dtype"]],
        ssm_states_dtype=DTYPES[c["ssm_dtype"]],
        mamba_chunk_size=c["chunk"],
    )
    model = TransformerConfig(
        params_dtype=torch.float32, num_layers=len(c["layers"]), kv_channels=8,
        num_attention_heads=2, hidden_size=16, tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1, use_cpu_initialization=True,
    )
    config = InferenceConfig(
        max_sequence_length=c["max_seq"], buffer_size_gb=0.1, paused_buffer_size_gb=0.02,
        block_size_tokens=c["bs"], max_tokens=c["max_tokens"], max_requests=c["max_requests"],
        mamba_inference_state_config=mamba, use_flashinfer_fused_rope=None,
        unified_memory_level=0, enable_prefix_caching=True,
        prefix_caching_eviction_policy=PrefixCachingEvictionPolicy.LRU,
        prefix_caching_mamba_gb=c["mamba_gb"], verbose=verbose,
    )
    return DynamicInferenceContext(model_config=model, inference_config=config)


def describe(ctx):
    msa = ctx.mamba_slot_allocator
    bufs = [msa.conv_states, msa.ssm_states, msa.intermediate_conv_out, msa.intermediate_ssm_out]
    return dict(
        max_tokens=int(ctx.max_tokens), max_requests=int(ctx.max_requests),
        bs=int(ctx.block_size_tokens), bound=int(ctx.max_mamba_intermediate_states_per_step),
        msa_count=int(msa.max_intermediate_count),
        md_count=int(ctx.mamba_metadata.max_intermediate_count),
        conv=list(msa.conv_states.shape), ssm=list(msa.ssm_states.shape),
        iconv=list(msa.intermediate_conv_out.shape), issm=list(msa.intermediate_ssm_out.shape),
        nbytes=sum(int(t.numel() * t.element_size()) for t in bufs),
    )
"""

ITEMSIZE = {"float32": 4, "bfloat16": 2}


def cfg(**kw):
    base = dict(layers="*M*M", conv=(4, 8), ssm=(4, 16), conv_dtype="float32", ssm_dtype="float32",
                chunk=128, bs=256, max_seq=4096, max_tokens=2048, max_requests=32, mamba_gb=0.002)
    base.update(kw)
    return base


def per_slot(c):
    return c["layers"].count("M") * (math.prod(c["conv"]) * ITEMSIZE[c["conv_dtype"]]
                                     + math.prod(c["ssm"]) * ITEMSIZE[c["ssm_dtype"]])


def bound(max_tokens, bs, max_requests):
    return min(-(-max_tokens // bs), 3 * max_requests)


def durable(c, n):
    return (int(c["mamba_gb"] * 1024**3) - n * per_slot(c)) // per_slot(c)


SIZING = [
    # token bound, max_tokens not a multiple of the block size (ceil 8, not 7)
    cfg(max_tokens=2000, max_requests=16),
    # request bound: 2 requests can never fill 8 scratch slots
    cfg(bs=128, max_tokens=1000, max_requests=2, mamba_gb=0.001),
    # three Mamba layers, bf16 SSM state, 65 scratch slots (4100 / 64 rounded up)
    cfg(layers="M*MM", conv=(8, 4), ssm=(8, 32), ssm_dtype="bfloat16", bs=64, max_tokens=4100,
        max_requests=64, mamba_gb=0.003),
    # max_tokens and max_requests left to the context's defaults and derivation
    cfg(max_tokens=None, max_requests=None, mamba_gb=0.03),
]


def test_scratch_and_durable_cache_fill_the_budget():
    out = run(PRELUDE + """
emit(results=[describe(make_context(c)) for c in ARGS["cases"]])
""", args={"cases": SIZING})
    for c, got in zip(SIZING, out["results"]):
        if c["max_tokens"] is not None:
            assert (got["max_tokens"], got["max_requests"]) == (c["max_tokens"], c["max_requests"]), \
                f"probe setup: {got}"
        n = bound(got["max_tokens"], got["bs"], got["max_requests"])
        layers = c["layers"].count("M")
        slots = durable(c, n)
        where = (f"max_tokens {got['max_tokens']}, block size {got['bs']}, max_requests "
                 f"{got['max_requests']}, {layers} Mamba layers, prefix_caching_mamba_gb {c['mamba_gb']}")
        assert got["bound"] == n, f"{where}: max_mamba_intermediate_states_per_step {got['bound']}, want {n}"
        assert (got["msa_count"], got["md_count"]) == (n, n), \
            f"{where}: slot allocator / metadata max_intermediate_count {got['msa_count']} / {got['md_count']}, want {n}"
        assert got["iconv"] == [layers, n, *c["conv"]] and got["issm"] == [layers, n, *c["ssm"]], \
            f"{where}: scratch shapes {got['iconv']} / {got['issm']}, want {n} slots per layer"
        assert got["conv"] == [layers, slots, *c["conv"]] and got["ssm"] == [layers, slots, *c["ssm"]], \
            f"{where}: durable cache shapes {got['conv']} / {got['ssm']}, want {slots} slots (the budget less {n} scratch slots)"
        budget = int(c["mamba_gb"] * 1024**3)
        assert budget - per_slot(c) < got["nbytes"] <= budget, (
            f"{where}: durable cache plus scratch take {got['nbytes']} bytes; they must fill, and stay "
            f"within, the {budget}-byte budget")


THRESHOLD = cfg(max_tokens=2048, max_requests=32)


def test_budget_threshold_is_scratch_plus_one_slot():
    n = bound(THRESHOLD["max_tokens"], THRESHOLD["bs"], THRESHOLD["max_requests"])
    need = (n + 1) * per_slot(THRESHOLD)
    budgets = {"exact": need / 1024**3, "short": (need - 1) / 1024**3, "roomy": 4 * need / 1024**3}
    out = run(PRELUDE + """
results = {}
for name, gb in ARGS["budgets"].items():
    c = dict(ARGS["case"], mamba_gb=gb)
    try:
        d = describe(make_context(c))
        results[name] = ["ok", d["conv"][1]]
    except ValueError as e:
        results[name] = ["ValueError", str(e)]
    except Exception as e:
        results[name] = [type(e).__name__, str(e)]
emit(**results)
""", args={"case": THRESHOLD, "budgets": budgets})
    for name in budgets:
        assert int(budgets[name] * 1024**3) == {"exact": need, "short": need - 1, "roomy": 4 * need}[name], "probe setup"
    assert out["exact"] == ["ok", 1], (
        f"a budget of exactly {n} scratch slots plus one durable slot ({need} bytes, "
        f"{per_slot(THRESHOLD)} bytes a slot) must build with one durable slot: got {out['exact']}")
    assert out["short"][0] == "ValueError" and "prefix cache budget" in out["short"][1], \
        f"one byte less must raise ValueError about the prefix cache budget: got {out['short']}"
    assert out["roomy"] == ["ok", 4 * (n + 1) - n], f"a budget of {4 * (n + 1)} slots: got {out['roomy']}"


def test_metadata_takes_a_required_keyword_count():
    out = run(PRELUDE + """
from megatron.core.inference.contexts.attention_context.mamba_metadata import MambaMetadata

res = {}
md = MambaMetadata(max_requests=8, max_tokens=256, max_intermediate_count=5, d_conv=4)
res["sized"] = [int(md.max_intermediate_count), int(md._intermediate_chunk_indices_buffer.numel()),
                int(md._intermediate_abs_positions_buffer.numel())]
for name, call in (("positional", lambda: MambaMetadata(8, 256, 5)),
                   ("missing", lambda: MambaMetadata(max_requests=8, max_tokens=256))):
    try:
        call()
        res[name] = "accepted"
    except TypeError:
        res[name] = "TypeError"
    except Exception as e:
        res[name] = type(e).__name__
emit(**res)
""")
    assert out["sized"] == [5, 5, 5], \
        f"MambaMetadata(..., max_intermediate_count=5): count and intermediate buffer sizes {out['sized']}, want 5"
    assert out["positional"] == "TypeError", \
        f"a third positional argument to MambaMetadata must be a TypeError (keyword-only): {out['positional']}"
    assert out["missing"] == "TypeError", \
        f"MambaMetadata without max_intermediate_count must be a TypeError (required): {out['missing']}"


# (block size, SSM chunk size, [(prompt tokens, how many leading blocks it shares with the
# previous prompt of the group)]).
OFFSET_GROUPS = [
    (64, 128, [(200, 0), (300, 0), (129, 0), (100, 0)]),
    (64, 64, [(150, 0), (65, 0), (192, 0), (228, 2)]),
    (128, 256, [(300, 0), (200, 0), (520, 0)]),
    (32, 64, [(100, 0), (130, 0), (161, 0)]),
]


def expected_offsets(bs, chunk, length, shared):
    """Fresh single-chunk prefill: the chunk starts at 0 (no Mamba state is cached, so nothing is
    skipped) and computes `length` tokens."""
    candidates = {shared * bs, (length // bs) * bs, (-(-length // bs) - 1) * bs}
    return sorted(o for o in candidates if 0 < o < length and o % chunk == 0)


def test_extraction_offsets_use_configured_chunk_size():
    groups = []
    for bs, chunk, prompts in OFFSET_GROUPS:
        specs, prev = [], None
        for i, (length, shared) in enumerate(prompts):
            start = 1000 * (i + 1)
            pieces = [[prev[0], shared * bs], [start + 50000, length - shared * bs]] if shared else [[start, length]]
            specs.append(pieces)
            prev = (pieces[0][0], length) if not shared else prev
        groups.append(dict(case=cfg(bs=bs, chunk=chunk, max_seq=1024, max_tokens=4096, max_requests=16,
                                    mamba_gb=0.002), prompts=specs))
    out = run(PRELUDE + """
results = []
for g in ARGS["groups"]:
    ctx = make_context(g["case"])
    msa = ctx.mamba_slot_allocator
    got = []
    for rid, pieces in enumerate(g["prompts"]):
        tokens = []
        for start, count in pieces:
            tokens += list(range(start, start + count))
        req = DynamicInferenceRequest(
            request_id=rid + 1, prompt_tokens=torch.tensor(tokens, dtype=torch.int64, device=DEV),
            sampling_params=SamplingParams(num_tokens_to_generate=4),
            block_size_tokens=ctx.block_size_tokens, enable_prefix_caching=True,
        )
        row = ctx.total_request_count
        ctx.add_request(req)
        count = int(msa._intermediate_counts_cpu[row])
        got.append([int(x) for x in msa._intermediate_offsets_cpu[row, :count].tolist()])
    results.append(dict(chunk=int(ctx.mamba_chunk_size), offsets=got))
emit(results=results)
""", args={"groups": groups})
    for (bs, chunk, prompts), got in zip(OFFSET_GROUPS, out["results"]):
        assert got["chunk"] == chunk, f"probe setup: mamba_chunk_size {got['chunk']}"
        for (length, shared), offsets in zip(prompts, got["offsets"]):
            want = expected_offsets(bs, chunk, length, shared)
            assert offsets == want, (
                f"block size {bs}, SSM chunk size {chunk}: a {length}-token prompt"
                f"{f' sharing its first {shared} blocks' if shared else ''} recorded extraction offsets "
                f"{offsets}, want {want} (candidate boundaries that are multiples of the chunk size)")


SUMMARY = cfg(max_tokens=2048, max_requests=32, mamba_gb=0.002)


def test_summary_reports_the_split():
    out = run(PRELUDE + """
records = []


class Grab(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


root = logging.getLogger()
root.setLevel(logging.INFO)
root.addHandler(Grab())
d = describe(make_context(ARGS["case"], verbose=True))
emit(summary=[m for m in records if "configuration summary" in m], described=d)
""", args={"case": SUMMARY})
    n = bound(SUMMARY["max_tokens"], SUMMARY["bs"], SUMMARY["max_requests"])
    slots = durable(SUMMARY, n)
    assert out["described"]["conv"][1] == slots, f"probe setup: {out['described']}"
    assert len(out["summary"]) == 1, f"want one configuration summary, got {len(out['summary'])}"
    text = out["summary"][0]
    m = re.search(r"extraction_scratch:\s*(\d+)\s*slots", text)
    assert m and int(m.group(1)) == n, \
        f"the summary's extraction_scratch line must give {n} slots (the per-step bound):\n{text}"
    m = re.search(r"durable_slots:\s*(\d+)", text)
    assert m and int(m.group(1)) == slots, \
        f"the summary's durable_slots line must give {slots}, the slots actually allocated:\n{text}"
