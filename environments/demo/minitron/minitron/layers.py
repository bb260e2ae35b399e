"""Tensor-parallel linear layers.

``ColumnParallelLinear`` splits the output features across the tensor-parallel ranks;
``RowParallelLinear`` splits the input features and all-reduces the partial products.
Each layer keeps its parameters and gradients in ``params`` / ``grads`` dicts keyed by name.
"""

import numpy as np


def _init(rng, fan_in, shape):
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


class ColumnParallelLinear:
    def __init__(self, in_features, out_features, group, seed=0, gather_output=True):
        if out_features % group.world_size:
            raise ValueError("out_features must divide evenly across tensor-parallel ranks")
        self.group = group
        self.gather_output = gather_output
        shard = out_features // group.world_size
        full = _init(np.random.default_rng(seed), in_features, (in_features, out_features))
        lo = group.rank * shard
        self.params = {"weight": full[:, lo:lo + shard].copy(), "bias": np.zeros(shard, np.float32)}
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}

    def forward(self, x):
        self._x = x
        y = x @ self.params["weight"] + self.params["bias"]
        if self.gather_output and self.group.world_size > 1:
            y = np.concatenate(self.group.all_gather(y), axis=-1)
        return y

    def backward(self, dy):
        if self.gather_output and self.group.world_size > 1:
            shard = self.params["bias"].shape[0]
            dy = dy[..., self.group.rank * shard:(self.group.rank + 1) * shard]
        self.grads["weight"] += self._x.T @ dy
        self.grads["bias"] += dy.sum(axis=0)
        dx = dy @ self.params["weight"].T
        if self.group.world_size > 1:
            dx = self.group.all_reduce(dx)
        return dx


class RowParallelLinear:
    def __init__(self, in_features, out_features, group, seed=0):
        if in_features % group.world_size:
            raise ValueError("in_features must divide evenly across tensor-parallel ranks")
        self.group = group
        shard = in_features // group.world_size
        full = _init(np.random.default_rng(seed), in_features, (in_features, out_features))
        lo = group.rank * shard
        self.params = {"weight": full[lo:lo + shard, :].copy(), "bias": np.zeros(out_features, np.float32)}
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}

    def forward(self, x):
        shard = self.params["weight"].shape[0]
        x = x[..., self.group.rank * shard:(self.group.rank + 1) * shard]
        self._x = x
        y = x @ self.params["weight"]
        if self.group.world_size > 1:
            y = self.group.all_reduce(y)
        return y + self.params["bias"]

    def backward(self, dy):
        self.grads["weight"] += self._x.T @ dy
        self.grads["bias"] += dy.sum(axis=0)
        dx_shard = dy @ self.params["weight"].T
        if self.group.world_size > 1:
            return np.concatenate(self.group.all_gather(dx_shard), axis=-1)
        return dx_shard
