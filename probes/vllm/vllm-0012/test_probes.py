"""Hidden probes for vllm-0012 (speculative decoding: penalties, bad words and allowed tokens on
draft positions, bonus-token history, draft tokens in the input batch, logits processors under
speculative decoding).

The judge never imports vllm or torch. Each probe runs one driver in a child process on cuda:0
(the rejection sampler's kernels are Triton); the child builds the sampling metadata, logits and
input batch from the judge's plain lists and sends back token ids and lists. The judge writes every
scenario itself (prompts, outputs, drafts, penalties, bad words, allowed sets, logits) and derives
the expected tokens with its own numpy version of the instruction's rules: the history of draft
position j is the output tokens plus the first j drafts, the bonus history is the output tokens
plus all drafts, greedy verification accepts drafts while they equal the argmax of the processed
row. Before trusting a scenario, the judge checks that every argmax it relies on wins by a clear
margin, and that the scenario tells the specified history apart from the plausible wrong ones
(no drafts, all drafts, no output tokens, no processing at all)."""

import functools

import numpy as np

from infradev_probe import run

_DRIVER = r'''
import types

import torch

DEV = torch.device("cuda", 0)


def logits_rows(rows, vocab):
    t = torch.zeros((len(rows), vocab), dtype=torch.float32)
    for r, row in enumerate(rows):
        for tok, val in row.items():
            t[r, int(tok)] = float(val)
    return t.to(DEV)


def metadata(case, vocab, spec):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    reqs = case["requests"]
    n = len(reqs)
    pen = any(r.get("freq", 0.0) or r.get("pres", 0.0) or r.get("rep", 1.0) != 1.0 for r in reqs)
    prompt = None
    if pen:
        width = max(len(r["prompt"]) for r in reqs)
        prompt = torch.tensor([r["prompt"] + [vocab] * (width - len(r["prompt"])) for r in reqs],
                              dtype=torch.int64, device=DEV)
    mask = None
    if any(r.get("allowed") is not None for r in reqs):
        mask = torch.zeros((n, vocab), dtype=torch.bool)
        for i, r in enumerate(reqs):
            if r.get("allowed") is not None:
                mask[i, :] = True
                mask[i, r["allowed"]] = False
        mask = mask.to(DEV)
    bad = {i: r["bad"] for i, r in enumerate(reqs) if r.get("bad")}
    return SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=not pen, prompt_token_ids=prompt,
        frequency_penalties=torch.tensor([r.get("freq", 0.0) for r in reqs], device=DEV),
        presence_penalties=torch.tensor([r.get("pres", 0.0) for r in reqs], device=DEV),
        repetition_penalties=torch.tensor([r.get("rep", 1.0) for r in reqs], device=DEV),
        output_token_ids=[list(r["output"]) for r in reqs],
        allowed_token_ids_mask=mask, bad_words_token_ids=bad,
        logitsprocs=LogitsProcessors(),
        spec_token_ids=[list(r["drafts"]) for r in reqs] if spec else None)


def verify(case):
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    reqs, vocab = case["requests"], case["vocab"]
    rows = [row for r in reqs for row in r["rows"]]
    spec = SpecDecodeMetadata.make_dummy([list(r["drafts"]) for r in reqs], device=DEV)
    bonus = torch.tensor([[r["bonus"]] for r in reqs], dtype=torch.int32, device=DEV)
    out = RejectionSampler()(spec, draft_probs=None, target_logits=logits_rows(rows, vocab),
                             bonus_token_ids=bonus, sampling_metadata=metadata(case, vocab, True))
    torch.cuda.synchronize()
    return out.cpu().tolist()


def bonus(case):
    from vllm.v1.sample.sampler import Sampler
    reqs, vocab = case["requests"], case["vocab"]
    got = {}
    for flag in (True, False):
        rows = logits_rows([r["bonus_row"] for r in reqs], vocab)
        out = Sampler()(rows, metadata(case, vocab, True), predict_bonus_token=flag)
        got[str(flag)] = out.sampled_token_ids.reshape(-1).cpu().tolist()
    torch.cuda.synchronize()
    return got


def input_batch(case):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
    batch = InputBatch(max_num_reqs=8, max_model_len=128, max_num_batched_tokens=256,
                       device=DEV, pin_memory=False, vocab_size=64, block_sizes=[16])
    reqs = case["requests"]

    def add(name):
        r = reqs[name]
        batch.add_request(CachedRequestState(
            req_id=name, prompt_token_ids=list(r["prompt"]), mm_features=[],
            sampling_params=SamplingParams(temperature=0.0, max_tokens=16), pooling_params=None,
            generator=None, block_ids=([],), num_computed_tokens=len(r["prompt"]),
            output_token_ids=list(r["output"])))

    def snap(label):
        n = batch.num_reqs
        sm = batch.sampling_metadata
        spec = sm.spec_token_ids
        return {"label": label, "req_ids": list(batch.req_ids)[:n],
                "batch": [None if s is None else list(s) for s in batch.spec_token_ids[:n]],
                "metadata": None if spec is None else [None if s is None else list(s) for s in spec[:n]],
                "outputs": [list(o) for o in sm.output_token_ids[:n]]}

    snaps = []
    for name in case["first"]:
        add(name)
    batch.refresh_metadata()
    snaps.append(snap("added"))
    for k, name in enumerate(list(batch.req_ids)[:batch.num_reqs]):
        batch.spec_token_ids[k] = list(case["drafts"][name])
    batch.refresh_metadata()
    snaps.append(snap("drafts written"))
    k = batch.req_id_to_index[case["rewrite"]]
    batch.spec_token_ids[k] = list(case["drafts2"][case["rewrite"]])
    snaps.append(snap("drafts rewritten, metadata not rebuilt"))
    for name in case["remove"]:
        batch.remove_request(name)
    add(case["late"])
    batch.condense()
    batch.refresh_metadata()
    snaps.append(snap("removed, added, condensed"))
    batch.swap_states(*case["swap"])
    batch.refresh_metadata()
    snaps.append(snap("swapped"))
    return snaps


def logitsprocs(case):
    from vllm.v1.sample import logits_processor as lp
    from vllm.v1.sample.logits_processor import LogitsProcessor, build_logitsprocs

    class Custom(LogitsProcessor):
        def __init__(self, vllm_config, device, is_pin_memory):
            pass

        def apply(self, logits):
            return logits

        def is_argmax_invariant(self):
            return False

        def update_state(self, batch_update):
            pass

    def cfg(spec):
        return types.SimpleNamespace(
            speculative_config=types.SimpleNamespace(method="ngram", num_speculative_tokens=2) if spec else None,
            scheduler_config=types.SimpleNamespace(max_num_seqs=8))

    cpu = torch.device("cpu")
    plain = build_logitsprocs(cfg(False), cpu, False, False)
    spec = build_logitsprocs(cfg(True), cpu, False, False)
    raised, message = None, None
    try:
        build_logitsprocs(cfg(True), cpu, False, False, custom_logitsprocs=[Custom])
    except Exception as e:
        raised, message = type(e).__name__, str(e)
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.logits_processor import LogitsProcessors
    sm = SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.tensor([]), presence_penalties=torch.tensor([]),
        repetition_penalties=torch.tensor([]), output_token_ids=[], allowed_token_ids_mask=None,
        bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    const = getattr(lp, "STR_SPEC_DEC_REJECTS_LOGITSPROCS", None)
    return {"plain": sorted(type(p).__name__ for p in plain.all),
            "spec": sorted(type(p).__name__ for p in spec.all),
            "raised": raised, "message": message,
            "constant": const if isinstance(const, str) else None,
            "default_spec_tokens_is_none": sm.spec_token_ids is None}


SCENARIOS = {"verify": verify, "bonus": bonus, "input_batch": input_batch, "logitsprocs": logitsprocs}
emit(result=SCENARIOS[ARGS["scenario"]](ARGS["case"]))
'''


# ---- the judge's scenarios ----

def _req(prompt, output, drafts, rows, bonus, **kw):
    return dict(prompt=prompt, output=output, drafts=drafts, rows=rows, bonus=bonus, **kw)


# Penalties on draft positions (no bad words, no allowed sets). Row dicts: token -> logit, other
# tokens 0. Request 1 has no drafts (no rows) between requests that have some.
_PENALTIES = {"vocab": 32, "requests": [
    _req([1, 2], [3], [7, 7, 7], [{7: 5.0, 8: 4.5}, {7: 5.0, 8: 4.5}, {7: 5.0, 8: 4.5}], 9, freq=1.0),
    _req([4], [4], [], [], 9, freq=0.5),
    _req([12], [13, 13], [14, 15], [{14: 3.0, 13: 3.5, 12: 3.4}, {15: 3.0, 14: 4.0, 12: 3.8}], 16,
         pres=2.0, rep=2.0),
    _req([20], [21], [22, 21, 23], [{22: 3.0, 21: 1.0}, {21: 1.0, 23: 2.2}, {23: 2.0, 21: 0.0}], 24,
         freq=-1.5),
]}

# Bad words (one-, two- and three-token words completed by drafts) on the first two requests, an
# allowed set on the third, nothing on the fourth (whose drafts the third's set would forbid).
_BAD_WORDS = {"vocab": 32, "requests": [
    _req([30], [9], [3, 4, 6], [{3: 4.0, 5: 4.5}, {4: 4.0, 6: 3.0}, {6: 4.0}], 10, bad=[[3, 4], [5]]),
    _req([30], [2], [4, 7, 8], [{4: 4.0, 11: 5.0}, {7: 4.0, 1: 3.5}, {8: 4.0, 1: 3.5}], 10,
         bad=[[4, 7, 8], [11]]),
    _req([30], [], [6, 12], [{6: 2.0, 12: 1.0}, {12: 5.0, 7: 1.0}], 10, allowed=list(range(8))),
    _req([30], [1], [12, 13], [{12: 2.0}, {13: 2.0}], 14),
]}

# Bonus rows, one per request: a frequency penalty that the drafts trigger, a three-token bad word
# that the drafts complete, and a request without drafts (presence penalty on its output).
_BONUS = {"vocab": 32, "requests": [
    _req([1], [3], [5, 5], [], 0, freq=1.0, bonus_row={5: 3.0, 6: 2.5}),
    _req([1], [2], [4, 7], [], 0, bad=[[4, 7, 8]], bonus_row={8: 3.0, 9: 2.0}),
    _req([1], [1], [], [], 0, pres=2.0, bonus_row={1: 3.0, 2: 2.0}),
]}

_BATCH = {
    "requests": {name: {"prompt": [1 + k, 2 + k, 3 + k], "output": [10 + k] * (k + 1)}
                 for k, name in enumerate(["r0", "r1", "r2", "r3", "r4", "r5"])},
    "first": ["r0", "r1", "r2", "r3", "r4"],
    "drafts": {"r0": [40, 41], "r1": [42], "r2": [43, 44, 45], "r3": [46, 47], "r4": [48]},
    "rewrite": "r2", "drafts2": {"r2": [50, 51]},
    "remove": ["r1", "r3"], "late": "r5",
    "swap": [0, 2],
}

_CASES = {"verify_penalties": _PENALTIES, "verify_bad_words": _BAD_WORDS, "bonus": _BONUS,
          "input_batch": _BATCH, "logitsprocs": {}}


@functools.lru_cache(maxsize=None)
def _scenario(name):
    kind = {"verify_penalties": "verify", "verify_bad_words": "verify"}.get(name, name)
    return run(_DRIVER, {"scenario": kind, "case": _CASES[name]}, timeout=240)["result"]


# ---- the judge's reference ----

def _process(row, vocab, req, history):
    x = np.zeros(vocab, dtype=np.float64)
    for tok, val in row.items():
        x[tok] = val
    rep = req.get("rep", 1.0)
    for tok in set(req["prompt"]) | set(history):
        x[tok] = x[tok] / rep if x[tok] > 0 else x[tok] * rep
    counts = np.bincount(np.asarray(history, dtype=np.int64), minlength=vocab)[:vocab]
    x -= req.get("freq", 0.0) * counts
    x -= req.get("pres", 0.0) * (counts > 0)
    if req.get("allowed") is not None:
        banned = np.ones(vocab, dtype=bool)
        banned[req["allowed"]] = False
        x[banned] = -np.inf
    for word in req.get("bad", []):
        if len(word) > len(history) + 1:
            continue
        prefix = word[:-1]
        if not prefix or list(history[-len(prefix):]) == list(prefix):
            x[word[-1]] = -np.inf
    return x


def _argmax(x, where, strict=True):
    order = np.argsort(-x, kind="stable")
    top, second = x[order[0]], x[order[1]]
    if strict:
        assert np.isfinite(top) and top - second >= 0.25, f"judge scenario: no clear argmax at {where}"
    return int(order[0])


def _history(req, j, variant):
    out, d = list(req["output"]), list(req["drafts"])
    return {"specified": out + d[:j], "no_drafts": out, "all_drafts": out + d,
            "no_output": d[:j]}[variant]


def _greedy(case, variant="specified"):
    vocab, reqs = case["vocab"], case["requests"]
    width = max(len(r["drafts"]) for r in reqs) + 1
    rows = []
    for i, r in enumerate(reqs):
        got = []
        for j, d in enumerate(r["drafts"]):
            if variant == "unprocessed":
                x = _process(r["rows"][j], vocab, {"prompt": []}, [])
            else:
                x = _process(r["rows"][j], vocab, r, _history(r, j, variant))
            t = _argmax(x, f"request {i}, draft position {j}", strict=variant == "specified")
            got.append(t)
            if t != d:
                break
        else:
            got.append(r["bonus"])
        rows.append(got + [-1] * (width - len(got)))
    return rows


def _bonus_expected(case, predict_bonus):
    vocab = case["vocab"]
    out = []
    for i, r in enumerate(case["requests"]):
        history = list(r["output"]) + (list(r["drafts"]) if predict_bonus else [])
        out.append(_argmax(_process(r["bonus_row"], vocab, r, history), f"bonus row {i}"))
    return out


def _discriminates(case, variants):
    want = _greedy(case)
    for v in variants:
        assert _greedy(case, v) != want, f"judge scenario does not tell the specified history from {v!r}"
    return want


def _check_verify(name, case, variants):
    want = _discriminates(case, variants)
    got = _scenario(name)
    assert isinstance(got, list) and len(got) == len(want), f"rejection sampler returned {got!r}"
    for i, (g, w) in enumerate(zip(got, want)):
        r = case["requests"][i]
        assert list(g) == w, (
            f"request {i} (output {r['output']}, drafts {r['drafts']}): rejection sampler gave {list(g)}, "
            f"want {w} (greedy verification of rows processed with output + earlier drafts)")


def test_penalties_use_earlier_drafts():
    # Frequency (positive and negative), presence and repetition penalties on the target rows of
    # draft positions: each row is penalised with the request's prompt and its output tokens plus
    # the drafts before that position; a request without drafts sits between the others.
    _check_verify("verify_penalties", _PENALTIES, ["no_drafts", "all_drafts", "no_output", "unprocessed"])


def test_bad_words_and_allowed_tokens_on_drafts():
    # One-token bad words banned everywhere, two- and three-token bad words whose prefix ends in the
    # earlier drafts, an allowed set on one request only (the next request's drafts lie outside it).
    _check_verify("verify_bad_words", _BAD_WORDS, ["no_drafts", "all_drafts", "unprocessed"])


def test_bonus_token_history_includes_drafts():
    # Sampler(predict_bonus_token=True) penalises and bans with output + all drafts of a request;
    # predict_bonus_token=False with the output tokens only, even though spec_token_ids is set.
    want_bonus, want_plain = _bonus_expected(_BONUS, True), _bonus_expected(_BONUS, False)
    assert want_bonus != want_plain, "judge scenario does not tell the two histories apart"
    got = _scenario("bonus")
    assert got["True"] == want_bonus, (
        f"bonus sampling (predict_bonus_token=True) gave {got['True']}, want {want_bonus} "
        f"(history: output tokens + all drafts)")
    assert got["False"] == want_plain, (
        f"plain sampling (predict_bonus_token=False) gave {got['False']}, want {want_plain} "
        f"(history: output tokens only)")


def test_input_batch_tracks_draft_tokens():
    # InputBatch.spec_token_ids follows each request through add (a fresh request gets [] even in a
    # reused slot), remove + condense and swap_states, and the batch's sampling metadata sees the
    # entries, also right after a write that did not rebuild the metadata.
    case = _BATCH
    current = {name: [] for name in case["requests"]}
    expect_after = {
        "added": {},
        "drafts written": case["drafts"],
        "drafts rewritten, metadata not rebuilt": case["drafts2"],
        "removed, added, condensed": {},
        "swapped": {},
    }
    snaps = _scenario("input_batch")
    labels = [s["label"] for s in snaps]
    assert labels == list(expect_after), f"driver snapshots {labels}"
    alive = set()
    for s in snaps:
        label = s["label"]
        if label == "added":
            alive = set(case["first"])
        if label == "removed, added, condensed":
            alive = (alive - set(case["remove"])) | {case["late"]}
        current.update({k: list(v) for k, v in expect_after[label].items()})
        assert sorted(s["req_ids"]) == sorted(alive), f"{label}: batch holds {s['req_ids']}, want {sorted(alive)}"
        want = [current[name] for name in s["req_ids"]]
        outs = [case["requests"][name]["output"] for name in s["req_ids"]]
        assert s["outputs"] == outs, f"{label}: output tokens {s['outputs']} do not follow {s['req_ids']}"
        assert s["batch"] == want, (
            f"{label}: InputBatch.spec_token_ids is {s['batch']} for requests {s['req_ids']}, want {want}")
        assert s["metadata"] == want, (
            f"{label}: sampling_metadata.spec_token_ids is {s['metadata']} for requests {s['req_ids']}, "
            f"want {want}")


def test_logits_processors_under_speculative_decoding():
    # build_logitsprocs with a speculative config: no built-in processors, custom ones refused with
    # ValueError naming STR_SPEC_DEC_REJECTS_LOGITSPROCS; without it the built-ins load as before.
    # SamplingMetadata built without spec_token_ids has it None.
    got = _scenario("logitsprocs")
    assert got["plain"] == ["LogitBiasLogitsProcessor", "MinPLogitsProcessor", "MinTokensLogitsProcessor"], (
        f"without speculative decoding build_logitsprocs loaded {got['plain']}")
    assert got["spec"] == [], f"with speculative decoding build_logitsprocs loaded {got['spec']}, want none"
    assert got["constant"], "vllm.v1.sample.logits_processor.STR_SPEC_DEC_REJECTS_LOGITSPROCS is missing or not a non-empty str"
    assert got["raised"] == "ValueError", (
        f"custom logits processors with speculative decoding: raised {got['raised']!r}, want ValueError")
    assert got["constant"] in (got["message"] or ""), (
        f"the ValueError's message {got['message']!r} does not contain STR_SPEC_DEC_REJECTS_LOGITSPROCS")
    assert got["default_spec_tokens_is_none"] is True, "SamplingMetadata().spec_token_ids does not default to None"
