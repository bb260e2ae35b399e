"""Probes for pagedinfer-0001 (prefix caching).

The judge (this module) never imports pagedinfer: each probe drives the code under test in a
child process and compares the plain data it sends back with greedy decoding it computes itself."""

import numpy as np

from infradev_probe import run

MAX_TOKENS = 6


def _reference(prompt):
    """Greedy tokens of the engine's default model, with a vocabulary of 64, keys of 16 and
    seed 0: each token's key is tanh(embed[token] + 0.9 * previous key), logits 4 * key @ head."""
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((64, 16)).astype(np.float32)
    head = (rng.standard_normal((16, 64)) / np.sqrt(16)).astype(np.float32)
    key, out = np.zeros(16, np.float32), []
    tokens = list(prompt)
    for p in range(len(tokens)):
        key = np.tanh(embed[tokens[p]] + 0.9 * key)
    while len(out) < MAX_TOKENS:
        token = int(np.argmax((key @ head).astype(np.float64) * 4.0))
        out.append(token)
        key = np.tanh(embed[token] + 0.9 * key)
    return out


# Runs prompts one after another through an engine with prefix caching (each generate() call
# is one list of prompts), and the same prompts through engines without it.
_DRIVER = """
    from pagedinfer import LLMEngine, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=ARGS["max_tokens"])
    eng = LLMEngine(num_blocks=64, block_size=4, enable_prefix_caching=True)
    cached, hits = [], []
    for prompt in ARGS["prompts"]:
        cached.append(list(eng.generate([prompt], greedy)[0].tokens))
        hits.append(eng.block_manager.prefix_cache_hits)
    plain = [list(o.tokens) for o in LLMEngine(num_blocks=64, block_size=4).generate(ARGS["prompts"], greedy)]
    emit(cached=cached, hits=hits, plain=plain)
"""


def _cached_then_plain(prompts):
    return run(_DRIVER, {"prompts": prompts, "max_tokens": MAX_TOKENS})


def test_a_block_is_only_reused_after_the_same_prefix():
    # b's blocks hold the same tokens as a's second block, but follow a different prefix: their
    # keys differ, so only the whole prefix identifies a block.
    a = [1, 1, 1, 1, 7, 7, 7, 7, 2]
    b = [7, 7, 7, 7, 7, 7, 7, 7, 2]
    out = _cached_then_plain([a, b])
    want = [_reference(a), _reference(b)]
    assert out["plain"] == want, "the engine without prefix caching is not greedy decoding"
    assert out["cached"] == want
    assert out["hits"] == [0, 0]


def test_blocks_of_a_finished_request_stay_cached():
    prompt = [2, 7, 1, 8, 2, 8, 1, 8, 2]
    out = _cached_then_plain([prompt, prompt])
    want = _reference(prompt)
    assert out["hits"][0] == 0
    assert out["hits"][1] == 2  # the prompt's two full blocks
    assert out["plain"] == [want, want], "the engine without prefix caching is not greedy decoding"
    assert out["cached"] == [want, want]


def test_prefix_caching_is_off_unless_asked_for():
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams

        prompt = [4, 4, 4, 4, 4, 4, 4, 4]
        eng = LLMEngine(num_blocks=64, block_size=4)
        default = eng.block_manager.enable_prefix_caching
        eng.generate([prompt, prompt], SamplingParams(temperature=0, max_tokens=ARGS["max_tokens"]))
        asked = LLMEngine(enable_prefix_caching=True).block_manager.enable_prefix_caching
        emit(default=default, hits=eng.block_manager.prefix_cache_hits, asked=asked)
    """, {"max_tokens": MAX_TOKENS})
    assert out["default"] is False
    assert out["hits"] == 0
    assert out["asked"] is True
