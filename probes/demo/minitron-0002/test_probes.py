"""Hidden probes for minitron-0002 (bucketed gradient all-reduce)."""

import numpy as np

from minitron.comm import ProcessGroup, launch
from minitron.model import MLP
from minitron.optimizer import SGD
from minitron.train import allreduce_gradients, train_steps

GRAD_BYTES = (8 * 16 + 16 + 16 * 4 + 4) * 4  # MLP(8, 16, 4) in float32


def _model():
    m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
    for _, _, g in m.named_parameters():
        g[...] = 1.0
    return m


def _traffic(group, bucket):
    allreduce_gradients(_model(), group, bucket_size_bytes=bucket)
    return group.messages_sent, group.bytes_sent


def test_one_bucket_is_one_message_of_the_gradients_bytes():
    # Two ranks: each all-reduce sends one message to the one peer.
    assert launch(_traffic, 2, 1 << 20) == [(1, GRAD_BYTES)] * 2


def test_without_buckets_and_with_tiny_buckets_each_gradient_goes_alone():
    assert launch(_traffic, 2, None) == [(4, GRAD_BYTES)] * 2
    assert launch(_traffic, 2, 8) == [(4, GRAD_BYTES)] * 2


def _train(group, bucket):
    m = MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0)
    train_steps(m, SGD(m, lr=0.05), 2, group=group, bucket_size_bytes=bucket)
    return group.messages_sent


def test_train_steps_uses_the_buckets():
    assert launch(_train, 2, 1 << 20) == [2, 2]  # one all-reduce per step
