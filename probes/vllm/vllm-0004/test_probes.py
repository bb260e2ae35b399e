"""Hidden probes for vllm-0004 (KV-cache slots for EAGLE lookahead tokens).

The judge never imports vllm. Every probe draws its scenario fresh (block sizes, pool sizes,
prompt lengths, lookahead counts around the pool's limit, preallocation sizes, decode lengths,
speculative methods and token counts, sampled token ids), runs a driver over the submission in a
child process, and checks the block counts that come back against what the judge computes
itself from the instruction's contract."""

from infradev_probe import fresh, run

_PRELUDE = r"""
import types

import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request


def config(block_size, num_blocks):
    return KVCacheConfig(
        num_blocks=num_blocks,
        tensors={},
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size, 1, 1, torch.float32, False))],
    )


def request(rid, tokens):
    return Request(request_id=rid, prompt=None, prompt_token_ids=[int(t) for t in tokens],
                   multi_modal_inputs=None, multi_modal_hashes=None,
                   multi_modal_placeholders=None,
                   sampling_params=SamplingParams(max_tokens=100000), eos_token_id=None,
                   arrival_time=0, lora_request=None)


def manager(c):
    return KVCacheManager(kv_cache_config=config(c["block_size"], c["num_blocks"]),
                          max_model_len=c["max_len"], enable_caching=True,
                          num_preallocate_tokens=c["prealloc"])


def held(m, req):
    return len(m.req_to_blocks[req.request_id])
"""

_ALLOC = _PRELUDE + r"""
rows = []
for c in ARGS["cases"]:
    m = manager(c)
    req = request("r", c["prompt"])
    blocks = m.allocate_slots(req, len(c["prompt"]), num_lookahead_tokens=c["lookahead"])
    rows.append({"new": None if blocks is None else len(blocks), "held": held(m, req),
                 "free": int(m.block_pool.get_num_free_blocks())})
emit(rows=rows)
"""

_DECODE = _PRELUDE + r"""
rows = []
for c in ARGS["settings"]:
    m = manager(c)
    k = c["lookahead"]
    req = request("r", c["prompt"])
    assert m.allocate_slots(req, len(c["prompt"]), num_lookahead_tokens=k) is not None
    req.num_computed_tokens = len(c["prompt"])
    trace = [held(m, req)]
    for t in c["decode"]:
        req.append_output_token_ids(int(t))
        assert m.allocate_slots(req, 1, num_lookahead_tokens=k) is not None, "allocate_slots refused"
        req.num_computed_tokens += 1
        trace.append(held(m, req))
    free_before = int(m.block_pool.get_num_free_blocks())
    m.free(req)
    rows.append({"trace": trace, "free_before": free_before,
                 "free_after": int(m.block_pool.get_num_free_blocks())})
emit(rows=rows)
"""

_SCHEDULER = _PRELUDE + r"""
from vllm.config import CacheConfig, SchedulerConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput

rows = []
for c in ARGS["specs"]:
    spec = None if c["method"] is None else types.SimpleNamespace(
        method=c["method"], num_speculative_tokens=c["k"])
    s = Scheduler(
        scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=8192,
                                         max_model_len=8192),
        model_config=types.SimpleNamespace(is_multimodal_model=False),
        cache_config=CacheConfig(block_size=c["block_size"], gpu_memory_utilization=0.9,
                                 swap_space=0, cache_dtype="auto", enable_prefix_caching=True),
        lora_config=None,
        kv_cache_config=config(c["block_size"], c["num_blocks"]),
        structured_output_manager=types.SimpleNamespace(grammar_bitmask=lambda *a, **kw: None),
        speculative_config=spec,
    )
    req = request("r0", c["prompt"])
    s.add_request(req)
    held_by_step = []
    for t in c["sampled"]:
        out = s.schedule()
        held_by_step.append(len(s.kv_cache_manager.req_to_blocks["r0"]))
        s.update_from_output(out, ModelRunnerOutput(
            req_ids=["r0"], req_id_to_index={"r0": 0}, sampled_token_ids=[[int(t)]],
            spec_token_ids=None, logprobs=None, prompt_logprobs_dict={}))
    rows.append({"lookahead": s.num_lookahead_tokens, "held": held_by_step})
emit(rows=rows)
"""


def _cdiv(a, b):
    return -(-a // b)


def _tokens(rng, n, lo=0, hi=30000):
    return [int(t) for t in rng.integers(lo, hi, size=n)]


def _fresh_alloc(c):
    """What a fresh request's allocate_slots(prompt, lookahead) gives: (new blocks or None,
    blocks held, free blocks after)."""
    bs, free = c["block_size"], c["num_blocks"] - 1
    n, k = len(c["prompt"]), c["lookahead"]
    need = _cdiv(n + k, bs)
    if need > free:
        return None, 0, free
    extra = max(0, _cdiv(c["prealloc"], bs) - k // bs)
    new = min(need + extra, free, _cdiv(c["max_len"], bs))
    return new, new, free - new


def _check_alloc(cases, rows, what):
    assert len(rows) == len(cases), "the driver returned a row per case"
    bad = []
    for c, r in zip(cases, rows):
        new, held, free = _fresh_alloc(c)
        want = {"new": new, "held": held, "free": free}
        if r != want:
            bad.append(f"block size {c['block_size']}, pool of {c['num_blocks']}, preallocate "
                       f"{c['prealloc']} tokens, {len(c['prompt'])} tokens + {c['lookahead']} "
                       f"lookahead: got {r}, want {want}")
    assert not bad, f"{len(bad)} of {len(cases)} {what}:\n" + "\n".join(bad[:8])


def test_lookahead_needs_room_in_the_pool():
    rng = fresh()
    cases = []
    for _ in range(3):
        bs = int(rng.integers(2, 17))
        num_blocks = int(rng.integers(4, 21))
        free = num_blocks - 1
        n = int(rng.integers(1, (free - 1) * bs + 1))
        room = free * bs - n                   # the most lookahead slots that fit
        prealloc = 0 if rng.random() < 0.5 else int(rng.integers(1, 4 * bs))
        ks = [int(rng.integers(0, room + 1)), room, room + 1,
              room + int(rng.integers(1, bs + 1)), room + int(rng.integers(bs, 4 * bs))]
        for k in ks:
            cases.append({"block_size": bs, "num_blocks": num_blocks, "max_len": 1 << 14,
                          "prealloc": prealloc, "prompt": _tokens(rng, n), "lookahead": k})
    cases = [cases[i] for i in rng.permutation(len(cases))]
    got = run(_ALLOC, {"cases": cases})
    _check_alloc(cases, got["rows"],
                 "allocations wrong (a pool that cannot hold the tokens and the lookahead slots "
                 "must refuse and take nothing)")


def test_lookahead_larger_than_preallocation():
    rng = fresh()
    cases = []
    for i in range(36):
        bs = int(rng.integers(1, 17))
        pre_blocks = int(rng.integers(1, 5)) if i < 12 else int(rng.integers(0, 5))
        prealloc = max(0, pre_blocks * bs - int(rng.integers(0, bs)))
        if i < 12:  # whole lookahead blocks beyond the preallocation
            k = bs * (_cdiv(prealloc, bs) + int(rng.integers(1, 4))) + int(rng.integers(0, bs))
        else:
            k = int(rng.integers(0, 6 * bs + 3))
        n = int(rng.integers(1, 4 * bs + 2))
        need = _cdiv(n + k, bs) + _cdiv(prealloc, bs)
        cases.append({"block_size": bs, "num_blocks": need + int(rng.integers(2, 20)),
                      "max_len": 1 << 14, "prealloc": prealloc, "prompt": _tokens(rng, n),
                      "lookahead": k})
    cases = [cases[i] for i in rng.permutation(len(cases))]
    got = run(_ALLOC, {"cases": cases})
    _check_alloc(cases, got["rows"], "allocations wrong (want the blocks for the tokens and the "
                 "lookahead plus the preallocation less whole lookahead blocks, never below zero)")


def test_decode_keeps_lookahead_slots_without_growing():
    rng = fresh()
    settings = []
    for _ in range(6):
        bs = int(rng.integers(2, 9))
        k = int(rng.integers(1, 3 * bs + 1))
        prealloc = 0 if rng.random() < 0.4 else int(rng.integers(1, 3 * bs + 1))
        n = int(rng.integers(1, 3 * bs + 1))
        steps = int(rng.integers(20, 51))
        settings.append({"block_size": bs, "lookahead": k, "prealloc": prealloc,
                         "num_blocks": _cdiv(n + steps + k, bs) + _cdiv(prealloc, bs) + int(rng.integers(2, 12)),
                         "max_len": 1 << 14, "prompt": _tokens(rng, n),
                         "decode": _tokens(rng, steps, 30000, 60000)})
    got = run(_DECODE, {"settings": settings})
    assert len(got["rows"]) == len(settings), "the driver returned a row per setting"
    for c, r in zip(settings, got["rows"]):
        bs, k, total = c["block_size"], c["lookahead"], c["num_blocks"] - 1
        pre = _cdiv(c["prealloc"], bs)
        n = len(c["prompt"])
        want, blocks = [], 0
        for computed, new in [(0, n)] + [(n + s, 1) for s in range(len(c["decode"]))]:
            need = _cdiv(computed + new + k, bs)
            if need > blocks:
                blocks = need + max(0, pre - k // bs)
            want.append(blocks)
        where = (f"block size {bs}, preallocate {c['prealloc']} tokens, lookahead {k}, "
                 f"{n}-token prompt then {len(c['decode'])} decode steps")
        assert r["trace"] == want, f"{where}: blocks held per step {r['trace']}, want {want}"
        assert r["free_before"] == total - want[-1], (
            f"{where}: {total - r['free_before']} blocks in use, but the request holds {want[-1]}")
        assert r["free_after"] == total, f"{where}: freeing the request left {total - r['free_after']} blocks in use"


def test_eagle_scheduler_reserves_lookahead_slots():
    rng = fresh()
    methods = [["eagle", int(rng.integers(1, 9))], ["eagle", int(rng.integers(100, 201))],
               ["ngram", int(rng.integers(1, 131))], [None, 0]]
    specs = []
    for i in rng.permutation(len(methods)):
        method, k = methods[i]
        bs = int(rng.choice([4, 8, 16, 32]))
        p = int(rng.integers(1, 4 * bs + 1))
        steps = int(rng.integers(3, 7))
        specs.append({"method": method, "k": k, "block_size": bs,
                      "num_blocks": _cdiv(p + steps + k, bs) + _cdiv(64, bs) + int(rng.integers(4, 40)),
                      "prompt": _tokens(rng, p), "sampled": _tokens(rng, steps, 30000, 60000)})
    got = run(_SCHEDULER, {"specs": specs})
    assert len(got["rows"]) == len(specs), "the driver returned a row per scheduler"
    for c, r in zip(specs, got["rows"]):
        k = c["k"] if c["method"] == "eagle" else 0
        bs, p = c["block_size"], len(c["prompt"])
        where = f"{c['method']} with {c['k']} speculative tokens, block size {bs}, {p}-token prompt"
        assert r["lookahead"] == k, f"{where}: num_lookahead_tokens={r['lookahead']}, want {k}"
        # The prompt is scheduled as a new request (no lookahead) with the default preallocation
        # of 64 tokens; each later step schedules 1 token of the running request, whose tokens
        # plus lookahead slots then need ceil((computed + 1 + k) / block_size) blocks.
        pre = _cdiv(64, bs)
        blocks = _cdiv(p, bs) + pre
        want = [blocks]
        for computed in range(p, p + len(c["sampled"]) - 1):
            need = _cdiv(computed + 1 + k, bs)
            if need > blocks:
                blocks = need + max(0, pre - k // bs)
            want.append(blocks)
        assert r["held"] == want, f"{where}: blocks held per step {r['held']}, want {want}"
