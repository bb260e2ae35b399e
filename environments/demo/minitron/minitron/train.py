"""Data-parallel training: every rank computes gradients on its slice, then averages them."""

import numpy as np

from minitron.model import mse_loss


def make_batch(seed, n=32, d_in=8, d_out=4):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d_in)).astype(np.float32)
    w = np.linspace(-1, 1, d_in * d_out, dtype=np.float32).reshape(d_in, d_out)
    return x, x @ w


def allreduce_gradients(model, group):
    """Averages every gradient across the data-parallel group."""
    for _, _, g in model.named_parameters():
        g[...] = group.all_reduce(g, op="mean")


def train_steps(model, optimizer, steps, group=None, seed=0):
    """Runs ``steps`` optimizer steps; returns the losses. With ``group``, data parallel."""
    losses = []
    for step in range(steps):
        x, y = make_batch(seed + step)
        if group is not None and group.world_size > 1:
            per = x.shape[0] // group.world_size
            x = x[group.rank * per:(group.rank + 1) * per]
            y = y[group.rank * per:(group.rank + 1) * per]
        model.zero_grad()
        loss, dy = mse_loss(model.forward(x), y)
        model.backward(dy)
        if group is not None and group.world_size > 1:
            allreduce_gradients(model, group)
        optimizer.step()
        losses.append(loss)
    return losses
