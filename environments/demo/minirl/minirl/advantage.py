"""Advantage estimators. Each maps a batch's token-level rewards to token-level advantages."""

import numpy as np


def compute_reinforce_advantage(token_rewards, response_mask=None):
    """Outcome reward minus the batch mean, broadcast to every response token."""
    scores = token_rewards.sum(axis=-1)
    adv = scores - scores.mean()
    return np.repeat(adv[:, None], token_rewards.shape[1], axis=1)


def compute_gae_advantage(token_rewards, values, gamma=1.0, lam=1.0):
    """Generalised advantage estimation over the response tokens."""
    b, t = token_rewards.shape
    adv = np.zeros((b, t))
    last = np.zeros(b)
    for i in reversed(range(t)):
        nxt = values[:, i + 1] if i + 1 < t else np.zeros(b)
        delta = token_rewards[:, i] + gamma * nxt - values[:, i]
        last = delta + gamma * lam * last
        adv[:, i] = last
    return adv


ADV_ESTIMATORS = {"reinforce": compute_reinforce_advantage}


def get_adv_estimator_fn(name):
    try:
        return ADV_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; have {sorted(ADV_ESTIMATORS)}") from None
