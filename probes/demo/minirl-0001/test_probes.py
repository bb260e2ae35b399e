"""Probes for minirl-0001 (GRPO advantages).

The judge (this module) never imports minirl: each probe drives the code under test in a child
process and checks the plain data it sends back against references computed here."""

import numpy as np

from infradev_probe import run


def _grpo_reference(token_rewards, index, epsilon=1e-6):
    """GRPO outcome advantages per row: (score - group mean) / (unbiased group std + epsilon),
    groups being the rows that share a uid; a group of one has mean 0 and std 1."""
    scores = np.asarray(token_rewards, dtype=np.float64).sum(axis=-1)
    index = np.asarray(index)
    adv = np.zeros_like(scores)
    for uid in np.unique(index):
        rows = index == uid
        group = scores[rows]
        mean, std = (0.0, 1.0) if len(group) == 1 else (group.mean(), group.std(ddof=1))
        adv[rows] = (group - mean) / (std + epsilon)
    return adv


def test_groups_are_found_by_uid_wherever_they_sit():
    scores = np.array([1.0, 0.2, 0.0, 0.6, 0.5])
    rewards = np.zeros((5, 2))
    rewards[:, -1] = scores
    index = np.array([3, 8, 3, 8, 5])
    out = run("""
        from minirl.advantage import compute_grpo_outcome_advantage

        emit(adv=compute_grpo_outcome_advantage(ARGS["rewards"], ARGS["index"]))
    """, {"rewards": rewards, "index": index})
    adv = np.asarray(out["adv"], dtype=np.float64)
    assert adv.shape == (5, 2), f"advantages of shape {adv.shape}, want (5, 2)"
    h = 0.5 / np.sqrt(0.5)
    np.testing.assert_allclose(adv[:, 0], [h, -h, -h, h, 0.5], rtol=1e-5)
    np.testing.assert_allclose(adv, np.repeat(_grpo_reference(rewards, index)[:, None], 2, axis=1), rtol=1e-5)


def test_the_trainer_runs_grpo_by_name():
    rewards = np.zeros((6, 3))
    rewards[:, -1] = [0.25, 1.0, 0.0, 0.75, 0.5, 0.5]
    index = np.array([1, 1, 1, 2, 2, 2])
    out = run("""
        from minirl.advantage import get_adv_estimator_fn
        from minirl.trainer import PPOTrainer

        fn = get_adv_estimator_fn("grpo")
        by_name = fn(ARGS["rewards"], ARGS["index"])
        t = PPOTrainer(batch_size=4, n=3, adv_estimator="grpo", seed=3)
        batch = t.compute_advantage(t.rollout(0))
        emit(fn=[getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)], by_name=by_name,
             uid=batch.batch["uid"], advantages=batch.batch["advantages"],
             token_level_rewards=batch.batch["token_level_rewards"], scores=t.fit(2))
    """, {"rewards": rewards, "index": index})
    assert out["fn"] == ["minirl.advantage", "compute_grpo_outcome_advantage"], \
        f'get_adv_estimator_fn("grpo") returned {out["fn"]}'
    np.testing.assert_allclose(np.asarray(out["by_name"], dtype=np.float64)[:, 0], _grpo_reference(rewards, index),
                               rtol=1e-6, atol=1e-9)
    uid, adv = np.asarray(out["uid"]), np.asarray(out["advantages"], dtype=np.float64)
    assert adv.ndim == 2 and len(adv) == len(uid) == 12, f"advantages {adv.shape} for {len(uid)} rows"
    for u in np.unique(uid):
        assert abs(adv[uid == u, 0].sum()) < 1e-6, f"uid {u}: advantages do not sum to 0 within the group"
    np.testing.assert_allclose(adv[:, 0], _grpo_reference(out["token_level_rewards"], uid), rtol=1e-6, atol=1e-9)
    assert len(out["scores"]) == 2 and all(np.isfinite(out["scores"])), f"fit(2) returned {out['scores']}"
