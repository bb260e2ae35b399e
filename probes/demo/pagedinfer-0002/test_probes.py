"""Probes for pagedinfer-0002 (per-request seeds).

The judge (this module) never imports pagedinfer: each probe drives the code under test in a
child process and compares the plain data it sends back."""

from infradev_probe import run

MAX_TOKENS = 12
VOCAB = 64  # the engine's default model


def _check_tokens(tokens, what):
    assert isinstance(tokens, list) and len(tokens) == MAX_TOKENS, f"{what}: {tokens!r}"
    assert all(isinstance(t, int) and 0 <= t < VOCAB for t in tokens), f"{what}: {tokens!r}"


def test_a_seeded_request_ignores_its_batch_neighbours():
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams

        n = ARGS["max_tokens"]
        seeded = SamplingParams(temperature=1.0, max_tokens=n, seed=99)
        alone = [list(LLMEngine(seed=s).generate([[4, 2]], seeded)[0].tokens) for s in (5, 6)]
        eng = LLMEngine(seed=5)
        ids = [eng.add_request([7, 7, 7], SamplingParams(temperature=1.0, max_tokens=n)),
               eng.add_request([4, 2], seeded),
               eng.add_request([1], SamplingParams(temperature=1.0, max_tokens=n, seed=99))]
        finished = []
        while eng.has_unfinished():
            for o in eng.step():
                finished.append([o.request_id, list(o.tokens)])
        emit(alone=alone, ids=ids, finished=finished)
    """, {"max_tokens": MAX_TOKENS})
    ids = out["ids"]
    assert len(ids) == 3 and len(set(map(repr, ids))) == 3, f"request ids {ids!r}"
    done = {}
    for request_id, tokens in out["finished"]:
        assert request_id in ids and repr(request_id) not in done, f"finished {request_id!r} unexpectedly"
        done[repr(request_id)] = tokens
    assert len(done) == 3, f"only {sorted(done)} of {ids!r} finished"
    first, seeded, other = (done[repr(i)] for i in ids)
    for what, tokens in [("alone", out["alone"][0]), ("alone, engine seed 6", out["alone"][1]),
                         ("unseeded", first), ("seeded", seeded), ("seeded, other prompt", other)]:
        _check_tokens(tokens, what)
    assert out["alone"][1] == out["alone"][0], "the seeded request's tokens depend on the engine's seed"
    assert seeded == out["alone"][0], "the seeded request's tokens depend on its batch neighbours"
    assert other != first


def test_unseeded_requests_share_the_engine_generator():
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams

        params = SamplingParams(temperature=1.0, max_tokens=ARGS["max_tokens"])
        emit(default_seed=SamplingParams().seed,
             first=[list(o.tokens) for o in LLMEngine(seed=3).generate([[6, 6], [6, 6]], params)],
             again=[list(o.tokens) for o in LLMEngine(seed=3).generate([[6, 6], [6, 6]], params)])
    """, {"max_tokens": MAX_TOKENS})
    assert out["default_seed"] is None, f"SamplingParams().seed is {out['default_seed']!r}"
    assert len(out["first"]) == 2
    for tokens in out["first"] + out["again"]:
        _check_tokens(tokens, "unseeded")
    a, b = out["first"]
    assert a != b, "two unseeded requests drew the same tokens"
    assert out["again"] == [a, b], "an engine seed does not reproduce its unseeded requests"
