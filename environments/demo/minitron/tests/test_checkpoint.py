import numpy as np
import pytest

from minitron.checkpoint import load_checkpoint, save_checkpoint
from minitron.comm import ProcessGroup
from minitron.model import MLP


def _local():
    return ProcessGroup(0, 1, {})


def test_save_load_roundtrip(tmp_path):
    a = MLP(8, 16, 4, _local(), seed=0)
    b = MLP(8, 16, 4, _local(), seed=5)
    save_checkpoint(str(tmp_path), a)
    load_checkpoint(str(tmp_path), b)
    for (n, pa, _), (_, pb, _) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(pa, pb, err_msg=n)


def test_load_rejects_wrong_shape(tmp_path):
    save_checkpoint(str(tmp_path), MLP(8, 16, 4, _local()))
    with pytest.raises(ValueError, match="shape"):
        load_checkpoint(str(tmp_path), MLP(8, 32, 4, _local()))
