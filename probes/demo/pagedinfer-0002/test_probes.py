"""Probes for pagedinfer-0002 (per-request seeds).

The judge (this module) never imports pagedinfer. Each probe runs a batch of fresh prompts,
seeds and engine seeds over the submission and, in a reference child, over gold, and compares
the tokens the instruction pins down: a seeded request's (its own generator) and an unseeded
request's (the engine's generator, as today)."""

from infradev_probe import fresh, reference, run, same

VOCAB = 64  # the engine's default model

# Requests go in one by one, each with a seed or None; the engine steps until all finish.
# Emits every request's tokens by position, and the tokens of each seeded request run alone
# on engines with other seeds.
_DRIVER = """
from pagedinfer import LLMEngine, SamplingParams

def params(seed):
    # An unseeded request leaves the seed at its default.
    extra = {} if seed is None else {"seed": seed}
    return SamplingParams(temperature=ARGS["temperature"], max_tokens=ARGS["max_tokens"], **extra)

eng = LLMEngine(seed=ARGS["engine_seed"])
ids = [eng.add_request(p, params(s)) for p, s in zip(ARGS["prompts"], ARGS["seeds"])]
done = {}
while eng.has_unfinished():
    for o in eng.step():
        done[o.request_id] = [int(t) for t in o.tokens]
batch = [done.get(i) for i in ids]
alone = [[[int(t) for t in LLMEngine(seed=e).generate([p], params(s))[0].tokens] for e in ARGS["other_engine_seeds"]]
         for p, s in zip(ARGS["prompts"], ARGS["seeds"]) if s is not None]
emit(batch=batch, alone=alone)
"""


def _scenario(rng, seeded):
    n = int(rng.integers(2, 6))
    prompts = [[int(t) for t in rng.integers(0, VOCAB, size=int(rng.integers(1, 6)))] for _ in range(n)]
    seeds = [int(rng.integers(1 << 31)) if seeded and rng.random() < 0.6 else None for _ in range(n)]
    if seeded and all(s is None for s in seeds):
        seeds[int(rng.integers(n))] = int(rng.integers(1 << 31))
    return {"prompts": prompts, "seeds": seeds, "engine_seed": int(rng.integers(1 << 31)),
            "other_engine_seeds": [int(x) for x in rng.integers(1 << 31, size=2)] if seeded else [],
            "temperature": float(rng.uniform(0.7, 2.0)), "max_tokens": int(rng.integers(6, 14))}


def test_a_seeded_request_ignores_its_batch_neighbours():
    rng = fresh()
    args = _scenario(rng, seeded=True)
    got, want = run(_DRIVER, args), reference(_DRIVER, args)
    seeded = [i for i, s in enumerate(args["seeds"]) if s is not None]
    assert len(got["batch"]) == len(args["prompts"]), "not every request finished"
    # A seeded request: the same tokens as gold's, in the batch and alone on other engines.
    same([got["batch"][i] for i in seeded], [want["batch"][i] for i in seeded])
    same(got["alone"], want["alone"])


def test_unseeded_requests_share_the_engine_generator():
    rng = fresh()
    args = _scenario(rng, seeded=False)
    got, want = run(_DRIVER + "\nemit(default_seed=SamplingParams().seed)", args), \
        reference(_DRIVER + "\nemit(default_seed=SamplingParams().seed)", args)
    same(got, want)
