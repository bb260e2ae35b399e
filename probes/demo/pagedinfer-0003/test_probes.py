"""Probes for pagedinfer-0003 (preemption by recompute).

The judge (this module) never imports pagedinfer: the probe runs a fresh batch that outgrows
the KV cache over the submission and, in a reference child, over gold, and compares the
scheduler's queues at the first preemption and the tokens every request ends with."""

from infradev_probe import fresh, reference, run, same

_DRIVER = """
from pagedinfer import LLMEngine, SamplingParams

eng = LLMEngine(num_blocks=ARGS["num_blocks"], block_size=ARGS["block"], max_num_seqs=8)
params = SamplingParams(temperature=0, max_tokens=ARGS["max_tokens"])
ids = [eng.add_request(p, params) for p in ARGS["prompts"]]
pos = {i: k for k, i in enumerate(ids)}
steps, finished = 0, {}
while eng.scheduler.num_preemptions == 0 and eng.has_unfinished() and steps < 200:
    for o in eng.step():
        finished[pos[o.request_id]] = [int(t) for t in o.tokens]
    steps += 1
sched = eng.scheduler
at_preemption = {"preemptions": int(sched.num_preemptions),
                 "waiting": [pos[s.seq_id] for s in sched.waiting],
                 "running": [pos[s.seq_id] for s in sched.running],
                 "waiting_outputs": [[int(t) for t in s.output] for s in sched.waiting]}
while eng.has_unfinished():
    for o in eng.step():
        finished[pos[o.request_id]] = [int(t) for t in o.tokens]
emit(at_preemption=at_preemption, tokens=[finished.get(k) for k in range(len(ids))])
"""


def test_the_latest_arrival_is_preempted_first():
    rng = fresh()
    block = int(rng.integers(2, 5))
    n = int(rng.integers(3, 6))
    # Every request but the last fills its blocks, the last has room in its own, and the cache
    # has no block to spare: the first decode step must preempt the last arrival (which needed
    # nothing) for the first, not the first itself.
    ks = [int(rng.integers(1, 3)) for _ in range(n)]
    lengths = [block * k for k in ks[:-1]] + [block * ks[-1] + int(rng.integers(1, block))]
    prompts = [[int(t) for t in rng.integers(1, 60, size=length)] for length in lengths]
    args = {"prompts": prompts, "block": block, "num_blocks": sum(-(-length // block) for length in lengths),
            "max_tokens": int(rng.integers(3, 8))}
    got, want = run(_DRIVER, args), reference(_DRIVER, args)
    assert want["at_preemption"]["preemptions"] >= 1, "the scenario must preempt"
    same(got, want)
