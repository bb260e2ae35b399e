"""The paged KV cache's bookkeeping: fixed-size blocks, a free list, one block table per sequence.

A sequence of n tokens holds ceil(n / block_size) blocks; its block table lists them in order.
Blocks are reference counted so that more than one sequence may point at the same block.
"""

from collections import deque


class NoFreeBlocks(RuntimeError):
    pass


class BlockAllocator:
    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self._free = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    def allocate(self):
        if not self._free:
            raise NoFreeBlocks("the KV cache has no free block")
        block = self._free.popleft()
        self.ref_counts[block] = 1
        return block

    def free(self, block):
        if self.ref_counts[block] <= 0:
            raise ValueError(f"block {block} freed twice")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free.append(block)

    @property
    def num_free(self):
        return len(self._free)


class BlockManager:
    def __init__(self, num_blocks, block_size):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self.tables = {}  # seq_id -> [block ids]

    def blocks_for(self, num_tokens):
        return -(-num_tokens // self.block_size)

    @property
    def num_free_blocks(self):
        return self.allocator.num_free

    def can_allocate(self, seq):
        return self.blocks_for(len(seq)) <= self.num_free_blocks

    def allocate(self, seq):
        """Gives a waiting sequence the blocks its current tokens need."""
        if seq.seq_id in self.tables:
            raise ValueError(f"sequence {seq.seq_id} already has blocks")
        self.tables[seq.seq_id] = [self.allocator.allocate() for _ in range(self.blocks_for(len(seq)))]

    def can_append(self, seq):
        """Whether the sequence's next token fits: in its last block, or in one free block."""
        table = self.tables[seq.seq_id]
        return len(seq) < len(table) * self.block_size or self.num_free_blocks >= 1

    def append_slot(self, seq):
        """Makes room for the sequence's next token, taking a new block when the last is full."""
        table = self.tables[seq.seq_id]
        if len(seq) >= len(table) * self.block_size:
            table.append(self.allocator.allocate())

    def free(self, seq):
        for block in self.tables.pop(seq.seq_id, []):
            self.allocator.free(block)

    def block_table(self, seq):
        return self.tables[seq.seq_id]
