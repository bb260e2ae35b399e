"""Probes for minirl-0001 (GRPO advantages).

The judge (this module) never imports minirl: each probe drives the code under test in a child
process and checks the plain data it sends back against references computed here."""

import numpy as np

from infradev_probe import fresh, reference, run, same


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
    # Groups of fresh sizes under fresh uids, their rows shuffled through the batch, and one
    # group of a single row.
    rng = fresh()
    sizes = [int(n) for n in rng.integers(2, 5, size=int(rng.integers(2, 4)))] + [1]
    uids = rng.choice(1000, size=len(sizes), replace=False)
    index = rng.permutation(np.repeat(uids, sizes))
    length = int(rng.integers(1, 4))
    rewards = np.zeros((len(index), length))
    rewards[np.arange(len(index)), rng.integers(0, length, size=len(index))] = rng.random(len(index))
    out = run("""
        from minirl.advantage import compute_grpo_outcome_advantage

        emit(adv=compute_grpo_outcome_advantage(ARGS["rewards"], ARGS["index"]))
    """, {"rewards": rewards, "index": index})
    adv = np.asarray(out["adv"], dtype=np.float64)
    assert adv.shape == rewards.shape, f"advantages of shape {adv.shape}, want {rewards.shape}"
    np.testing.assert_allclose(adv, np.repeat(_grpo_reference(rewards, index)[:, None], length, axis=1), rtol=1e-5, atol=1e-8)


_TRAINER = """
from minirl.advantage import get_adv_estimator_fn
from minirl.trainer import PPOTrainer

fn = get_adv_estimator_fn("grpo")
t = PPOTrainer(batch_size=ARGS["batch_size"], n=ARGS["n"], adv_estimator="grpo", seed=ARGS["seed"])
batch = t.compute_advantage(t.rollout(0))
emit(by_name=fn(ARGS["rewards"], ARGS["index"]), uid=batch.batch["uid"], advantages=batch.batch["advantages"],
     token_level_rewards=batch.batch["token_level_rewards"], scores=t.fit(ARGS["steps"]))
"""


def test_the_trainer_runs_grpo_by_name():
    rng = fresh()
    index = np.repeat(rng.choice(100, size=2, replace=False), 3)  # contiguous groups, as the trainer makes them
    rewards = np.zeros((6, 3))
    rewards[:, -1] = rng.random(6)
    args = {"rewards": rewards, "index": index, "seed": int(rng.integers(1 << 20)),
            "batch_size": int(rng.integers(2, 5)), "n": int(rng.integers(2, 4)), "steps": int(rng.integers(1, 3))}
    got = run(_TRAINER, args)
    np.testing.assert_allclose(np.asarray(got["by_name"], dtype=np.float64)[:, 0], _grpo_reference(rewards, index),
                               rtol=1e-6, atol=1e-9, err_msg='get_adv_estimator_fn("grpo")')
    # The trainer's rollouts, rewards, advantages and scores are gold's on the same seed.
    same(got, reference(_TRAINER, args), rtol=1e-9, atol=1e-12)
