"""Probes for pagedinfer-0004 (logprobs).

The judge (this module) never imports pagedinfer: the probe runs a hot sampler on fresh prompts
and seeds over the submission and, in a reference child, over gold, and compares every token
and logprob entry."""

from infradev_probe import fresh, reference, run, same

_DRIVER = """
from pagedinfer import LLMEngine, SamplingParams

res = LLMEngine(seed=ARGS["seed"]).generate([ARGS["prompt"]], SamplingParams(
    temperature=ARGS["temperature"], max_tokens=ARGS["max_tokens"], logprobs=ARGS["k"]))[0]
emit(tokens=[int(t) for t in res.tokens],
     logprobs=[sorted([int(t), float(lp)] for t, lp in entry.items()) for entry in res.logprobs])
"""


def test_the_sampled_token_is_always_reported():
    rng = fresh()
    args = {"seed": int(rng.integers(1 << 31)), "prompt": [int(t) for t in rng.integers(0, 64, size=int(rng.integers(1, 6)))],
            "temperature": float(rng.uniform(2.5, 4.0)), "max_tokens": int(rng.integers(30, 50)), "k": int(rng.integers(1, 3))}
    got, want = run(_DRIVER, args), reference(_DRIVER, args)
    assert any(len(e) == args["k"] + 1 for e in want["logprobs"]), "a hot sampler picks tokens outside the top k"
    same(got, want, rtol=1e-9, atol=1e-12)
