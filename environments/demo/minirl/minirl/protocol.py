"""DataProto: a batch of named arrays sharing their first dimension, plus batch-level metadata."""

import numpy as np


class DataProto:
    def __init__(self, batch=None, meta_info=None):
        self.batch = dict(batch or {})
        self.meta_info = dict(meta_info or {})
        sizes = {k: len(v) for k, v in self.batch.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"arrays disagree on batch size: {sizes}")

    def __len__(self):
        for v in self.batch.values():
            return len(v)
        return 0

    def __getitem__(self, index):
        return DataProto({k: v[index] for k, v in self.batch.items()}, self.meta_info)

    def select(self, keys):
        return DataProto({k: self.batch[k] for k in keys}, self.meta_info)

    def union(self, other):
        """Adds other's arrays; a key present in both must hold equal values."""
        out = dict(self.batch)
        for k, v in other.batch.items():
            if k in out and not np.array_equal(out[k], v):
                raise ValueError(f"union: {k!r} differs")
            out[k] = v
        return DataProto(out, {**self.meta_info, **other.meta_info})

    def chunk(self, n):
        """Splits into n equal parts; the batch size must divide by n."""
        if len(self) % n:
            raise ValueError(f"batch of {len(self)} does not split into {n} equal chunks")
        size = len(self) // n
        return [self[i * size:(i + 1) * size] for i in range(n)]

    @staticmethod
    def concat(parts):
        keys = parts[0].batch.keys()
        return DataProto({k: np.concatenate([p.batch[k] for p in parts]) for k in keys}, parts[0].meta_info)

    def repeat(self, times, interleave=True):
        """Repeats every row `times` times: a a b b (interleave) or a b a b."""
        if interleave:
            return DataProto({k: np.repeat(v, times, axis=0) for k, v in self.batch.items()}, self.meta_info)
        return DataProto({k: np.concatenate([v] * times) for k, v in self.batch.items()}, self.meta_info)
