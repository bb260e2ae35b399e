"""A rollout worker: its own copy of the policy, kept in sync from the actor over a transport."""

import numpy as np

from minirl.policy import Policy, log_softmax
from minirl.protocol import DataProto


class RolloutWorker:
    def __init__(self, transport, vocab_size=16, dim=8, seed=0):
        self.transport = transport
        self.policy = Policy(vocab_size, dim, seed=seed)

    def sync_weights(self):
        """Applies every weight message the actor sent since the last sync."""
        for message in self.transport.receive_all():
            self.policy.load_state_dict(message)

    def generate_sequences(self, prompts, response_length=4, seed=0):
        """Samples a response for each prompt row; returns prompts + responses + old log-probs."""
        rng = np.random.default_rng(seed)
        p = prompts.batch["prompts"]
        tokens = np.zeros((len(p), response_length), np.int64)
        prev = p
        for t in range(response_length):
            probs = np.exp(log_softmax(self.policy.logits(prev)))
            prev = np.array([rng.choice(len(row), p=row) for row in probs])
            tokens[:, t] = prev
        out = DataProto({"responses": tokens}, prompts.meta_info)
        out = prompts.union(out)
        out.batch["old_log_probs"] = self.policy.log_probs(p, tokens)
        return out
