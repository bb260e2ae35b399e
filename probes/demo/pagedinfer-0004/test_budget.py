"""Budget probe for pagedinfer-0004: run alone, so the harness's cgroup peak is this test's."""

from pagedinfer import LLMEngine, SamplingParams
from pagedinfer.model import ToyModel


def test_logprobs_of_a_long_generation_with_a_large_vocabulary():
    eng = LLMEngine(model=ToyModel(vocab_size=50000, dim=16), num_blocks=512, block_size=4)
    out = eng.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=1200, logprobs=5))[0]
    assert len(out.logprobs) == 1200 and all(len(e) == 5 for e in out.logprobs)
