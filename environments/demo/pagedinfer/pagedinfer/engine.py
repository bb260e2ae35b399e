"""The engine: requests in, tokens out, one continuous-batching step at a time."""

import numpy as np

from pagedinfer.block_manager import BlockManager
from pagedinfer.model import KVCache, ToyModel
from pagedinfer.sampling import SamplingParams, sample
from pagedinfer.scheduler import Scheduler
from pagedinfer.sequence import Sequence


class RequestOutput:
    def __init__(self, seq):
        self.request_id = seq.seq_id
        self.prompt = list(seq.prompt)
        self.tokens = list(seq.output)
        self.finish_reason = seq.finish_reason


class LLMEngine:
    def __init__(self, model=None, num_blocks=64, block_size=4, max_num_seqs=8, seed=0):
        self.model = model or ToyModel()
        self.block_manager = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=max_num_seqs)
        self.cache = KVCache(num_blocks, block_size, self.model.dim)
        self.rng = np.random.default_rng(seed)
        self._next_id = 0

    def add_request(self, prompt, params=None):
        """Queues a request; returns its id."""
        seq = Sequence(self._next_id, prompt, params or SamplingParams(), arrival=self._next_id)
        self._next_id += 1
        self.scheduler.add(seq)
        return seq.seq_id

    def has_unfinished(self):
        return self.scheduler.has_unfinished()

    def _compute(self, seq):
        """Writes the keys of every token not yet in the cache; returns the last key."""
        table = self.block_manager.block_table(seq)
        tokens = seq.tokens
        pos = seq.num_computed
        prev = self.cache.read(table, pos - 1) if pos else np.zeros(self.model.dim, np.float32)
        for p in range(pos, len(tokens)):
            prev = self.model.key(tokens[p], prev)
            self.cache.write(table, p, prev)
        seq.num_computed = len(tokens)
        return prev

    def _sample(self, seq, logits):
        return sample(logits, seq.params, self.rng)

    def step(self):
        """Runs one step; returns the outputs of the requests that finished in it."""
        prefill, decode = self.scheduler.schedule()
        finished = []
        for seq in decode + prefill:
            last = self._compute(seq)
            seq.append(self._sample(seq, self.model.logits(last)))
            if seq.finished:
                self.scheduler.finish(seq)
                finished.append(RequestOutput(seq))
        return finished

    def generate(self, prompts, params=None):
        """Runs every prompt to completion; returns their outputs in prompt order."""
        ids = [self.add_request(p, params) for p in prompts]
        done = {}
        while self.has_unfinished():
            for out in self.step():
                done[out.request_id] = out
        return [done[i] for i in ids]
