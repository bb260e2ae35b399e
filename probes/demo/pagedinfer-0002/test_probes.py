"""Probes for pagedinfer-0002 (per-request seeds)."""

from pagedinfer import LLMEngine, SamplingParams


def test_a_seeded_request_ignores_its_batch_neighbours():
    seeded = SamplingParams(temperature=1.0, max_tokens=12, seed=99)
    alone = LLMEngine(seed=5).generate([[4, 2]], seeded)[0].tokens
    eng = LLMEngine(seed=5)
    ids = [eng.add_request([7, 7, 7], SamplingParams(temperature=1.0, max_tokens=12)),
           eng.add_request([4, 2], seeded),
           eng.add_request([1], SamplingParams(temperature=1.0, max_tokens=12, seed=99))]
    done = {}
    while eng.has_unfinished():
        for out in eng.step():
            done[out.request_id] = out.tokens
    assert done[ids[1]] == alone
    assert done[ids[2]] != done[ids[0]]


def test_unseeded_requests_share_the_engine_generator():
    assert SamplingParams().seed is None
    params = SamplingParams(temperature=1.0, max_tokens=12)
    a, b = LLMEngine(seed=3).generate([[6, 6], [6, 6]], params)
    assert a.tokens != b.tokens
    assert [o.tokens for o in LLMEngine(seed=3).generate([[6, 6], [6, 6]], params)] == [a.tokens, b.tokens]
