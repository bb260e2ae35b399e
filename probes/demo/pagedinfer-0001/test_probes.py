"""Probes for pagedinfer-0001 (prefix caching).

The judge (this module) never imports pagedinfer. The engine runs in a child over a model whose
weights only the judge holds: every key the engine computes is an oracle call to the judge,
which hands back an opaque handle (the key's vector never leaves the judge), and every token is
sampled from logits the judge computes for a handle. So the child cannot produce a right token
without asking, and the number of keys it asks for is the judge's own count of the work it
did: what prefix caching saves is measured here, not reported by the code under test. Prompts
and weights are drawn fresh for every attempt."""

import numpy as np

from infradev_probe import fresh, reference, run, same

VOCAB, DIM, BLOCK, MAX_TOKENS = 64, 16, 4, 5


class Model:
    """The judge's side of the model: secret weights, a table of keys behind handles."""

    def __init__(self, rng):
        self.embed = rng.standard_normal((VOCAB, DIM))
        self.head = rng.standard_normal((DIM, VOCAB)) / np.sqrt(DIM)
        self.keys = [np.zeros(DIM)]  # handle 0: the state before the first token
        self.computed = 0

    def __call__(self, op, *args):
        if op == "key":
            token, handle = int(args[0]), int(args[1])
            if not (0 <= token < VOCAB and 0 <= handle < len(self.keys)):
                raise ValueError("no such token or key")
            self.computed += 1
            self.keys.append(np.tanh(self.embed[token] + 0.9 * self.keys[handle]))
            return len(self.keys) - 1
        if op == "logits":
            handle = int(args[0])
            if not 0 < handle < len(self.keys):
                raise ValueError("no such key")
            return self.keys[handle] @ self.head * 4.0
        raise ValueError("unknown operation")

    def greedy(self, prompt):
        """The tokens the engine must produce without caching, computed here."""
        key, out = np.zeros(DIM), []
        for t in prompt:
            key = np.tanh(self.embed[t] + 0.9 * key)
        while len(out) < MAX_TOKENS:
            token = int(np.argmax(key @ self.head * 4.0))
            out.append(token)
            key = np.tanh(self.embed[token] + 0.9 * key)
        return out


# The engine over the judge's model; each prompt is its own generate() call (so earlier
# requests have finished), first with prefix caching as asked, then the same prompts on a fresh
# engine without it. Emits the tokens and, per prompt, how many blocks the block manager says
# it reused (a further check: the oracle's count is the measure).
_DRIVER = """
import numpy as np
from pagedinfer import LLMEngine, SamplingParams

class JudgeModel:
    vocab_size, dim = ARGS["vocab"], 2

    def key(self, token, prev_key):
        return np.array([ORACLE("key", int(token), int(prev_key[0])), 0], np.float32)

    def logits(self, last_key):
        return np.asarray(ORACLE("logits", int(last_key[0])), np.float64)

greedy = SamplingParams(temperature=0, max_tokens=ARGS["max_tokens"])
kwargs = {} if ARGS["caching"] is None else {"enable_prefix_caching": ARGS["caching"]}
eng = LLMEngine(model=JudgeModel(), num_blocks=64, block_size=ARGS["block"], **kwargs)
tokens, hits = [], []
for prompt in ARGS["prompts"]:
    tokens.append([int(t) for t in eng.generate([prompt], greedy)[0].tokens])
    hits.append(int(eng.block_manager.prefix_cache_hits) if ARGS["caching"] else 0)
emit(tokens=tokens, hits=hits)
"""


def _blocks(rng, n):
    return [int(t) for t in rng.integers(0, VOCAB, size=n * BLOCK)]


def _engine(rng, prompts, caching):
    """Runs the driver over the submission and over gold, each against its own copy of the
    judge's model; returns (submission's values, its key count, gold's values, gold's count)."""
    seed = int(rng.integers(1 << 62))
    args = {"prompts": prompts, "caching": caching, "vocab": VOCAB, "block": BLOCK, "max_tokens": MAX_TOKENS}
    mine, gold = Model(np.random.default_rng(seed)), Model(np.random.default_rng(seed))
    got = run(_DRIVER, args, oracle=mine)
    want = reference(_DRIVER, args, oracle=gold)
    for i, prompt in enumerate(prompts):
        assert got["tokens"][i] == mine.greedy(prompt), f"prompt {i}: the tokens differ from greedy decoding without caching"
    return got, mine.computed, want, gold.computed


def test_a_block_is_only_reused_after_the_same_prefix():
    # b starts with the tokens of a's second block: the same tokens after a different prefix
    # (none), so their keys differ, and only the whole prefix identifies a block.
    rng = fresh()
    first, second = _blocks(rng, 1), _blocks(rng, 1)
    while second == first:
        second = _blocks(rng, 1)
    tail = lambda: [int(t) for t in rng.integers(0, VOCAB, size=int(rng.integers(1, BLOCK)))]
    a = first + second + _blocks(rng, int(rng.integers(0, 2))) + tail()
    b = second + _blocks(rng, int(rng.integers(0, 2))) + tail()
    got, computed, want, gold_computed = _engine(rng, [a, b], True)
    same(got, want)
    assert computed == gold_computed, f"the engine computed {computed} keys, gold {gold_computed}"


def test_blocks_of_a_finished_request_stay_cached():
    rng = fresh()
    prompt = _blocks(rng, int(rng.integers(1, 4))) + [int(t) for t in rng.integers(0, VOCAB, size=int(rng.integers(0, BLOCK)))]
    repeats = int(rng.integers(2, 4))
    got, computed, want, gold_computed = _engine(rng, [prompt] * repeats, True)
    same(got, want)
    assert computed == gold_computed, f"the engine computed {computed} keys, gold {gold_computed}"
    # Without any reuse, every request computes its whole prompt and output again.
    assert computed < repeats * (len(prompt) + MAX_TOKENS - 1), "no key was reused"


def test_prefix_caching_is_off_unless_asked_for():
    rng = fresh()
    prompt = _blocks(rng, int(rng.integers(1, 4))) + [int(t) for t in rng.integers(0, VOCAB, size=int(rng.integers(1, BLOCK)))]
    repeats = int(rng.integers(2, 4))
    for caching in (None, False):
        got, computed, want, gold_computed = _engine(rng, [prompt] * repeats, caching)
        same(got, want)
        assert computed == gold_computed == repeats * (len(prompt) + MAX_TOKENS - 1), (
            f"enable_prefix_caching={caching}: the engine computed {computed} keys; without caching "
            f"every request computes {len(prompt) + MAX_TOKENS - 1}")
