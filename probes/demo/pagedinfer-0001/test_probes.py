"""Probes for pagedinfer-0001 (prefix caching)."""

from pagedinfer import LLMEngine, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=6)


def _plain(prompts):
    return [o.tokens for o in LLMEngine(num_blocks=64, block_size=4).generate(prompts, GREEDY)]


def test_a_block_is_only_reused_after_the_same_prefix():
    # b's blocks hold the same tokens as a's second block, but follow a different prefix: their
    # keys differ, so only the whole prefix identifies a block.
    a = [1, 1, 1, 1, 7, 7, 7, 7, 2]
    b = [7, 7, 7, 7, 7, 7, 7, 7, 2]
    eng = LLMEngine(num_blocks=64, block_size=4, enable_prefix_caching=True)
    got = [eng.generate([p], GREEDY)[0].tokens for p in (a, b)]
    assert got == _plain([a, b])
    assert eng.block_manager.prefix_cache_hits == 0


def test_blocks_of_a_finished_request_stay_cached():
    prompt = [2, 7, 1, 8, 2, 8, 1, 8, 2]
    eng = LLMEngine(num_blocks=64, block_size=4, enable_prefix_caching=True)
    first = eng.generate([prompt], GREEDY)[0].tokens
    assert eng.block_manager.prefix_cache_hits == 0
    second = eng.generate([prompt], GREEDY)[0].tokens
    assert eng.block_manager.prefix_cache_hits == 2
    assert first == second == _plain([prompt])[0]


def test_prefix_caching_is_off_unless_asked_for():
    prompt = [4, 4, 4, 4, 4, 4, 4, 4]
    eng = LLMEngine(num_blocks=64, block_size=4)
    assert eng.block_manager.enable_prefix_caching is False
    eng.generate([prompt, prompt], GREEDY)
    assert eng.block_manager.prefix_cache_hits == 0
    assert LLMEngine(enable_prefix_caching=True).block_manager.enable_prefix_caching is True
