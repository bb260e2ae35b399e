"""Optimizers that update a model's parameter shards in place."""

import numpy as np


class SGD:
    def __init__(self, model, lr=0.01):
        self.model = model
        self.lr = lr

    def step(self):
        for _, p, g in self.model.named_parameters():
            p -= self.lr * g


class Adam:
    """Adam with bias correction. State: the step count and two moments per parameter."""

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.model = model
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.step_count = 0
        self.exp_avg = {n: np.zeros_like(p) for n, p, _ in model.named_parameters()}
        self.exp_avg_sq = {n: np.zeros_like(p) for n, p, _ in model.named_parameters()}

    def step(self):
        self.step_count += 1
        b1, b2 = self.betas
        c1 = 1 - b1 ** self.step_count
        c2 = 1 - b2 ** self.step_count
        for name, p, g in self.model.named_parameters():
            m, v = self.exp_avg[name], self.exp_avg_sq[name]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            p -= self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)
