"""Budget probe for pagedinfer-0004: run alone, so the harness's cgroup peak is this test's.

The judge (this module) never imports pagedinfer: the code under test runs in a child process
(whose memory counts) and sends back plain data, which the judge checks against the greedy
decoding and top-k logprobs of the engine's toy model that it computes itself."""

import numpy as np

from infradev_probe import fresh, run


def _greedy_top(vocab, prompt, max_tokens, k):
    """ToyModel(vocab_size=vocab, dim=16) (seed 0): greedy tokens and each step's top-k."""
    g = np.random.default_rng(0)
    embed = g.standard_normal((vocab, 16)).astype(np.float32)
    head = (g.standard_normal((16, vocab)) / np.sqrt(16)).astype(np.float32)
    key, tokens, tops = np.zeros(16, np.float32), [], []
    for t in prompt:
        key = np.tanh(embed[t] + 0.9 * key)
    while len(tokens) < max_tokens:
        logits = (key @ head).astype(np.float64) * 4.0
        token = int(np.argmax(logits))
        tokens.append(token)
        tops.append(sorted(int(i) for i in np.argpartition(-logits, k)[:k]))
        key = np.tanh(embed[token] + 0.9 * key)
    return tokens, tops


def test_logprobs_of_a_long_generation_with_a_large_vocabulary():
    rng = fresh()
    vocab, n, k = int(rng.integers(45000, 55000)), int(rng.integers(1100, 1300)), int(rng.integers(4, 7))
    prompt = [int(t) for t in rng.integers(0, vocab, size=3)]
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams
        from pagedinfer.model import ToyModel

        eng = LLMEngine(model=ToyModel(vocab_size=ARGS["vocab"], dim=16), num_blocks=512, block_size=4)
        res = eng.generate([ARGS["prompt"]], SamplingParams(temperature=0, max_tokens=ARGS["n"], logprobs=ARGS["k"]))[0]
        emit(tokens=[int(t) for t in res.tokens], tops=[sorted(int(t) for t in e) for e in res.logprobs])
    """, {"vocab": vocab, "n": n, "k": k, "prompt": prompt})
    tokens, tops = _greedy_top(vocab, prompt, n, k)
    assert out["tokens"] == tokens, "the tokens are not greedy decoding's"
    assert out["tops"] == tops, f"the logprob entries are not each step's top {k}"
