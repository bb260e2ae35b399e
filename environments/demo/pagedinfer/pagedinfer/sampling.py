"""Sampling parameters and the sampler that turns logits into a token."""

import numpy as np


class SamplingParams:
    def __init__(self, temperature=1.0, top_k=0, max_tokens=16, stop_token_ids=()):
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if top_k < 0:
            raise ValueError("top_k must be >= 0 (0 keeps every token)")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        self.temperature = temperature
        self.top_k = top_k
        self.max_tokens = max_tokens
        self.stop_token_ids = tuple(stop_token_ids)


def log_softmax(logits):
    z = logits - logits.max()
    return z - np.log(np.exp(z).sum())


def sample(logits, params, rng):
    """Returns one token id: greedy at temperature 0, else from the (top-k) softmax."""
    logits = np.asarray(logits, dtype=np.float64)
    if params.temperature == 0:
        return int(np.argmax(logits))
    scaled = logits / params.temperature
    if params.top_k and params.top_k < scaled.size:
        cut = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= cut, scaled, -np.inf)
    probs = np.exp(log_softmax(scaled))
    return int(rng.choice(scaled.size, p=probs / probs.sum()))
