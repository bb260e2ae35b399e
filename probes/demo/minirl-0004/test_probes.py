"""Probes for minirl-0004 (micro-batched PPO updates)."""

import numpy as np

from minirl.actor import Actor
from minirl.policy import Policy
from minirl.protocol import DataProto


def test_an_uneven_last_micro_batch_still_gives_the_full_step():
    rng = np.random.default_rng(4)
    batch = DataProto({"prompts": rng.integers(0, 16, 5), "responses": rng.integers(0, 16, (5, 3)),
                       "advantages": rng.standard_normal((5, 3)), "old_log_probs": -rng.random((5, 3))})
    full, micro = Actor(Policy(seed=2)), Actor(Policy(seed=2))
    full.update_policy(batch)
    micro.update_policy(batch, micro_batch_size=2)
    np.testing.assert_allclose(micro.policy.params["head"], full.policy.params["head"], rtol=1e-10, atol=1e-12)
