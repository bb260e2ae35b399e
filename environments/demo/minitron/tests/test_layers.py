import numpy as np

from minitron.comm import ProcessGroup, launch
from minitron.model import MLP


def _forward(group, x):
    return MLP(8, 16, 4, group, seed=3).forward(x)


def test_tensor_parallel_forward_matches_single_rank():
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    single = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=3).forward(x)
    for out in launch(_forward, 2, x):
        np.testing.assert_allclose(out, single, rtol=1e-5, atol=1e-6)


def _grads(group, x):
    m = MLP(8, 16, 4, group, seed=3)
    m.backward(np.ones_like(m.forward(x)))
    return m.fc2.grads["bias"]


def test_tensor_parallel_backward_matches_single_rank():
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=3)
    m.backward(np.ones_like(m.forward(x)))
    for g in launch(_grads, 2, x):
        np.testing.assert_allclose(g, m.fc2.grads["bias"], rtol=1e-5)
