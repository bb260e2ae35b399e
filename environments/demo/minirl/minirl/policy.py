"""A token policy: the next token's logits are ``embed[prev] @ head``.

``embed`` is frozen (as a pretrained embedding often is); ``head`` is trained.
"""

import numpy as np


def log_softmax(x):
    z = x - x.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


class Policy:
    trainable = ("head",)

    def __init__(self, vocab_size=16, dim=8, seed=0):
        rng = np.random.default_rng(seed)
        self.params = {
            "embed": rng.standard_normal((vocab_size, dim)),
            "head": rng.standard_normal((dim, vocab_size)) * 0.1,
        }

    @property
    def vocab_size(self):
        return self.params["head"].shape[1]

    def logits(self, prev):
        return self.params["embed"][prev] @ self.params["head"]

    def log_probs(self, prompts, responses):
        """log p(response[t] | token before it) for a (B,) prompt token and (B, T) responses."""
        prev = np.concatenate([prompts[:, None], responses[:, :-1]], axis=1)
        lp = log_softmax(self.logits(prev))
        return np.take_along_axis(lp, responses[..., None], axis=-1)[..., 0]

    def grad_head(self, prompts, responses, coef):
        """d/d head of sum(coef * log_probs), for coef of shape (B, T)."""
        prev = np.concatenate([prompts[:, None], responses[:, :-1]], axis=1)
        h = self.params["embed"][prev]  # (B, T, D)
        p = np.exp(log_softmax(h @ self.params["head"]))  # (B, T, V)
        onehot = np.zeros_like(p)
        np.put_along_axis(onehot, responses[..., None], 1.0, axis=-1)
        d_logits = (onehot - p) * coef[..., None]
        return np.einsum("btd,btv->dv", h, d_logits)

    def state_dict(self):
        return {k: v.copy() for k, v in self.params.items()}

    def load_state_dict(self, state):
        for k, v in state.items():
            if self.params[k].shape != v.shape:
                raise ValueError(f"{k}: shape {v.shape} != {self.params[k].shape}")
            self.params[k][...] = v
