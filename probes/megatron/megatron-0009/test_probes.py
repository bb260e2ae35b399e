"""Hidden probes for megatron-0009 (Mamba prefix-cache scratch sized by the per-step token budget).

The judge never imports megatron or torch. Every probe draws its configurations fresh: the
layer pattern (how many Mamba layers), the conv / SSM state shapes and dtypes, the block size,
the SSM chunk size, max_tokens and max_requests (or the context's defaults), the prefix-cache
budget (a random number of durable slots past the scratch, plus a random slack under one slot),
prompt lengths and tokens, and which prompts share a cached prefix.

Children open a one-rank gloo group (the context only reads group ranks and sizes), build hybrid
DynamicInferenceContext objects with Mamba prefix caching on one CUDA device (or MambaMetadata
objects directly) and send back plain figures: the context's max_tokens / max_requests / block
size, buffer shapes and byte sizes, recorded extraction offsets, exceptions and the configuration
summary. Each scenario also runs over the gold tree (`reference`, same inputs); the context's own
derivations that the task does not change (max_tokens, max_requests, block size) are taken from
the reference, and the judge computes the expected scratch bound, per-slot size, durable slot
count, budget threshold and extraction offsets itself from the instruction's rules, then checks
both children against them.
"""

import math
import re

from infradev_probe import fresh, reference, run, same

# The reference children run as a user the image's passwd does not name; torch (imported through
# megatron) asks getpass for a user name when it sets up its compile cache, so name one.
ENV = {"USER": "infradev-probe"}

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
        dtypes=[str(t.dtype) for t in bufs],
        nbytes=sum(int(t.numel() * t.element_size()) for t in bufs),
    )
"""

ITEMSIZE = {"float32": 4, "bfloat16": 2}
TORCH_DTYPE = {"float32": "torch.float32", "bfloat16": "torch.bfloat16"}
DEFAULT_MAX_TOKENS = 16384  # the context's default when max_tokens is not given


def per_slot(c):
    return c["layers"].count("M") * (math.prod(c["conv"]) * ITEMSIZE[c["conv_dtype"]]
                                     + math.prod(c["ssm"]) * ITEMSIZE[c["ssm_dtype"]])


def bound(max_tokens, bs, max_requests):
    return min(-(-max_tokens // bs), 3 * max_requests)


def budget_bytes(c):
    return int(c["mamba_gb"] * 1024**3)


def durable(c, n):
    return (budget_bytes(c) - n * per_slot(c)) // per_slot(c)


def draw_case(rng, kind=None, ragged=None):
    """A hybrid configuration: kind "token" (the token bound is the tighter), "request" (the
    request bound is), or "default" (max_tokens and max_requests left to the context). For "token",
    `ragged` says whether max_tokens is not a multiple of the block size (None: either)."""
    kind = kind or str(rng.choice(["token", "request", "default"]))
    n_layers = int(rng.integers(2, 7))
    layers = ["*"] * n_layers
    # one to four Mamba layers, and at least one attention layer (the context needs one)
    for i in rng.choice(n_layers, size=int(rng.integers(1, min(4, n_layers - 1) + 1)), replace=False):
        layers[int(i)] = "M"
    c = dict(layers="".join(layers),
             conv=[int(rng.choice([2, 4, 8])), int(rng.integers(2, 5))],
             ssm=[int(x) for x in rng.choice([2, 4, 8], size=int(rng.integers(2, 4)))] + [int(rng.choice([8, 16, 32]))],
             conv_dtype=str(rng.choice(list(ITEMSIZE))), ssm_dtype=str(rng.choice(list(ITEMSIZE))),
             chunk=int(rng.choice([64, 128, 256])), bs=int(rng.choice([64, 128, 256])), max_seq=4096)
    bs = c["bs"]
    if kind == "default":
        c["max_tokens"] = c["max_requests"] = None
        top = -(-DEFAULT_MAX_TOKENS // bs)  # the most scratch slots any derived max_requests gives
    else:
        if kind == "token":
            # ceil(max_tokens / bs) under 3 * max_requests
            mr = int(rng.integers(4, 65))
            blocks = int(rng.integers(max(1, -(-mr // bs)), min(3 * mr - 1, 40) + 1))
            if ragged is None:
                ragged = bool(rng.random() < 0.7)
            mt = blocks * bs
            if ragged:
                # inside the last block, and still at least max_requests
                mt -= int(rng.integers(1, min(bs, mt - mr + 1))) if mt - mr >= 1 else 0
                if mt % bs == 0:  # max_requests left no room: one block more, cut
                    mt = (blocks + 1) * bs - int(rng.integers(1, bs))
        else:
            # ceil(max_tokens / bs) over 3 * max_requests
            mr = int(rng.integers(1, 9))
            mt = int(rng.integers(3 * mr * bs + 1, 3 * mr * bs + 4 * bs))
        c["max_tokens"], c["max_requests"] = mt, mr
        top = bound(mt, bs, mr)
    slots = int(rng.integers(1, 25))
    total = (top + slots) * per_slot(c) + int(rng.integers(0, per_slot(c)))
    c["mamba_gb"] = total / 1024**3  # exact: int(c["mamba_gb"] * 1024**3) == total
    return c


def check_sizing(c, got, ref, who):
    """got: describe() from a child; ref: the reference's, whose derived sizes the judge trusts."""
    n = bound(ref["max_tokens"], ref["bs"], ref["max_requests"])
    layers = c["layers"].count("M")
    slots = durable(c, n)
    where = (f"{who}: max_tokens {ref['max_tokens']}, block size {ref['bs']}, max_requests "
             f"{ref['max_requests']}, {layers} Mamba layers, {per_slot(c)} bytes a slot, budget "
             f"{budget_bytes(c)} bytes")
    assert slots >= 1, f"probe setup: {where}"
    if c["max_tokens"] is not None:
        assert (ref["max_tokens"], ref["max_requests"]) == (c["max_tokens"], c["max_requests"]), \
            f"probe setup: {ref}"
    assert (got["max_tokens"], got["max_requests"], got["bs"]) == (ref["max_tokens"], ref["max_requests"], ref["bs"]), \
        f"{where}: the context's max_tokens / max_requests / block size {got['max_tokens']} / {got['max_requests']} / {got['bs']}"
    assert got["bound"] == n, f"{where}: max_mamba_intermediate_states_per_step {got['bound']}, want {n}"
    assert (got["msa_count"], got["md_count"]) == (n, n), \
        f"{where}: slot allocator / metadata max_intermediate_count {got['msa_count']} / {got['md_count']}, want {n}"
    assert got["iconv"] == [layers, n, *c["conv"]] and got["issm"] == [layers, n, *c["ssm"]], \
        f"{where}: scratch shapes {got['iconv']} / {got['issm']}, want {n} slots per layer"
    assert got["conv"] == [layers, slots, *c["conv"]] and got["ssm"] == [layers, slots, *c["ssm"]], \
        f"{where}: durable cache shapes {got['conv']} / {got['ssm']}, want {slots} slots (the budget less {n} scratch slots)"
    want_dtypes = [TORCH_DTYPE[c["conv_dtype"]], TORCH_DTYPE[c["ssm_dtype"]]] * 2
    assert got["dtypes"] == want_dtypes, f"{where}: buffer dtypes {got['dtypes']}, want {want_dtypes}"
    assert got["nbytes"] == (n + slots) * per_slot(c), \
        f"{where}: durable cache plus scratch take {got['nbytes']} bytes, want {(n + slots) * per_slot(c)}"
    assert budget_bytes(c) - per_slot(c) < got["nbytes"] <= budget_bytes(c), \
        f"{where}: durable cache plus scratch must fill, and stay within, the budget"


_SIZING = PRELUDE + """
emit(results=[describe(make_context(c)) for c in ARGS["cases"]])
"""


def test_scratch_and_durable_cache_fill_the_budget():
    rng = fresh()
    # a token-bound case whose max_tokens ends inside a block (ceil, not floor), a request-bound
    # one, the context's defaults, and one more of either bound
    kinds = [("token", True), ("request", None), ("default", None), (str(rng.choice(["token", "request"])), None)]
    cases = [draw_case(rng, *kinds[int(i)]) for i in rng.permutation(len(kinds))]
    want = reference(_SIZING, {"cases": cases}, env=ENV)
    got = run(_SIZING, {"cases": cases}, env=ENV)
    assert len(got["results"]) == len(cases), "one description per configuration"
    for c, g, w in zip(cases, got["results"], want["results"]):
        check_sizing(c, w, w, "probe setup (the reference)")
        check_sizing(c, g, w, "the submission")


_THRESHOLD = PRELUDE + """
results = []
for gb in ARGS["budgets"]:
    c = dict(ARGS["case"], mamba_gb=gb)
    try:
        d = describe(make_context(c))
        results.append(["ok", d["conv"][1], d["bound"]])
    except ValueError as e:
        results.append(["ValueError", str(e), 0])
    except Exception as e:
        results.append([type(e).__name__, str(e), 0])
emit(results=results)
"""


def test_budget_threshold_is_scratch_plus_one_slot():
    rng = fresh()
    # (max_tokens a multiple of the block size when the token bound is the tighter: this probe is
    # about the threshold, not the rounding)
    c = draw_case(rng, str(rng.choice(["token", "request"])), ragged=False)
    n = bound(c["max_tokens"], c["bs"], c["max_requests"])
    ps = per_slot(c)
    need = (n + 1) * ps
    budgets = {"exact": need, "short": need - 1,
               "shorter": int(rng.integers(max(1, (n - 4) * ps), need - 1)),
               "roomy": need + int(rng.integers(1, 40)) * ps + int(rng.integers(0, ps))}
    names = [str(x) for x in rng.permutation(list(budgets))]
    args = {"case": c, "budgets": [budgets[k] / 1024**3 for k in names]}
    for k, gb in zip(names, args["budgets"]):
        assert int(gb * 1024**3) == budgets[k], "probe setup"
    out = run(_THRESHOLD, args, env=ENV)
    assert len(out["results"]) == len(names), "one result per budget"
    res = dict(zip(names, out["results"]))
    where = f"{n} scratch slots (max_tokens {c['max_tokens']}, block size {c['bs']}, max_requests {c['max_requests']}), {ps} bytes a slot"
    assert res["exact"] == ["ok", 1, n], (
        f"{where}: a budget of exactly the scratch plus one durable slot ({need} bytes) must build with "
        f"one durable slot: got {res['exact'][:2]}")
    for k in ("short", "shorter"):
        assert res[k][0] == "ValueError" and "prefix cache budget" in res[k][1], \
            f"{where}: a budget of {budgets[k]} bytes (under {need}) must raise ValueError about the prefix cache budget: got {res[k][0]}"
    slots = (budgets["roomy"] - n * ps) // ps
    assert res["roomy"] == ["ok", slots, n], f"{where}: a budget of {budgets['roomy']} bytes: got {res['roomy'][:2]}, want {slots} durable slots"


_METADATA = PRELUDE + """
from megatron.core.inference.contexts.attention_context.mamba_metadata import MambaMetadata

a = ARGS
res = {}
md = MambaMetadata(max_requests=a["mr"], max_tokens=a["mt"], max_intermediate_count=a["count"],
                   mamba_chunk_size=a["chunk"], d_conv=a["d_conv"])
res["sized"] = [int(md.max_intermediate_count), int(md._intermediate_chunk_indices_buffer.numel()),
                int(md._intermediate_abs_positions_buffer.numel())]
for name, call in (("positional", lambda: MambaMetadata(a["mr"], a["mt"], a["count"])),
                   ("missing", lambda: MambaMetadata(max_requests=a["mr"], max_tokens=a["mt"]))):
    try:
        call()
        res[name] = "accepted"
    except TypeError:
        res[name] = "TypeError"
    except Exception as e:
        res[name] = type(e).__name__
emit(**res)
"""


def test_metadata_takes_a_required_keyword_count():
    rng = fresh()
    mr = int(rng.integers(1, 65))
    args = {"mr": mr, "mt": int(rng.integers(mr, 8193)), "chunk": int(rng.choice([64, 128, 256])),
            "d_conv": int(rng.integers(2, 5)), "count": int(rng.integers(1, 3 * mr + 20))}
    out = run(_METADATA, args, env=ENV)
    n = args["count"]
    assert out["sized"] == [n, n, n], \
        f"MambaMetadata(max_requests={mr}, ..., max_intermediate_count={n}): count and intermediate buffer sizes {out['sized']}, want {n}"
    assert out["positional"] == "TypeError", \
        f"a third positional argument to MambaMetadata must be a TypeError (keyword-only): {out['positional']}"
    assert out["missing"] == "TypeError", \
        f"MambaMetadata without max_intermediate_count must be a TypeError (required): {out['missing']}"


def expected_offsets(bs, chunk, length, shared):
    """Fresh single-chunk prefill: the chunk starts at 0 (no Mamba state is cached, so nothing is
    skipped) and computes `length` tokens."""
    candidates = {shared * bs, (length // bs) * bs, (-(-length // bs) - 1) * bs}
    return sorted(o for o in candidates if 0 < o < length and o % chunk == 0)


def draw_offset_groups(rng):
    groups = []
    for gi in range(int(rng.integers(3, 5))):
        if gi == 0:
            # chunks larger than blocks, and a first prompt whose only candidate boundary (the end of
            # its first block) is not on a chunk boundary
            bs = int(rng.choice([32, 64]))
            chunk = bs * int(rng.choice([2, 4]))
        else:
            bs = int(rng.choice([32, 64, 128]))
            chunk = int(rng.choice([c for c in (32, 64, 128, 256) if c != bs]))
        prompts, specs = [], []
        base = None  # (first token, length) of the group's first prompt, the one others may share with
        for i in range(int(rng.integers(3, 6))):
            length = int(rng.integers(1, 5 * bs + 1))
            if rng.random() < 0.4:
                length = bs * int(rng.integers(1, 5))
            if gi == 0 and i == 0:
                length = int(rng.integers(bs + 1, 2 * bs))
            shared = 0
            if base is not None and base[1] // bs >= 1 and rng.random() < 0.5:
                shared = int(rng.integers(1, base[1] // bs + 1))
                length = max(length, shared * bs + int(rng.integers(1, bs + 1)))
            start = int(rng.integers(1, 50)) * 1000 + 100000 * (i + 1)
            if shared:
                pieces = [[base[0], shared * bs], [start, length - shared * bs]]
            else:
                pieces = [[start, length]]
                if base is None:
                    base = (start, length)
            prompts.append([length, shared])
            specs.append(pieces)
        groups.append(dict(bs=bs, chunk=chunk, prompts=prompts, specs=specs))
    return groups


_OFFSETS = PRELUDE + """
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
"""


def test_extraction_offsets_use_configured_chunk_size():
    rng = fresh()
    groups = draw_offset_groups(rng)
    payload = []
    for g in groups:
        case = draw_case(rng, "token")
        case.update(bs=g["bs"], chunk=g["chunk"], max_seq=2048, max_tokens=8192, max_requests=16)
        n = bound(8192, g["bs"], 16)
        case["mamba_gb"] = (n + int(rng.integers(4, 12))) * per_slot(case) / 1024**3
        payload.append(dict(case=case, prompts=g["specs"]))
    args = {"groups": payload}
    want = reference(_OFFSETS, args, env=ENV)
    got = run(_OFFSETS, args, env=ENV)
    for g, w in zip(groups, want["results"]):
        assert w["chunk"] == g["chunk"], f"probe setup: mamba_chunk_size {w['chunk']}"
        for (length, shared), offsets in zip(g["prompts"], w["offsets"]):
            assert offsets == expected_offsets(g["bs"], g["chunk"], length, shared), \
                f"probe setup: the reference's offsets for a {length}-token prompt sharing {shared} blocks: {offsets}"
    assert len(got["results"]) == len(groups), "one result per group"
    for g, r in zip(groups, got["results"]):
        bs, chunk = g["bs"], g["chunk"]
        assert len(r["offsets"]) == len(g["prompts"]), "one result per prompt"
        for (length, shared), offsets in zip(g["prompts"], r["offsets"]):
            want_off = expected_offsets(bs, chunk, length, shared)
            assert offsets == want_off, (
                f"block size {bs}, SSM chunk size {chunk}: a {length}-token prompt"
                f"{f' sharing its first {shared} blocks' if shared else ''} recorded extraction offsets "
                f"{offsets}, want {want_off} (candidate boundaries that are multiples of the chunk size)")
    same(got, want, path="recorded extraction offsets")


_SUMMARY = PRELUDE + """
records = []


class Grab(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


root = logging.getLogger()
root.setLevel(logging.INFO)
root.addHandler(Grab())
d = describe(make_context(ARGS["case"], verbose=True))
emit(summary=[m for m in records if "configuration summary" in m], described=d)
"""


def test_summary_reports_the_split():
    rng = fresh()
    # the token bound the tighter, so the summary's scratch is not 3 * max_requests (max_tokens a
    # multiple of the block size: the rounding is another probe's)
    c = draw_case(rng, "token", ragged=False)
    want = reference(_SUMMARY, {"case": c}, env=ENV)
    out = run(_SUMMARY, {"case": c}, env=ENV)
    ref = want["described"]
    n = bound(ref["max_tokens"], ref["bs"], ref["max_requests"])
    slots = durable(c, n)
    assert ref["conv"][1] == slots, f"probe setup: the reference's durable slots {ref['conv'][1]}, want {slots}"
    same(out["described"], ref, path="the context's buffers")
    assert len(out["summary"]) == 1, f"want one configuration summary, got {len(out['summary'])}"
    text = out["summary"][0]
    m = re.search(r"extraction_scratch:\s*(\d+)\s*slots", text)
    assert m and int(m.group(1)) == n, \
        f"the summary's extraction_scratch line must give {n} slots (the per-step bound):\n{text}"
    m = re.search(r"durable_slots:\s*(\d+)", text)
    assert m and int(m.group(1)) == slots, \
        f"the summary's durable_slots line must give {slots}, the slots actually allocated:\n{text}"
