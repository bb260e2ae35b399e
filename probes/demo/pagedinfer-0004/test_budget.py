"""Budget probe for pagedinfer-0004: run alone, so the harness's cgroup peak is this test's.

The judge (this module) never imports pagedinfer: the code under test runs in a child process
(whose memory counts) and sends back plain data."""

from infradev_probe import run


def test_logprobs_of_a_long_generation_with_a_large_vocabulary():
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams
        from pagedinfer.model import ToyModel

        eng = LLMEngine(model=ToyModel(vocab_size=50000, dim=16), num_blocks=512, block_size=4)
        res = eng.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=1200, logprobs=5))[0]
        emit(num_tokens=len(res.tokens), sizes=[len(e) for e in res.logprobs])
    """)
    assert out["num_tokens"] == 1200, f"{out['num_tokens']} tokens generated"
    assert len(out["sizes"]) == 1200, f"{len(out['sizes'])} logprob entries for 1200 tokens"
    assert set(out["sizes"]) == {5}, f"entry sizes {sorted(set(out['sizes']))}, want 5 each"
