import numpy as np

from minirl.advantage import compute_gae_advantage, compute_reinforce_advantage
from minirl.trainer import PPOTrainer


def test_ppo_raises_the_score():
    scores = PPOTrainer(batch_size=16, n=4, seed=1).fit(25)
    assert np.mean(scores[-5:]) > np.mean(scores[:5]) + 0.1


def test_rollout_weights_follow_the_actor():
    t = PPOTrainer(seed=2)
    t.fit(2)
    for k, v in t.actor.policy.params.items():
        np.testing.assert_array_equal(t.workers[0].policy.params[k], v)


def test_reinforce_advantage_is_centred():
    r = np.array([[0, 1.0], [0, 0.0], [0, 0.5]])
    adv = compute_reinforce_advantage(r)
    np.testing.assert_allclose(adv[:, 0], [0.5, -0.5, 0.0])


def test_gae_with_zero_values_is_the_return():
    r = np.array([[0.0, 0.0, 1.0]])
    np.testing.assert_allclose(compute_gae_advantage(r, np.zeros((1, 3))), [[1.0, 1.0, 1.0]])
