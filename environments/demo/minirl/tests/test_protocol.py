import numpy as np
import pytest

from minirl.protocol import DataProto


def _data(n):
    return DataProto({"a": np.arange(n), "b": np.arange(n) * 10}, {"step": 1})


def test_chunk_and_concat_round_trip():
    d = _data(6)
    parts = d.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    np.testing.assert_array_equal(DataProto.concat(parts).batch["b"], d.batch["b"])


def test_chunk_refuses_uneven_split():
    with pytest.raises(ValueError):
        _data(5).chunk(2)


def test_repeat_interleaves():
    np.testing.assert_array_equal(_data(2).repeat(2).batch["a"], [0, 0, 1, 1])
    np.testing.assert_array_equal(_data(2).repeat(2, interleave=False).batch["a"], [0, 1, 0, 1])


def test_union_refuses_conflicts():
    with pytest.raises(ValueError):
        _data(2).union(DataProto({"a": np.array([5, 6])}))
