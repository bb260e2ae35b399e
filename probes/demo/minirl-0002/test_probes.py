"""Probes for minirl-0002 (trainable-only weight sync)."""

import numpy as np

from minirl.trainer import PPOTrainer


def test_a_training_step_syncs_only_trainable_bytes():
    t = PPOTrainer(batch_size=4, n=2, seed=5)
    policy = t.actor.policy
    full = sum(v.nbytes for v in policy.params.values())
    trainable = sum(policy.params[k].nbytes for k in policy.trainable)
    assert t.transport.bytes_sent == full, "the first sync sends every weight"
    t.fit(3)
    assert t.transport.bytes_sent == full + 3 * trainable
    assert t.transport.messages_sent == 4


def test_every_rollout_worker_follows_the_actor():
    t = PPOTrainer(batch_size=4, n=2, num_rollout_workers=2, seed=6)
    t.fit(2)
    for w in t.workers:
        for k, v in t.actor.policy.params.items():
            np.testing.assert_array_equal(w.policy.params[k], v)
