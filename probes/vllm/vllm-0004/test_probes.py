"""Hidden probes for vllm-0004 (KV-cache slots for EAGLE lookahead tokens).

The judge never imports vllm. One child process drives the V1 KV cache manager and
scheduler through every scenario (each in its own try block, so one failing scenario does not
hide the others) and sends back block counts; each probe checks its scenario against what
the judge computes itself from the instruction's contract."""

import functools

from infradev_probe import run

_DRIVER = """
import traceback
import types

import torch
from vllm.config import CacheConfig, SchedulerConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request


def config(block_size, num_blocks):
    return KVCacheConfig(
        num_blocks=num_blocks,
        tensors={},
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size, 1, 1, torch.float32, False))],
    )


def request(rid, tokens):
    return Request(request_id=rid, prompt=None, prompt_token_ids=list(tokens),
                   multi_modal_inputs=None, multi_modal_hashes=None,
                   multi_modal_placeholders=None,
                   sampling_params=SamplingParams(max_tokens=1000), eos_token_id=None,
                   arrival_time=0, lora_request=None)


def held(manager, req):
    return len(manager.req_to_blocks[req.request_id])


def needs_room(args):
    # 1 + 6 blocks of 4 slots (block 0 is the null block).
    results = []
    for k in args["lookaheads"]:
        m = KVCacheManager(kv_cache_config=config(4, 7), max_model_len=1024,
                           enable_caching=True, num_preallocate_tokens=0)
        free0 = m.block_pool.get_num_free_blocks()
        req = request("r", range(11))
        blocks = m.allocate_slots(req, 11, num_lookahead_tokens=k)
        results.append({
            "k": k,
            "none": blocks is None,
            "new": None if blocks is None else len(blocks),
            "held": held(m, req),
            "free_before": free0,
            "free_after": m.block_pool.get_num_free_blocks(),
        })
    return results


def preallocation(args):
    got = []
    for block_size, prealloc, n, k in args["cases"]:
        m = KVCacheManager(kv_cache_config=config(block_size, 200), max_model_len=4096,
                           enable_caching=True, num_preallocate_tokens=prealloc)
        req = request("r", range(n))
        blocks = m.allocate_slots(req, n, num_lookahead_tokens=k)
        got.append(-1 if blocks is None else len(blocks))
    return got


def decode(args):
    rows = []
    for prealloc, k in args["settings"]:
        m = KVCacheManager(kv_cache_config=config(4, 64), max_model_len=4096,
                           enable_caching=True, num_preallocate_tokens=prealloc)
        total = m.block_pool.get_num_free_blocks()
        req = request("r", range(6))
        assert m.allocate_slots(req, 6, num_lookahead_tokens=k) is not None
        req.num_computed_tokens = 6
        trace = [held(m, req)]
        for step in range(40):
            req.append_output_token_ids(1000 + step)
            assert m.allocate_slots(req, 1, num_lookahead_tokens=k) is not None
            req.num_computed_tokens += 1
            trace.append(held(m, req))
        in_use = total - m.block_pool.get_num_free_blocks()
        m.free(req)
        rows.append({"prealloc": prealloc, "k": k, "trace": trace, "in_use": in_use,
                     "free_after": m.block_pool.get_num_free_blocks(), "total": total})
    return rows


def scheduler(args):
    rows = []
    for method, k in args["specs"]:
        spec = None if method is None else types.SimpleNamespace(method=method, num_speculative_tokens=k)
        s = Scheduler(
            scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=8192,
                                             max_model_len=8192),
            model_config=types.SimpleNamespace(is_multimodal_model=False),
            cache_config=CacheConfig(block_size=16, gpu_memory_utilization=0.9, swap_space=0,
                                     cache_dtype="auto", enable_prefix_caching=True),
            lora_config=None,
            kv_cache_config=config(16, 400),
            structured_output_manager=types.SimpleNamespace(grammar_bitmask=lambda *a, **kw: None),
            speculative_config=spec,
        )
        req = request("r0", range(16))
        s.add_request(req)
        held_by_step = []
        for step in range(3):
            out = s.schedule()
            held_by_step.append(len(s.kv_cache_manager.req_to_blocks["r0"]))
            s.update_from_output(out, ModelRunnerOutput(
                req_ids=["r0"], req_id_to_index={"r0": 0}, sampled_token_ids=[[7 + step]],
                spec_token_ids=None, logprobs=None, prompt_logprobs_dict={}))
        rows.append({"method": method, "k": k, "lookahead": s.num_lookahead_tokens,
                     "held": held_by_step})
    return rows


results = {}
for name in ("needs_room", "preallocation", "decode", "scheduler"):
    try:
        results[name] = {"ok": True, "value": globals()[name](ARGS[name])}
    except Exception:
        results[name] = {"ok": False, "error": traceback.format_exc()}
emit(**results)
"""


def _cdiv(a, b):
    return -(-a // b)


def _prealloc_cases():
    cases = []
    for block_size in (4, 16):
        for prealloc in (0, block_size, 3 * block_size):
            for n in (1, 3, block_size, 2 * block_size + 1):
                for k in (0, 1, block_size - 1, block_size, 2 * block_size, 5 * block_size + 2):
                    cases.append([block_size, prealloc, n, k])
    return cases


_ARGS = {
    "needs_room": {"lookaheads": [0, 4, 13, 14, 20]},
    "preallocation": {"cases": _prealloc_cases()},
    "decode": {"settings": [[0, 3], [0, 5], [0, 8], [8, 3], [8, 4], [8, 9]]},
    "scheduler": {"specs": [[None, 0], ["eagle", 2], ["eagle", 64], ["ngram", 64]]},
}


@functools.lru_cache(maxsize=None)
def _results():
    return run(_DRIVER, _ARGS)


def _scenario(name):
    r = _results()[name]
    if not r["ok"]:
        raise AssertionError("the code under test raised:\n" + r["error"][-6000:])
    return r["value"]


def test_lookahead_needs_room_in_the_pool():
    # An 11-token prompt needs 3 blocks of 4; with k lookahead slots, ceil((11 + k) / 4).
    for r in _scenario("needs_room"):
        k, need, free = r["k"], _cdiv(11 + r["k"], 4), r["free_before"]
        if need <= free:
            assert not r["none"], f"lookahead {k}: {need} blocks fit in {free} free blocks, but allocate_slots refused"
            assert r["new"] == need and r["held"] == need, (
                f"lookahead {k}: want {need} blocks, got {r['new']} new, {r['held']} held")
            assert r["free_after"] == free - need
        else:
            assert r["none"], (f"lookahead {k}: {need} blocks do not fit in {free} free blocks, "
                               f"but allocate_slots returned {r['new']} blocks")
            assert r["held"] == 0 and r["free_after"] == free, (
                f"lookahead {k}: a refused allocation must take nothing from the pool "
                f"(held {r['held']}, free {r['free_after']} of {free})")


def test_lookahead_larger_than_preallocation():
    # Whole lookahead blocks come out of the preallocation, which never goes below zero: a
    # request always gets at least the blocks its tokens and lookahead slots need.
    bad = []
    for (block_size, prealloc, n, k), got in zip(_ARGS["preallocation"]["cases"], _scenario("preallocation")):
        need = _cdiv(n + k, block_size)
        extra = max(0, _cdiv(prealloc, block_size) - k // block_size)
        if got != need + extra:
            bad.append(f"block_size={block_size} preallocate={prealloc} tokens={n} lookahead={k}: "
                       f"{got} blocks, want {need} + {extra} preallocated")
    assert not bad, "\n".join(bad[:10])


def test_decode_keeps_lookahead_slots_without_growing():
    # One token a step with k lookahead slots: the request always holds the slots for its
    # tokens plus k, and takes new blocks only when those cross a block boundary.
    for r in _scenario("decode"):
        pre, k = _cdiv(r["prealloc"], 4), r["k"]
        want, blocks = [], 0
        for computed, n in [(0, 6)] + [(6 + s, 1) for s in range(40)]:
            need = _cdiv(computed + n + k, 4)
            if need > blocks:
                blocks = need + max(0, pre - k // 4)
            want.append(blocks)
        assert r["trace"] == want, (
            f"preallocate={r['prealloc']} lookahead={k}: blocks held per step {r['trace']}, want {want}")
        assert r["in_use"] == want[-1], "the pool's used blocks differ from the request's block table"
        assert r["free_after"] == r["total"], "freeing the request did not return every block"


def test_eagle_scheduler_reserves_lookahead_slots():
    # Only EAGLE proposers write KV cache for their draft tokens, so only they get lookahead
    # slots when the scheduler schedules running requests.
    for r in _scenario("scheduler"):
        k = r["k"] if r["method"] == "eagle" else 0
        assert r["lookahead"] == k, (
            f"{r['method']} with {r['k']} speculative tokens: num_lookahead_tokens={r['lookahead']}, want {k}")
        # The 16-token prompt is scheduled as a new request: 1 block and 4 preallocated (the
        # default 64 tokens). Each later step schedules 1 token of the running request, whose
        # tokens plus lookahead slots then need ceil((computed + 1 + k) / 16) blocks.
        want, blocks = [5], 5
        for computed in (16, 17):
            need = _cdiv(computed + 1 + k, 16)
            if need > blocks:
                blocks = need + max(0, 4 - k // 16)
            want.append(blocks)
        assert r["held"] == want, (
            f"{r['method']} with {r['k']} speculative tokens: blocks held per step {r['held']}, want {want}")
