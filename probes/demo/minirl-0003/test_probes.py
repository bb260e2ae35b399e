"""Probes for minirl-0003 (padding batches to a divisor)."""

import numpy as np

from minirl.protocol import DataProto, pad_dataproto_to_divisor
from minirl.trainer import PPOTrainer


def test_padding_leaves_the_input_alone():
    d = DataProto({"a": np.arange(5)})
    padded, pad = pad_dataproto_to_divisor(d, 2)
    assert len(padded) == 6 and pad == 1
    assert len(d) == 5
    np.testing.assert_array_equal(d.batch["a"], np.arange(5))


def test_rollout_returns_exactly_the_requested_rows():
    t = PPOTrainer(batch_size=5, n=1, num_rollout_workers=2, seed=8)
    batch = t.rollout(0)
    assert len(batch) == 5
    np.testing.assert_array_equal(batch.batch["uid"], np.arange(5))
