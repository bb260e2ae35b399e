"""Probes for minitron-0003 (checkpoint resharding)."""

import json

import numpy as np

from minitron.checkpoint import load_checkpoint, save_checkpoint
from minitron.comm import ProcessGroup, launch
from minitron.model import MLP


def _load_tp2(group, path):
    model = MLP(8, 16, 4, group, seed=9)
    load_checkpoint(path, model, rank=group.rank, world_size=group.world_size)
    want = MLP(8, 16, 4, group, seed=0)
    return [(n, np.array_equal(p, q)) for (n, p, _), (_, q, _) in zip(model.named_parameters(), want.named_parameters())]


def test_a_single_rank_checkpoint_splits_across_two_ranks(tmp_path):
    path = str(tmp_path / "ckpt")
    save_checkpoint(path, MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0), rank=0, world_size=1)
    for rank, equal in enumerate(launch(_load_tp2, 2, path)):
        assert all(ok for _, ok in equal), f"rank {rank}: {equal}"


def test_metadata_records_each_partition_axis(tmp_path):
    path = str(tmp_path / "ckpt")
    save_checkpoint(path, MLP(8, 16, 4, ProcessGroup(0, 1, {}), seed=0))
    with open(f"{path}/metadata.json") as f:
        axes = json.load(f)["partition_axes"]
    assert axes == {"model/fc1.weight": 1, "model/fc1.bias": 0, "model/fc2.weight": 0, "model/fc2.bias": None}
