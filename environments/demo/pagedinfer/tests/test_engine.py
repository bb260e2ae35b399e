import numpy as np

from pagedinfer import LLMEngine, SamplingParams
from pagedinfer.model import ToyModel


def _reference(model, prompt, max_tokens):
    """Greedy decoding without any cache: recompute every key from scratch."""
    tokens = list(prompt)
    out = []
    for _ in range(max_tokens):
        k = np.zeros(model.dim, np.float32)
        for t in tokens:
            k = model.key(t, k)
        nxt = int(np.argmax(model.logits(k)))
        out.append(nxt)
        tokens.append(nxt)
    return out


def test_greedy_matches_uncached_reference():
    eng = LLMEngine(num_blocks=32, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=6)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    outs = eng.generate(prompts, params)
    for p, o in zip(prompts, outs):
        assert o.tokens == _reference(eng.model, p, 6)
        assert o.finish_reason == "length"


def test_continuous_batching_admits_when_blocks_free_up():
    eng = LLMEngine(num_blocks=6, block_size=4, max_num_seqs=8)
    params = SamplingParams(temperature=0, max_tokens=2)
    outs = eng.generate([[1, 2, 3, 4, 5, 6]] * 4, params)
    assert all(len(o.tokens) == 2 for o in outs)
    assert eng.block_manager.num_free_blocks == 6


def test_stop_token_ends_a_request():
    eng = LLMEngine()
    first = eng.generate([[3, 1]], SamplingParams(temperature=0, max_tokens=5))[0].tokens[0]
    out = LLMEngine().generate([[3, 1]], SamplingParams(temperature=0, max_tokens=5, stop_token_ids=[first]))[0]
    assert out.tokens == [first] and out.finish_reason == "stop"


def test_sampling_is_reproducible_for_an_engine_seed():
    params = SamplingParams(temperature=1.0, max_tokens=8)
    a = LLMEngine(seed=7).generate([[1, 2]], params)[0].tokens
    b = LLMEngine(seed=7).generate([[1, 2]], params)[0].tokens
    assert a == b


def test_top_k_one_is_greedy():
    m = ToyModel()
    greedy = LLMEngine(model=m).generate([[5, 6]], SamplingParams(temperature=0, max_tokens=5))[0].tokens
    topk = LLMEngine(model=m, seed=3).generate([[5, 6]], SamplingParams(temperature=0.7, top_k=1, max_tokens=5))[0].tokens
    assert greedy == topk
