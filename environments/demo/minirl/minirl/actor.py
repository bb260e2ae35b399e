"""The actor: the trained policy, a clipped-PPO update, and weight pushes to the rollout."""

import numpy as np

from minirl.policy import Policy


class Actor:
    def __init__(self, policy=None, lr=5.0, clip_ratio=0.2):
        self.policy = policy or Policy()
        self.lr = lr
        self.clip_ratio = clip_ratio

    def update_policy(self, data):
        """One gradient-ascent step on the clipped PPO objective, averaged over every token."""
        p, r = data.batch["prompts"], data.batch["responses"]
        adv, old = data.batch["advantages"], data.batch["old_log_probs"]
        ratio = np.exp(self.policy.log_probs(p, r) - old)
        lo, hi = 1 - self.clip_ratio, 1 + self.clip_ratio
        # The clipped branch has no gradient where it is the minimum.
        active = np.where(adv >= 0, ratio <= hi, ratio >= lo)
        coef = ratio * adv * active / adv.size
        grad = self.policy.grad_head(p, r, coef)
        self.policy.params["head"] += self.lr * grad
        return float((np.minimum(ratio * adv, np.clip(ratio, lo, hi) * adv)).mean())

    def push_weights(self, transport):
        """Sends the policy's weights to the rollout workers."""
        transport.send(self.policy.state_dict())
