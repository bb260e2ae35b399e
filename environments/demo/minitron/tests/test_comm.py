import numpy as np
import pytest

from minitron.comm import launch


def _all_reduce(group):
    return group.all_reduce(np.full(3, group.rank + 1.0))


def test_all_reduce_sums_over_ranks():
    out = launch(_all_reduce, 3)
    for r in out:
        np.testing.assert_allclose(r, np.full(3, 6.0))


def _gather_and_count(group):
    parts = group.all_gather(np.array([group.rank], dtype=np.int64))
    return [int(p[0]) for p in parts], group.bytes_sent


def test_all_gather_orders_by_rank_and_counts_bytes():
    out = launch(_gather_and_count, 2)
    assert [o[0] for o in out] == [[0, 1], [0, 1]]
    assert [o[1] for o in out] == [8, 8]


def _broadcast(group):
    return group.broadcast(np.array([group.rank * 10.0]), src=1)


def test_broadcast_from_src():
    assert [float(o[0]) for o in launch(_broadcast, 2)] == [10.0, 10.0]


def _fail(group):
    if group.rank == 1:
        raise ValueError("boom")
    return 0


def test_rank_failure_is_reported():
    with pytest.raises(RuntimeError, match="rank 1 failed"):
        launch(_fail, 2)
