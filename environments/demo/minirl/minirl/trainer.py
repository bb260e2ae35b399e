"""The PPO trainer: rollout, reward, advantage, actor update, weight sync, step after step."""

import numpy as np

from minirl.actor import Actor
from minirl.advantage import get_adv_estimator_fn
from minirl.policy import Policy
from minirl.protocol import DataProto
from minirl.reward import token_level_rewards
from minirl.rollout import RolloutWorker
from minirl.transport import Transport


class PPOTrainer:
    def __init__(self, batch_size=8, n=4, response_length=4, adv_estimator="reinforce",
                 num_rollout_workers=1, seed=0):
        self.batch_size = batch_size
        self.n = n
        self.response_length = response_length
        self.adv_fn = get_adv_estimator_fn(adv_estimator)
        self.adv_estimator = adv_estimator
        self.seed = seed
        self.transport = Transport()
        self.actor = Actor(Policy(seed=seed))
        # Rollout workers start from their own initialisation, as an inference engine that loads
        # dummy weights does; the first sync gives them the actor's.
        self.workers = [RolloutWorker(self.transport, seed=seed + 1 + i) for i in range(num_rollout_workers)]
        self._sync()

    def _sync(self):
        self.actor.push_weights(self.transport)
        messages = self.transport.receive_all()
        for w in self.workers:
            for m in messages:
                w.policy.load_state_dict(m)

    def rollout(self, step):
        rng = np.random.default_rng(self.seed + step)
        prompts = DataProto({"prompts": rng.integers(0, 16, self.batch_size),
                             "uid": np.arange(self.batch_size)})
        batch = prompts.repeat(self.n, interleave=True)
        parts = batch.chunk(len(self.workers))
        outs = [w.generate_sequences(part, self.response_length, seed=self.seed * 1000 + step * 10 + i)
                for i, (w, part) in enumerate(zip(self.workers, parts))]
        return DataProto.concat(outs)

    def compute_advantage(self, batch):
        rewards = token_level_rewards(batch)
        batch.batch["token_level_rewards"] = rewards
        batch.batch["advantages"] = self.adv_fn(rewards)
        return batch

    def fit(self, steps):
        """Runs `steps` PPO steps; returns the mean score of each step's rollouts."""
        scores = []
        for step in range(steps):
            batch = self.compute_advantage(self.rollout(step))
            scores.append(float(batch.batch["token_level_rewards"].sum(axis=-1).mean()))
            self.actor.update_policy(batch)
            self._sync()
        return scores
