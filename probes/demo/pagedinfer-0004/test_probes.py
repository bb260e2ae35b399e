"""Probes for pagedinfer-0004 (logprobs).

The judge (this module) never imports pagedinfer: each probe drives the code under test in a
child process and checks the plain data it sends back."""

import math

from infradev_probe import run


def test_the_sampled_token_is_always_reported():
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams

        res = LLMEngine(seed=11).generate([[5, 4, 3]], SamplingParams(temperature=3.0, max_tokens=40, logprobs=1))[0]
        emit(tokens=[int(t) for t in res.tokens],
             logprobs=[[[int(t), float(lp)] for t, lp in entry.items()] for entry in res.logprobs])
    """)
    tokens, entries = out["tokens"], out["logprobs"]
    assert tokens, "no tokens generated"
    assert len(entries) == len(tokens), f"{len(entries)} logprob entries for {len(tokens)} tokens"
    assert any(len(e) == 2 for e in entries), "a hot sampler picks tokens outside the top 1"
    for i, (tok, pairs) in enumerate(zip(tokens, entries)):
        entry = dict((t, lp) for t, lp in pairs)
        assert tok in entry, f"token {i} ({tok}) is missing from its logprobs {sorted(entry)}"
        assert len(entry) <= 2, f"token {i}: {len(entry)} entries for logprobs=1"
        for t, lp in entry.items():
            assert math.isfinite(lp) and lp <= 1e-9, f"token {i}: logprob {lp} of {t} is not a log-probability"
