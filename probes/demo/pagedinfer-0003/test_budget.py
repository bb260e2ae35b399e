"""Budget probe for pagedinfer-0003: run alone, so the harness's wall time is this test's.

The judge (this module) never imports pagedinfer: the code under test runs in a child process
(whose time counts) and sends back plain data."""

from infradev_probe import run


def test_preempting_a_large_batch_is_linear():
    # Every running sequence fills its only block at once: the first decode step preempts half
    # of a large batch.
    n = 40000
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams

        n = ARGS["n"]
        eng = LLMEngine(num_blocks=n, block_size=2, max_num_seqs=n)
        outs = eng.generate([[i % 60, 1] for i in range(n)], SamplingParams(temperature=0, max_tokens=2))
        emit(lengths=[len(o.tokens) for o in outs], preemptions=int(eng.scheduler.num_preemptions))
    """, {"n": n})
    assert len(out["lengths"]) == n, f"{len(out['lengths'])} outputs for {n} prompts"
    assert set(out["lengths"]) == {2}, f"token counts {sorted(set(out['lengths']))}, want 2 each"
    assert out["preemptions"] >= n // 2, f"{out['preemptions']} preemptions, want at least {n // 2}"
