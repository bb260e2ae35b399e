"""Probes for pagedinfer-0004 (logprobs)."""

from pagedinfer import LLMEngine, SamplingParams


def test_the_sampled_token_is_always_reported():
    out = LLMEngine(seed=11).generate([[5, 4, 3]], SamplingParams(temperature=3.0, max_tokens=40, logprobs=1))[0]
    assert any(len(e) == 2 for e in out.logprobs), "a hot sampler picks tokens outside the top 1"
    for tok, entry in zip(out.tokens, out.logprobs):
        assert tok in entry and len(entry) <= 2
