"""Probes for minitron-0003 (checkpoint resharding).

The judge (this module) never imports minitron: each probe drives the code under test in a
child process on a fresh model size and fresh parameter values, and checks the plain data it
sends back against the splits the judge computes itself."""

import json

import numpy as np

from infradev_probe import fresh, run, workdir


def _layout(d_in, d_h, d_out):
    """MLP(d_in, d_h, d_out) on one rank: each parameter's shape and the axis it is split along
    across tensor-parallel ranks (fc1 is column parallel, fc2 row parallel; fc2's bias is
    replicated)."""
    shapes = {"fc1.weight": (d_in, d_h), "fc1.bias": (d_h,), "fc2.weight": (d_h, d_out), "fc2.bias": (d_out,)}
    axes = {"fc1.weight": 1, "fc1.bias": 0, "fc2.weight": 0, "fc2.bias": None}
    return shapes, axes


def test_a_single_rank_checkpoint_splits_across_more_ranks():
    rng = fresh()
    world = int(rng.integers(2, 5))
    dims = (int(rng.integers(2, 9)), world * int(rng.integers(1, 5)), int(rng.integers(2, 7)))
    shapes, axes = _layout(*dims)
    full = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    out = run("""
        import numpy as np
        from minitron.checkpoint import load_checkpoint, save_checkpoint
        from minitron.comm import ProcessGroup, launch
        from minitron.model import MLP

        m = MLP(*ARGS["dims"], ProcessGroup(0, 1, {}), seed=0)
        for name, p, _ in m.named_parameters():
            p[...] = ARGS["full"][name]
        save_checkpoint(ARGS["path"], m, rank=0, world_size=1)

        def rank(group, path):
            model = MLP(*ARGS["dims"], group, seed=9)
            load_checkpoint(path, model, rank=group.rank, world_size=group.world_size)
            return {n: np.array(p) for n, p, _ in model.named_parameters()}

        emit(ranks=launch(rank, ARGS["world"], ARGS["path"]))
    """, {"full": full, "dims": list(dims), "world": world, "path": workdir() + "/ckpt"})
    assert len(out["ranks"]) == world
    for r, got in enumerate(out["ranks"]):
        assert sorted(got) == sorted(shapes), f"rank {r}: parameters {sorted(got)}"
        for name, axis in axes.items():
            want = full[name] if axis is None else np.split(full[name], world, axis=axis)[r]
            assert got[name].shape == want.shape, f"rank {r}: {name} has shape {got[name].shape}, not {want.shape}"
            np.testing.assert_array_equal(got[name], want, err_msg=f"rank {r}: {name}")


def test_metadata_records_each_partition_axis():
    rng = fresh()
    key = "metadata_%016x" % int(rng.integers(1 << 62))
    world = int(rng.integers(1, 4))
    dims = [int(rng.integers(2, 9)), world * int(rng.integers(1, 5)), int(rng.integers(2, 7))]
    _, axes = _layout(*dims)
    out = run("""
        from minitron.checkpoint import save_checkpoint
        from minitron.comm import launch
        from minitron.model import MLP

        def rank(group, path):
            save_checkpoint(path, MLP(*ARGS["dims"], group, seed=0), rank=group.rank, world_size=group.world_size)
            group.barrier()

        launch(rank, ARGS["world"], ARGS["path"])
        with open(ARGS["path"] + "/metadata.json", "rb") as f:
            # Under a name drawn for this attempt: what another attempt's child sent answers
            # nothing here (the file's contents hardly depend on the inputs).
            emit(**{ARGS["key"]: f.read()})
    """, {"dims": dims, "world": world, "path": workdir() + "/ckpt", "key": key})
    assert isinstance(out.get(key), bytes), "the child sent no metadata.json"
    meta = json.loads(out[key])
    assert isinstance(meta, dict), f"metadata.json holds {type(meta).__name__}, not an object"
    assert "partition_axes" in meta, f"metadata.json has no partition_axes: {sorted(meta)}"
    assert meta["partition_axes"] == {f"model/{n}": a for n, a in axes.items()}
    assert meta.get("world_size") == world, f"metadata.json world_size: {meta.get('world_size')!r}, want {world}"
    assert sorted(meta.get("params") or []) == sorted(f"model/{n}" for n in axes), \
        f"metadata.json params: {meta.get('params')!r}"
