"""Probes for pagedinfer-0003 (preemption by recompute)."""

from pagedinfer import LLMEngine, SamplingParams


def test_the_latest_arrival_is_preempted_first():
    eng = LLMEngine(num_blocks=6, block_size=4, max_num_seqs=8)
    ids = [eng.add_request([i + 1] * 7, SamplingParams(temperature=0, max_tokens=6)) for i in range(3)]
    while eng.scheduler.num_preemptions == 0:
        eng.step()
    assert eng.scheduler.num_preemptions == 1
    assert [s.seq_id for s in eng.scheduler.waiting] == [ids[2]]
    assert [s.seq_id for s in eng.scheduler.running] == ids[:2]
    assert eng.scheduler.waiting[0].output, "a preempted sequence keeps its generated tokens"
