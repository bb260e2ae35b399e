"""Hidden probes for vllm-0012 (speculative decoding: penalties, bad words and allowed tokens on
draft positions, bonus-token history, draft tokens in the input batch, logits processors under
speculative decoding).

The judge never imports vllm or torch. Each probe runs one driver in a child process on cuda:0
(the rejection sampler's kernels are Triton); the child builds the sampling metadata, logits and
input batch from the judge's plain lists and sends back token ids and lists.

Every scenario is drawn fresh (``fresh()``): vocabulary size, requests, prompts, output tokens,
drafts (with a request without drafts between others), penalties, bad words, allowed sets, the
logit rows, request names, which requests are removed, rewritten and swapped, and the names of
custom logits processors. The judge derives the expected tokens with its own numpy version of the
instruction's rules: the history of draft position j is the output tokens plus the first j
drafts, the bonus history is the output tokens plus all drafts, greedy verification accepts drafts
while they equal the argmax of the processed row. A drawn scenario is used only when every argmax
it relies on wins by a clear margin and it tells the specified history apart from the plausible
wrong ones (no drafts, all drafts, no output tokens, no processing at all, per-request settings on
the wrong requests); otherwise the judge draws again."""

import numpy as np

from infradev_probe import fresh, run

_DRIVER = r'''
import types

import numpy as np
import torch

DEV = torch.device("cuda", 0)


def logits_rows(rows, vocab):
    t = torch.zeros((len(rows), vocab), dtype=torch.float32)
    for r, row in enumerate(rows):
        t[r] = torch.from_numpy(np.asarray(row, dtype=np.float32))
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
    for name in case["late"]:
        add(name)
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

    customs = [type(name, (Custom,), {}) for name in case["customs"]]

    def cfg(spec):
        return types.SimpleNamespace(
            speculative_config=types.SimpleNamespace(
                method=case["method"], num_speculative_tokens=case["num_spec"]) if spec else None,
            scheduler_config=types.SimpleNamespace(max_num_seqs=case["max_num_seqs"]))

    cpu = torch.device("cpu")
    plain = build_logitsprocs(cfg(False), cpu, False, False, custom_logitsprocs=customs)
    spec = build_logitsprocs(cfg(True), cpu, False, False)
    raised, message = None, None
    try:
        build_logitsprocs(cfg(True), cpu, False, False, custom_logitsprocs=customs)
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


def _drive(kind, case):
    return run(_DRIVER, {"scenario": kind, "case": case}, timeout=240)["result"]


# ---- the judge's reference ----

def _process(row, vocab, req, history):
    x = np.asarray(row, dtype=np.float64).copy()
    assert x.shape == (vocab,)
    rep = req.get("rep", 1.0)
    for tok in set(req.get("prompt", [])) | set(history):
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


class _Unclear(Exception):
    """A drawn scenario whose outcome would hang on a near tie: the judge draws again."""


def _argmax(x, strict=True):
    order = np.argsort(-x, kind="stable")
    top, second = x[order[0]], x[order[1]]
    if strict and not (np.isfinite(top) and top - second >= 0.25):
        raise _Unclear()
    return int(order[0])


def _history(req, j, variant):
    out, d = list(req["output"]), list(req["drafts"])
    return {"specified": out + d[:j], "no_drafts": out, "all_drafts": out + d,
            "no_output": d[:j]}[variant]


def _greedy(case, variant="specified"):
    """What greedy verification gives: the specified rules, or a plausible wrong version of
    them (``variant``)."""
    vocab, reqs = case["vocab"], case["requests"]
    width = max(len(r["drafts"]) for r in reqs) + 1
    drafted = [i for i, r in enumerate(reqs) if r["drafts"]]
    rows = []
    for i, r in enumerate(reqs):
        params = r
        if variant == "compacted" and r["drafts"]:
            # Per-request settings looked up by the request's rank among those with drafts.
            params = reqs[drafted.index(i)]
        if variant == "allowed_everywhere":
            masks = [q["allowed"] for q in reqs if q.get("allowed") is not None]
            params = dict(r, allowed=masks[0]) if masks else r
        got = []
        for j, d in enumerate(r["drafts"]):
            if variant == "unprocessed":
                x = _process(r["rows"][j], vocab, {}, [])
            else:
                hist_variant = variant if variant in ("no_drafts", "all_drafts", "no_output") else "specified"
                hist = _history(dict(r, output=params["output"]), j, hist_variant)
                x = _process(r["rows"][j], vocab, params, hist)
            t = _argmax(x, strict=variant == "specified")
            got.append(t)
            if t != d:
                break
        else:
            got.append(r["bonus"])
        rows.append(got + [-1] * (width - len(got)))
    return rows


def _row(rng, vocab, strong):
    """A logit row in multiples of 1/8: low noise, and the given tokens at given values."""
    x = rng.integers(-16, 9, vocab) / 8.0
    for tok, val in strong.items():
        x[tok] = val
    return x.astype(np.float32)


def _eighths(rng, lo, hi):
    return float(rng.integers(int(lo * 8), int(hi * 8) + 1)) / 8.0


def _penalty_case(rng):
    vocab = int(rng.integers(24, 65))
    n = int(rng.integers(3, 6))
    empty = int(rng.integers(1, n - 1))  # a request without drafts, between others
    pool = [int(t) for t in rng.choice(vocab, size=int(rng.integers(5, 9)), replace=False)]
    reqs = []
    for i in range(n):
        prompt = [int(t) for t in rng.choice(vocab, size=int(rng.integers(1, 5)))]
        if rng.integers(2):
            prompt[0] = int(rng.choice(pool))
        output = [int(rng.choice(pool)) for _ in range(int(rng.integers(0 if i else 1, 5)))]
        drafts = [] if i == empty else [int(rng.choice(pool)) for _ in range(int(rng.integers(1, 5)))]
        rows = []
        for j, d in enumerate(drafts):
            base = _eighths(rng, 2.5, 4.5)
            strong = {d: base}
            for c in rng.choice(pool, size=int(rng.integers(1, 3)), replace=False):
                if int(c) != d:
                    strong[int(c)] = base + _eighths(rng, -1.5, 1.5)
            rows.append(_row(rng, vocab, strong))
        kind = int(rng.integers(4))
        req = {"prompt": prompt, "output": output, "drafts": drafts, "rows": rows,
               "bonus": int(rng.integers(vocab)),
               "freq": [_eighths(rng, 0.5, 2.0), -_eighths(rng, 0.5, 1.5), 0.0, _eighths(rng, -1.0, 1.0)][kind],
               "pres": [0.0, 0.0, _eighths(rng, 0.5, 2.0), _eighths(rng, 0.0, 1.0)][kind],
               "rep": [1.0, 1.0, float(rng.choice([1.5, 2.0])), float(rng.choice([1.0, 1.25, 2.0]))][kind]}
        reqs.append(req)
    return {"vocab": vocab, "requests": reqs}


def _bad_words_case(rng):
    vocab = int(rng.integers(24, 49))
    n = int(rng.integers(4, 6))
    with_bad = int(rng.integers(2, n - 1))  # bad words on the first requests, in batch order
    allowed_at = int(rng.integers(with_bad, n - 1))  # an allowed set, with a request after it
    pool = [int(t) for t in rng.choice(vocab, size=int(rng.integers(6, 10)), replace=False)]
    allowed = sorted(int(t) for t in rng.choice(vocab, size=vocab // 3, replace=False))
    outside = [t for t in range(vocab) if t not in allowed]
    reqs = []
    for i in range(n):
        output = [int(rng.choice(pool)) for _ in range(int(rng.integers(0, 4)))]
        src = outside if i == allowed_at + 1 else (allowed if i == allowed_at else pool)
        drafts = [int(rng.choice(src)) for _ in range(int(rng.integers(2, 5)))]
        rows, bad = [], []
        for j, d in enumerate(drafts):
            base = _eighths(rng, 2.5, 4.5)
            strong = {d: base}
            rivals = [int(t) for t in rng.choice(src, size=2) if int(t) != d]
            for c in rivals:
                strong[c] = base + _eighths(rng, -1.0, 1.5)
            rows.append(_row(rng, vocab, strong))
            history = output + drafts[:j]
            if i < with_bad and rivals and rng.integers(2):
                c = rivals[0]
                longest = min(2, len(history))
                p = int(rng.integers(0, longest + 1))
                bad.append((history[len(history) - p:] if p else []) + [c])
        if i < with_bad:
            if not bad or rng.integers(2):
                bad.append([int(rng.choice(pool))])
            if rng.integers(2):
                bad.append([int(rng.choice(pool)) for _ in range(int(rng.integers(2, 4)))])
        req = {"prompt": [int(rng.integers(vocab))], "output": output, "drafts": drafts,
               "rows": rows, "bonus": int(rng.integers(vocab))}
        if bad:
            req["bad"] = bad
        if i == allowed_at:
            req["allowed"] = allowed
        reqs.append(req)
    return {"vocab": vocab, "requests": reqs}


def _draw(rng, make, variants):
    """A scenario whose specified outcome is clear and differs from every wrong variant."""
    for _ in range(2000):
        case = make(rng)
        try:
            want = _greedy(case)
        except _Unclear:
            continue
        if all(_greedy(case, v) != want for v in variants):
            return case, want
    raise AssertionError("probe setup: no usable scenario drawn")


def _check_verify(case, want):
    got = _drive("verify", case)
    assert isinstance(got, list) and len(got) == len(want), f"rejection sampler returned {got!r}"
    for i, (g, w) in enumerate(zip(got, want)):
        r = case["requests"][i]
        assert isinstance(g, list) and list(g) == w, (
            f"request {i} (output {r['output']}, drafts {r['drafts']}): rejection sampler gave {g}, "
            f"want {w} (greedy verification of rows processed with output + earlier drafts)")


def test_penalties_use_earlier_drafts():
    # Frequency (positive and negative), presence and repetition penalties on the target rows of
    # draft positions: each row is penalised with the request's prompt and its output tokens plus
    # the drafts before that position; a request without drafts sits between the others.
    rng = fresh()
    case, want = _draw(rng, _penalty_case,
                       ["no_drafts", "all_drafts", "no_output", "unprocessed", "compacted"])
    _check_verify(case, want)


def test_bad_words_and_allowed_tokens_on_drafts():
    # One-token bad words banned everywhere, multi-token bad words whose prefix ends in the
    # earlier drafts, an allowed set on one request only (the next request's drafts lie outside
    # it).
    rng = fresh()
    case, want = _draw(rng, _bad_words_case,
                       ["no_drafts", "all_drafts", "no_output", "unprocessed", "allowed_everywhere"])
    _check_verify(case, want)


def _bonus_expected(case, predict_bonus):
    vocab = case["vocab"]
    out = []
    for r in case["requests"]:
        history = list(r["output"]) + (list(r["drafts"]) if predict_bonus else [])
        out.append(_argmax(_process(r["bonus_row"], vocab, r, history)))
    return out


def _bonus_case(rng):
    vocab = int(rng.integers(24, 49))
    n = int(rng.integers(3, 6))
    pool = [int(t) for t in rng.choice(vocab, size=int(rng.integers(5, 9)), replace=False)]
    reqs = []
    for i in range(n):
        output = [int(rng.choice(pool)) for _ in range(int(rng.integers(0, 4)))]
        drafts = [] if i == n - 1 else [int(rng.choice(pool)) for _ in range(int(rng.integers(1, 4)))]
        base = _eighths(rng, 2.5, 4.5)
        strong = {}
        for c in rng.choice(pool, size=3, replace=False):
            strong[int(c)] = base + _eighths(rng, -1.5, 1.5)
        req = {"prompt": [int(rng.integers(vocab))], "output": output, "drafts": drafts, "rows": [],
               "bonus": 0, "bonus_row": _row(rng, vocab, strong)}
        kind = int(rng.integers(3))
        if kind == 0:
            req["freq"] = _eighths(rng, 0.5, 2.0)
        elif kind == 1:
            req["pres"] = _eighths(rng, 0.5, 2.0)
        hist = output + drafts
        if kind == 2 or rng.integers(2):
            p = int(rng.integers(1, min(2, len(hist)) + 1)) if hist else 0
            req["bad"] = [(hist[len(hist) - p:] if p else []) + [int(rng.choice(list(strong)))]]
        reqs.append(req)
    return {"vocab": vocab, "requests": reqs}


def test_bonus_token_history_includes_drafts():
    # Sampler(predict_bonus_token=True) penalises and bans with output + all drafts of a request;
    # predict_bonus_token=False with the output tokens only, even though spec_token_ids is set.
    rng = fresh()
    for _ in range(2000):
        case = _bonus_case(rng)
        try:
            want_bonus, want_plain = _bonus_expected(case, True), _bonus_expected(case, False)
        except _Unclear:
            continue
        if want_bonus != want_plain:
            break
    else:
        raise AssertionError("probe setup: no usable scenario drawn")
    got = _drive("bonus", case)
    assert isinstance(got, dict) and set(got) == {"True", "False"}, f"bonus sampling returned {got!r}"
    assert got["True"] == want_bonus, (
        f"bonus sampling (predict_bonus_token=True) gave {got['True']}, want {want_bonus} "
        f"(history: output tokens + all drafts)")
    assert got["False"] == want_plain, (
        f"plain sampling (predict_bonus_token=False) gave {got['False']}, want {want_plain} "
        f"(history: output tokens only)")


def _batch_case(rng):
    names = [f"req-{int(x):06d}" for x in rng.choice(10 ** 6, size=9, replace=False)]
    first_n = int(rng.integers(4, 8))
    first, spare = names[:first_n], names[first_n:]
    requests = {name: {"prompt": [int(t) for t in rng.integers(1, 64, int(rng.integers(1, 6)))],
                       "output": [int(t) for t in rng.integers(1, 64, int(rng.integers(1, 5)))]}
                for name in names}
    # Distinct, non-empty drafts per request (and [] for the late one), so that any entry that
    # lands on the wrong request shows.
    seen, drafts = set(), {}
    for name in first + ["rewritten"]:
        while True:
            d = tuple(int(t) for t in rng.integers(1, 64, int(rng.integers(1, 5))))
            if d not in seen:
                seen.add(d)
                drafts[name] = list(d)
                break
    rewrite = str(rng.choice(first))
    drafts2 = {rewrite: drafts.pop("rewritten")}
    # Remove one or two requests (the late request reuses a slot that held drafts).
    others = [name for name in first if name != rewrite]
    remove = [str(x) for x in rng.choice(others, size=int(rng.integers(1, 3)), replace=False)]
    late = spare[:1]
    alive = first_n - len(remove) + len(late)
    i1, i2 = (int(x) for x in rng.choice(alive, size=2, replace=False))
    return {"requests": requests, "first": first, "drafts": drafts, "rewrite": rewrite,
            "drafts2": drafts2, "remove": remove, "late": late, "swap": [i1, i2]}


def test_input_batch_tracks_draft_tokens():
    # InputBatch.spec_token_ids follows each request through add (a fresh request gets [] even in a
    # reused slot), remove + condense and swap_states, and the batch's sampling metadata sees the
    # entries, also right after a write that did not rebuild the metadata.
    rng = fresh()
    case = _batch_case(rng)
    current = {name: [] for name in case["requests"]}
    expect_after = {
        "added": {},
        "drafts written": case["drafts"],
        "drafts rewritten, metadata not rebuilt": case["drafts2"],
        "removed, added, condensed": {},
        "swapped": {},
    }
    snaps = _drive("input_batch", case)
    assert isinstance(snaps, list), f"driver returned {snaps!r}"
    labels = [s["label"] for s in snaps]
    assert labels == list(expect_after), f"driver snapshots {labels}"
    alive = set()
    for s in snaps:
        label = s["label"]
        if label == "added":
            alive = set(case["first"])
        if label == "removed, added, condensed":
            alive = (alive - set(case["remove"])) | set(case["late"])
        current.update({k: list(v) for k, v in expect_after[label].items()})
        assert isinstance(s["req_ids"], list) and sorted(s["req_ids"]) == sorted(alive), (
            f"{label}: batch holds {s['req_ids']}, want {sorted(alive)}")
        want = [current[name] for name in s["req_ids"]]
        outs = [case["requests"][name]["output"] for name in s["req_ids"]]
        assert s["outputs"] == outs, f"{label}: output tokens {s['outputs']} do not follow {s['req_ids']}"
        assert s["batch"] == want, (
            f"{label}: InputBatch.spec_token_ids is {s['batch']} for requests {s['req_ids']}, want {want}")
        assert s["metadata"] == want, (
            f"{label}: sampling_metadata.spec_token_ids is {s['metadata']} for requests {s['req_ids']}, "
            f"want {want}")


_BUILTINS = ["LogitBiasLogitsProcessor", "MinPLogitsProcessor", "MinTokensLogitsProcessor"]


def test_logits_processors_under_speculative_decoding():
    # build_logitsprocs with a speculative config: no built-in processors, custom ones refused with
    # ValueError naming STR_SPEC_DEC_REJECTS_LOGITSPROCS; without it the built-ins and the custom
    # ones load as before. SamplingMetadata built without spec_token_ids has it None.
    rng = fresh()
    customs = [f"Probe{int(x):08x}LogitsProcessor" for x in rng.choice(1 << 31, size=int(rng.integers(1, 4)),
                                                                      replace=False)]
    case = {"customs": customs, "method": str(rng.choice(["ngram", "eagle", "medusa"])),
            "num_spec": int(rng.integers(1, 6)), "max_num_seqs": int(rng.integers(2, 64))}
    got = _drive("logitsprocs", case)
    want_plain = sorted(_BUILTINS + customs)
    assert got["plain"] == want_plain, (
        f"without speculative decoding build_logitsprocs loaded {got['plain']}, want {want_plain}")
    assert got["spec"] == [], f"with speculative decoding build_logitsprocs loaded {got['spec']}, want none"
    assert isinstance(got["constant"], str) and got["constant"], \
        "vllm.v1.sample.logits_processor.STR_SPEC_DEC_REJECTS_LOGITSPROCS is missing or not a non-empty str"
    assert got["raised"] == "ValueError", (
        f"custom logits processors with speculative decoding: raised {got['raised']!r}, want ValueError")
    assert isinstance(got["message"], str) and got["constant"] in got["message"], (
        f"the ValueError's message {got['message']!r} does not contain STR_SPEC_DEC_REJECTS_LOGITSPROCS")
    assert got["default_spec_tokens_is_none"] is True, "SamplingMetadata().spec_token_ids does not default to None"
