"""Probes for pagedinfer-0003 (preemption by recompute).

The judge (this module) never imports pagedinfer: each probe drives the code under test in a
child process and checks the plain data it sends back."""

from infradev_probe import run


def test_the_latest_arrival_is_preempted_first():
    out = run("""
        from pagedinfer import LLMEngine, SamplingParams

        eng = LLMEngine(num_blocks=6, block_size=4, max_num_seqs=8)
        ids = [eng.add_request([i + 1] * 7, SamplingParams(temperature=0, max_tokens=6)) for i in range(3)]
        steps = 0
        while eng.scheduler.num_preemptions == 0 and steps < 50:
            eng.step()
            steps += 1
        sched = eng.scheduler
        emit(ids=[int(i) for i in ids], steps=steps, preemptions=int(sched.num_preemptions),
             waiting=[int(s.seq_id) for s in sched.waiting], running=[int(s.seq_id) for s in sched.running],
             waiting_outputs=[[int(t) for t in s.output] for s in sched.waiting])
    """)
    ids = out["ids"]
    assert len(ids) == 3 and len(set(ids)) == 3, f"request ids {ids}"
    assert out["preemptions"] == 1, f"{out['preemptions']} preemptions after {out['steps']} steps"
    assert out["waiting"] == [ids[2]], f"waiting {out['waiting']}, want the latest arrival {ids[2]}"
    assert out["running"] == ids[:2], f"running {out['running']}, want {ids[:2]} in arrival order"
    assert out["waiting_outputs"][0], "a preempted sequence keeps its generated tokens"
