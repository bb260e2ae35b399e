"""Probes for minirl-0001 (GRPO advantages)."""

import numpy as np

from minirl.advantage import compute_grpo_outcome_advantage, get_adv_estimator_fn
from minirl.trainer import PPOTrainer


def test_groups_are_found_by_uid_wherever_they_sit():
    scores = np.array([1.0, 0.2, 0.0, 0.6, 0.5])
    rewards = np.zeros((5, 2))
    rewards[:, -1] = scores
    adv = compute_grpo_outcome_advantage(rewards, np.array([3, 8, 3, 8, 5]))[:, 0]
    h = 0.5 / np.sqrt(0.5)
    np.testing.assert_allclose(adv, [h, -h, -h, h, 0.5], rtol=1e-5)


def test_the_trainer_runs_grpo_by_name():
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    t = PPOTrainer(batch_size=4, n=3, adv_estimator="grpo", seed=3)
    batch = t.compute_advantage(t.rollout(0))
    adv = batch.batch["advantages"][:, 0]
    for uid in np.unique(batch.batch["uid"]):
        assert abs(adv[batch.batch["uid"] == uid].sum()) < 1e-6
    t.fit(2)
