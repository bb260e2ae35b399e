"""Continuous batching: every step admits waiting sequences while the KV cache has room and
gives every running sequence a slot for its next token."""

from collections import deque

from pagedinfer.sequence import FINISHED, RUNNING, WAITING


class KVCacheExhausted(RuntimeError):
    pass


class Scheduler:
    def __init__(self, block_manager, max_num_seqs=8):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.waiting = deque()
        self.running = []  # in arrival order

    def add(self, seq):
        seq.status = WAITING
        self.waiting.append(seq)

    def has_unfinished(self):
        return bool(self.waiting or self.running)

    def schedule(self):
        """Returns (prefill, decode): sequences admitted this step, and running sequences that
        each got a slot for one more token."""
        bm = self.block_manager
        decode = []
        for seq in self.running:
            if not bm.can_append(seq):
                raise KVCacheExhausted(f"no KV cache block for sequence {seq.seq_id}")
            bm.append_slot(seq)
            decode.append(seq)
        prefill = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not bm.can_allocate(seq):
                break
            self.waiting.popleft()
            bm.allocate(seq)
            seq.status = RUNNING
            self.running.append(seq)
            prefill.append(seq)
        return prefill, decode

    def finish(self, seq):
        seq.status = FINISHED
        self.block_manager.free(seq)
        self.running.remove(seq)
