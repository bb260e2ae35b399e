"""Budget probe for minirl-0004: run alone, so the harness's cgroup peak is this test's.

The judge (this module) never imports minirl: the code under test runs in a child process
(whose memory counts) and sends back plain data."""

from infradev_probe import run


def test_micro_batched_update_with_a_large_vocabulary():
    vocab = 20000
    out = run("""
        import numpy as np
        from minirl.actor import Actor
        from minirl.policy import Policy
        from minirl.protocol import DataProto

        rng = np.random.default_rng(0)
        vocab, b, t = ARGS["vocab"], 64, 8
        batch = DataProto({"prompts": rng.integers(0, vocab, b), "responses": rng.integers(0, vocab, (b, t)),
                           "advantages": rng.standard_normal((b, t)), "old_log_probs": -rng.random((b, t)) * 10})
        actor = Actor(Policy(vocab_size=vocab, dim=8, seed=0))
        before = actor.policy.params["head"].copy()
        actor.update_policy(batch, micro_batch_size=4)
        emit(before=before, after=actor.policy.params["head"])
    """, {"vocab": vocab})
    # Imported only now, after the child is gone, so that the judge adds nothing to its peak.
    import numpy as np

    after = np.asarray(out["after"])
    assert after.shape == np.asarray(out["before"]).shape == (8, vocab), f"head of shape {after.shape}"
    assert np.isfinite(after).all(), "the update left non-finite weights"
    assert not np.array_equal(after, out["before"]), "the update did not change the head"
