import pytest

from pagedinfer.block_manager import BlockManager, NoFreeBlocks
from pagedinfer.sampling import SamplingParams
from pagedinfer.sequence import Sequence


def _seq(i, n):
    return Sequence(i, list(range(1, n + 1)), SamplingParams(), arrival=i)


def test_allocate_takes_ceil_blocks_and_free_returns_them():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = _seq(0, 9)
    assert bm.can_allocate(s)
    bm.allocate(s)
    assert len(bm.block_table(s)) == 3
    assert bm.num_free_blocks == 5
    bm.free(s)
    assert bm.num_free_blocks == 8


def test_append_slot_takes_a_block_only_when_the_last_is_full():
    bm = BlockManager(num_blocks=4, block_size=2)
    s = _seq(0, 2)
    bm.allocate(s)
    bm.append_slot(s)
    assert len(bm.block_table(s)) == 2
    s.output.append(5)
    bm.append_slot(s)
    assert len(bm.block_table(s)) == 2


def test_exhausted_allocator_raises():
    bm = BlockManager(num_blocks=1, block_size=2)
    bm.allocate(_seq(0, 2))
    with pytest.raises(NoFreeBlocks):
        bm.allocator.allocate()
