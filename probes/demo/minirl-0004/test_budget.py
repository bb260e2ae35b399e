"""Budget probe for minirl-0004: run alone, so the harness's cgroup peak is this test's."""

import numpy as np

from minirl.actor import Actor
from minirl.policy import Policy
from minirl.protocol import DataProto


def test_micro_batched_update_with_a_large_vocabulary():
    rng = np.random.default_rng(0)
    vocab, b, t = 20000, 64, 8
    batch = DataProto({"prompts": rng.integers(0, vocab, b), "responses": rng.integers(0, vocab, (b, t)),
                       "advantages": rng.standard_normal((b, t)), "old_log_probs": -rng.random((b, t)) * 10})
    actor = Actor(Policy(vocab_size=vocab, dim=8, seed=0))
    actor.update_policy(batch, micro_batch_size=4)
    assert np.isfinite(actor.policy.params["head"]).all()
