"""Budget probe for pagedinfer-0003: run alone, so the harness's wall time is this test's."""

from pagedinfer import LLMEngine, SamplingParams


def test_preempting_a_large_batch_is_linear():
    # Every running sequence fills its only block at once: the first decode step preempts half
    # of a 6000-sequence batch.
    n = 20000
    eng = LLMEngine(num_blocks=n, block_size=2, max_num_seqs=n)
    outs = eng.generate([[i % 60, 1] for i in range(n)], SamplingParams(temperature=0, max_tokens=2))
    assert len(outs) == n and eng.scheduler.num_preemptions >= n // 2
