"""Budget probe for pagedinfer-0003: run alone, so the harness's CPU time is this test's.

The judge (this module) never imports pagedinfer: the code under test runs in a child process
(whose time counts) and sends back plain data, which the judge checks against greedy decoding
of the engine's default model that it computes itself."""

import numpy as np

from infradev_probe import fresh, run


def _greedy(first, second, max_tokens):
    """Greedy tokens of the engine's default model (vocabulary 64, keys of 16, seed 0): each
    token's key is tanh(embed[token] + 0.9 * previous key), logits 4 * key @ head."""
    g = np.random.default_rng(0)
    embed = g.standard_normal((64, 16)).astype(np.float32)
    head = (g.standard_normal((16, 64)) / np.sqrt(16)).astype(np.float32)
    key, out = np.zeros(16, np.float32), []
    for t in (first, second):
        key = np.tanh(embed[t] + 0.9 * key)
    while len(out) < max_tokens:
        token = int(np.argmax((key @ head).astype(np.float64) * 4.0))
        out.append(token)
        key = np.tanh(embed[token] + 0.9 * key)
    return out


def test_preempting_a_large_batch_is_linear():
    # Every running sequence fills its only block at once: the first decode step preempts half
    # of a large batch.
    rng = fresh()
    n = int(rng.integers(36000, 44000))
    second = int(rng.integers(0, 64))
    firsts = [int(x) for x in rng.integers(0, 64, size=n)]
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams

        n = len(ARGS["firsts"])
        eng = LLMEngine(num_blocks=n, block_size=2, max_num_seqs=n)
        outs = eng.generate([[f, ARGS["second"]] for f in ARGS["firsts"]], SamplingParams(temperature=0, max_tokens=2))
        emit(tokens=[[int(t) for t in o.tokens] for o in outs], preemptions=int(eng.scheduler.num_preemptions))
    """, {"firsts": firsts, "second": second})
    assert len(out["tokens"]) == n, f"{len(out['tokens'])} outputs for {n} prompts"
    table = {f: _greedy(f, second, 2) for f in set(firsts)}
    wrong = sum(1 for f, got in zip(firsts, out["tokens"]) if got != table[f])
    assert wrong == 0, f"{wrong} of {n} requests did not get greedy decoding's tokens"
    assert out["preemptions"] >= n // 2, f"{out['preemptions']} preemptions, want at least {n // 2}"
