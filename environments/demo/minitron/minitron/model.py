"""A two-layer MLP built from tensor-parallel layers."""

import numpy as np

from minitron.layers import ColumnParallelLinear, RowParallelLinear


class MLP:
    def __init__(self, d_in, d_hidden, d_out, group, seed=0):
        self.fc1 = ColumnParallelLinear(d_in, d_hidden, group, seed=seed)
        self.fc2 = RowParallelLinear(d_hidden, d_out, group, seed=seed + 1)
        self.layers = {"fc1": self.fc1, "fc2": self.fc2}

    def forward(self, x):
        self._h = self.fc1.forward(x)
        self._a = np.maximum(self._h, 0)
        return self.fc2.forward(self._a)

    def backward(self, dy):
        da = self.fc2.backward(dy)
        return self.fc1.backward(da * (self._h > 0))

    def named_parameters(self):
        """Yields (name, param, grad) for every local parameter shard, in a fixed order."""
        for lname, layer in self.layers.items():
            for pname in sorted(layer.params):
                yield f"{lname}.{pname}", layer.params[pname], layer.grads[pname]

    def zero_grad(self):
        for _, _, g in self.named_parameters():
            g[...] = 0


def mse_loss(pred, target):
    diff = pred - target
    return float((diff ** 2).mean()), (2.0 / diff.size) * diff
