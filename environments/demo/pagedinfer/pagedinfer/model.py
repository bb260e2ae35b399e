"""A toy recurrent language model whose per-token keys live in a paged KV cache.

The key of token i depends on token i and on the key before it, so, as with attention keys,
a cached block is only valid after the exact prefix that produced it.
"""

import numpy as np


class ToyModel:
    def __init__(self, vocab_size=64, dim=16, seed=0):
        rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size
        self.dim = dim
        self.embed = rng.standard_normal((vocab_size, dim)).astype(np.float32)
        self.head = (rng.standard_normal((dim, vocab_size)) / np.sqrt(dim)).astype(np.float32)

    def key(self, token, prev_key):
        return np.tanh(self.embed[token] + 0.9 * prev_key)

    def logits(self, last_key):
        return (last_key @ self.head).astype(np.float64) * 4.0


class KVCache:
    """Keys stored block by block: ``keys[block, offset]``."""

    def __init__(self, num_blocks, block_size, dim):
        self.block_size = block_size
        self.keys = np.zeros((num_blocks, block_size, dim), np.float32)

    def write(self, table, pos, key):
        self.keys[table[pos // self.block_size], pos % self.block_size] = key

    def read(self, table, pos):
        return self.keys[table[pos // self.block_size], pos % self.block_size]
