"""Checkpoints: each rank saves and loads its own parameter shards.

Layout of a checkpoint directory::

    metadata.json          world size and parameter names (written by rank 0)
    rank_000.npz ...       one file per rank holding that rank's shards
"""

import json
import os

import numpy as np


def _rank_file(path, rank):
    return os.path.join(path, f"rank_{rank:03d}.npz")


def save_checkpoint(path, model, rank=0, world_size=1):
    """Saves ``model``'s local shards for ``rank`` under the directory ``path``."""
    os.makedirs(path, exist_ok=True)
    arrays = {f"model/{name}": p for name, p, _ in model.named_parameters()}
    tmp = _rank_file(path, rank) + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, _rank_file(path, rank))
    if rank == 0:
        meta = {"world_size": world_size, "params": sorted(arrays)}
        with open(os.path.join(path, "metadata.json"), "w") as f:
            json.dump(meta, f)


def load_checkpoint(path, model, rank=0):
    """Loads ``rank``'s shards from the directory ``path`` into ``model`` in place."""
    with np.load(_rank_file(path, rank)) as data:
        for name, p, _ in model.named_parameters():
            key = f"model/{name}"
            if key not in data:
                raise KeyError(f"checkpoint {path} has no {key} for rank {rank}")
            if data[key].shape != p.shape:
                raise ValueError(f"{key}: checkpoint shape {data[key].shape} != model shape {p.shape}")
            p[...] = data[key]
