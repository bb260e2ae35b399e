import numpy as np

from minitron.comm import ProcessGroup, launch
from minitron.model import MLP
from minitron.optimizer import SGD, Adam
from minitron.train import train_steps


def _local():
    return ProcessGroup(0, 1, {})


def test_adam_reduces_loss():
    m = MLP(8, 16, 4, _local(), seed=0)
    losses = train_steps(m, Adam(m, lr=1e-2), 30)
    assert losses[-1] < losses[0] * 0.5


def _dp_train(group):
    m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
    train_steps(m, SGD(m, lr=0.05), 3, group=group)
    return m.fc1.params["weight"]


def test_data_parallel_matches_single_process():
    m = MLP(8, 16, 4, _local(), seed=0)
    train_steps(m, SGD(m, lr=0.05), 3)
    for w in launch(_dp_train, 2):
        np.testing.assert_allclose(w, m.fc1.params["weight"], rtol=1e-4, atol=1e-6)
