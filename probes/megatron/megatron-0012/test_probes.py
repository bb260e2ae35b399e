"""Probes for megatron-0012 (an on-disk cache of the fully parallel save/load distribution).

The judge never imports megatron or torch. Each probe runs a driver in a child process that
forks its own ranks (RANKS_PRELUDE, CPU ranks on gloo with no GPU visible: the distribution is
metadata only), builds small sharded state dicts from a layout the judge chooses (which rank
holds which shard, with which replica id, and each shard's size), calls the code under test and
sends back plain data: the distributions as (key, offset, rank) rows, the replica ids the
wrappers set, how many torch.distributed calls each step issued, and what it found on disk.

The judge computes every expected distribution itself from the same layout, with the greedy
assignment Megatron-LM already uses and the task leaves unchanged (distribute_shards_to_ranks:
shards with fewer holders first, then larger ones, each to the least loaded holder; in load mode
shards whose main replica is outside the group go last), and reads the cache directory's file names itself. Reads of a warm cache are run on one
rank at a time while the other ranks wait outside any collective (on the rendezvous store), so
a read that still needs its group cannot finish however the collective is reached.
"""

import os

from infradev_probe import RANKS_PRELUDE, run, workdir

# ---- the child's side -------------------------------------------------------------------------

_RANKS = RANKS_PRELUDE + r'''
import datetime
import os

import torch
import torch.distributed as dist

from megatron.core.dist_checkpointing import ShardedTensor
from megatron.core.dist_checkpointing import exchange_utils as eu

WATCHED = ("all_gather_object", "all_gather", "all_gather_into_tensor", "all_reduce", "broadcast",
           "broadcast_object_list", "gather", "gather_object", "scatter", "scatter_object_list",
           "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
           "barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv", "monitored_barrier")


class Calls:
    """Counts the outermost torch.distributed calls made inside the block."""

    def __enter__(self):
        self.n = {}
        self.depth = 0
        self.saved = []
        for mod in (dist, dist.distributed_c10d):
            for name in WATCHED:
                f = getattr(mod, name, None)
                if f is None:
                    continue

                def wrap(*a, _f=f, _name=name, **k):
                    if self.depth == 0:
                        self.n[_name] = self.n.get(_name, 0) + 1
                    self.depth += 1
                    try:
                        return _f(*a, **k)
                    finally:
                        self.depth -= 1

                self.saved.append((mod, name, f))
                setattr(mod, name, wrap)
        return self

    def __exit__(self, *exc):
        for mod, name, f in reversed(self.saved):
            setattr(mod, name, f)
        return False


def init(rank, world, port):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=25))


def one_at_a_time(rank, world, tag, fn):
    """Runs fn on each rank in turn; the others wait on the store, outside any collective."""
    store = dist.distributed_c10d._get_default_store()
    out = None
    for turn in range(world):
        key = "%s-%d" % (tag, turn)
        if turn == rank:
            out = fn()
            store.set(key, "1")
        else:
            store.wait([key], datetime.timedelta(seconds=90))
    return out


def build(layout, rank):
    """This rank's sharded state dict: layout entries are {key, numel, shards: [{holders, replica}]}."""
    sd = {}
    for e in layout:
        parts = len(e["shards"])
        for i, sh in enumerate(e["shards"]):
            if rank not in sh["holders"]:
                continue
            rid = sh["replica"][sh["holders"].index(rank)]
            data = torch.full((e["numel"],), float(rank), dtype=torch.float32)
            if parts == 1:
                st = ShardedTensor.from_rank_offsets(e["key"], data, replica_id=rid)
            else:
                st = ShardedTensor.from_rank_offsets(e["key"], data, (0, i, parts), replica_id=rid)
            sd["%s/%d" % (e["key"], i)] = st
    return sd


def rows(distribution):
    """A ShardDistribution as plain data."""
    if distribution is None:
        return None
    main = sorted([sid[0], int(sid[1][0]), int(r)] for sid, r in distribution.main_rank_for_shard.items())
    group = sorted([sid[0], int(sid[1][0])] for sid in distribution.shards_in_this_group)
    return {"main": main, "group": group}


def replicas(sd):
    return sorted([st.key, int(st.global_offset[0]), st.replica_id if isinstance(st.replica_id, int) else list(st.replica_id)]
                  for st in sd.values())


def dmrud(sd, group, **kw):
    return eu.determine_main_replica_uniform_distribution(sd, group, **kw)
'''

_WARM_READ = _RANKS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    g = dist.group.WORLD
    out = {"path": eu._pg_dist_cache_file_path(a["dir"], g), "prefix": eu.PG_DIST_CACHE_FILE_PREFIX}
    eu._PG_DIST_CACHE.clear()
    with Calls() as c:
        d = dmrud(build(a["layout"], rank), g, pg_cache_path=a["dir"], pg_cache_create=True)
    out["create"], out["create_calls"] = rows(d), c.n
    with Calls() as c:
        d = dmrud(build(a["layout"], rank), g, pg_cache_path=a["dir"], pg_cache_create=True)
    out["create_again"], out["create_again_calls"] = rows(d), c.n
    dist.barrier()

    def read():
        eu._PG_DIST_CACHE.clear()
        with Calls() as c:
            d = dmrud(build(a["layout"], rank), g, pg_cache_path=a["dir"], pg_cache_create=False)
        return rows(d), c.n

    out["read"], out["read_calls"] = one_at_a_time(rank, world, "read", read)
    dist.barrier()
    with Calls() as c:
        d = dmrud(build(a["layout"], rank), g)
    out["plain"], out["plain_calls"] = rows(d), c.n
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_BOTH_MODES = _RANKS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    g = dist.group.WORLD
    out = {}
    eu._PG_DIST_CACHE.clear()
    with Calls() as c:
        d = dmrud(build(a["layout"], rank), g, ignore_groups=False, pg_cache_path=a["dir"], pg_cache_create=True)
    out["create_save"], out["create_calls"] = rows(d), c.n
    dist.barrier()
    out["files_after_create"] = sorted(os.listdir(a["dir"]))

    def read_load():
        eu._PG_DIST_CACHE.clear()
        with Calls() as c:
            d = dmrud(build(a["layout"], rank), g, ignore_groups=True, pg_cache_path=a["dir"])
        return rows(d), c.n

    out["read_load"], out["read_load_calls"] = one_at_a_time(rank, world, "load", read_load)
    dist.barrier()
    if rank == 0:
        for name in os.listdir(a["dir"]):
            os.remove(os.path.join(a["dir"], name))
    dist.barrier()

    def read_save_from_memory():
        with Calls() as c:
            d = dmrud(build(a["layout"], rank), g, ignore_groups=False, pg_cache_path=a["dir"])
        return rows(d), c.n

    out["read_save"], out["read_save_calls"] = one_at_a_time(rank, world, "save", read_save_from_memory)
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_GROUPS = _RANKS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    groups = [dist.new_group(ranks) for ranks in a["groups"]]
    mine = [g for g, ranks in zip(groups, a["groups"]) if rank in ranks][0]
    out = {"paths": [eu._pg_dist_cache_file_path(d, mine) for d in a["dirs"]]}
    eu._PG_DIST_CACHE.clear()
    out["create"], out["create_calls"] = [], []
    for d in a["dirs"]:
        with Calls() as c:
            dd = dmrud(build(a["layout"], rank), mine, pg_cache_path=d, pg_cache_create=True)
        out["create"].append(rows(dd))
        out["create_calls"].append(c.n)
        dist.barrier()
    out["files"] = [sorted(os.listdir(d)) for d in a["dirs"]]
    out["read"], out["read_calls"] = [], []
    for i, d in enumerate(a["dirs"]):
        def read(d=d):
            eu._PG_DIST_CACHE.clear()
            with Calls() as c:
                dd = dmrud(build(a["layout"], rank), mine, pg_cache_path=d)
            return rows(dd), c.n

        r, n = one_at_a_time(rank, world, "read%d" % i, read)
        out["read"].append(r)
        out["read_calls"].append(n)
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_WRAPPERS = _RANKS + r'''
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelLoadStrategyWrapper,
    FullyParallelSaveStrategyWrapper,
)
from megatron.core.dist_checkpointing.strategies.torch import (
    TorchDistLoadShardedStrategy,
    TorchDistSaveShardedStrategy,
)


def scenario(rank, world, port, a):
    init(rank, world, port)
    g = dist.group.WORLD
    out = {}
    eu._PG_DIST_CACHE.clear()
    w = FullyParallelSaveStrategyWrapper(TorchDistSaveShardedStrategy(), g,
                                         pg_cache_path=a["dir"], pg_cache_create=True)
    out["attrs"] = [w.pg_cache_path, w.pg_cache_create]
    sd = build(a["layout"], rank)
    with Calls() as c:
        w.apply_saving_parallelization(sd)
    out["create_replicas"], out["create_calls"] = replicas(sd), c.n
    dist.barrier()

    def save_read():
        eu._PG_DIST_CACHE.clear()
        w = FullyParallelSaveStrategyWrapper(TorchDistSaveShardedStrategy(), g, pg_cache_path=a["dir"])
        sd = build(a["layout"], rank)
        with Calls() as c:
            w.apply_saving_parallelization(sd)
        return replicas(sd), c.n, [w.pg_cache_path, w.pg_cache_create]

    out["read_replicas"], out["read_calls"], out["read_attrs"] = one_at_a_time(rank, world, "save", save_read)
    dist.barrier()

    def load_read():
        eu._PG_DIST_CACHE.clear()
        w = FullyParallelLoadStrategyWrapper(TorchDistLoadShardedStrategy(), g, pg_cache_path=a["dir"])
        sd = build(a["layout"], rank)
        with Calls() as c:
            d = w.apply_loading_parallelization(sd)
        return rows(d), replicas(sd), c.n, [w.pg_cache_path, w.pg_cache_create]

    out["load"], out["load_replicas"], out["load_calls"], out["load_attrs"] = one_at_a_time(
        rank, world, "load", load_read)
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_CONFIG = r'''
import argparse
import dataclasses

from megatron.training.arguments import add_megatron_arguments, validate_args
from megatron.training.config import CheckpointConfig

fields = {f.name: f.default for f in dataclasses.fields(CheckpointConfig)}
out = {"fields": {k: fields.get(k, "<missing>") for k in ARGS["fields"]}}
parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
defaults = parser.parse_args(ARGS["base"])
out["defaults"] = [defaults.ckpt_pg_tensors_cache_path, defaults.ckpt_pg_tensors_cache_create]
out["cases"] = []
for extra in ARGS["cases"]:
    args = parser.parse_args(ARGS["base"] + extra)
    args.world_size, args.rank = 1, 0
    try:
        validate_args(args)
        verdict = "ok"
    except AssertionError:
        verdict = "AssertionError"
    except BaseException as e:
        verdict = type(e).__name__ + ": " + str(e)[:300]
    out["cases"].append([verdict, args.ckpt_pg_tensors_cache_path, args.ckpt_pg_tensors_cache_create])
emit(**out)
'''

# ---- the judge's side -------------------------------------------------------------------------

# The children see no GPU (the scenarios are metadata only), so they take the same CPU paths on a
# GPU machine as anywhere else, and the forked ranks never meet a CUDA context.
_CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}

# Two ranks. Every shard has its main replica in the group (replica id 0 on exactly one holder):
# replicated tensors whose main replica sits on either rank, and a tensor split in two halves,
# one per rank. The greedy assignment moves some saves away from the main replica's rank.
LAYOUT_2 = [
    {"key": "w.a", "numel": 48, "shards": [{"holders": [0, 1], "replica": [0, 1]}]},
    {"key": "w.b", "numel": 40, "shards": [{"holders": [0, 1], "replica": [1, 0]}]},
    {"key": "w.c", "numel": 20, "shards": [{"holders": [0, 1], "replica": [0, 1]}]},
    {"key": "w.d", "numel": 16, "shards": [{"holders": [0], "replica": [0]}, {"holders": [1], "replica": [0]}]},
    {"key": "w.e", "numel": 8, "shards": [{"holders": [0, 1], "replica": [1, 0]}]},
]

# LAYOUT_2 plus shards whose main replica is outside the group (no holder has replica id 0):
# in the save distribution they are left out, in the load distribution they come last.
LAYOUT_2_CROSS = LAYOUT_2 + [
    {"key": "x.f", "numel": 60, "shards": [{"holders": [0, 1], "replica": [1, 2]}]},
    {"key": "x.g", "numel": 12, "shards": [{"holders": [1], "replica": [1]}]},
]

# Four ranks in two groups, {0, 2} and {1, 3}, holding different tensors.
GROUPS_4 = [[0, 2], [1, 3]]
LAYOUT_4 = [
    {"key": "e.a", "numel": 30, "shards": [{"holders": [0, 2], "replica": [0, 1]}]},
    {"key": "e.b", "numel": 50, "shards": [{"holders": [0, 2], "replica": [1, 0]}]},
    {"key": "e.c", "numel": 10, "shards": [{"holders": [0, 2], "replica": [0, 1]}]},
    {"key": "o.a", "numel": 70, "shards": [{"holders": [1, 3], "replica": [0, 1]}]},
    {"key": "o.b", "numel": 24, "shards": [{"holders": [1], "replica": [0]}, {"holders": [3], "replica": [0]}]},
    {"key": "o.c", "numel": 36, "shards": [{"holders": [1, 3], "replica": [1, 0]}]},
]


def _shards(layout, group):
    """{(key, offset): (group-local holder ranks, bytes, has a main replica in the group)}."""
    pos = {g: i for i, g in enumerate(group)}
    out = {}
    for e in layout:
        parts = len(e["shards"])
        for i, sh in enumerate(e["shards"]):
            holders = [h for h in sh["holders"] if h in pos]
            if not holders:
                continue
            main = any(sh["replica"][sh["holders"].index(h)] == 0 for h in holders)
            out[(e["key"], i * e["numel"] if parts > 1 else 0)] = (sorted(pos[h] for h in holders), 4 * e["numel"], main)
    return out


def expected(layout, group, load=False):
    """The distribution the instruction's greedy rule gives: {"main": rows, "group": rows}."""
    shards = _shards(layout, group)
    chosen = {s for s, (_, _, main) in shards.items() if main or load}
    cross = {s for s in chosen if not shards[s][2]}
    loads = [0] * len(group)
    main = []
    for s in sorted(chosen, key=lambda s: (s in cross, len(shards[s][0]), -shards[s][1], s)):
        holders, size, _ = shards[s]
        r = min((loads[h], h) for h in holders)[1]
        loads[r] += size
        main.append([s[0], s[1], r])
    return {"main": sorted(main), "group": sorted([s[0], s[1]] for s in chosen)}


def expected_replicas(layout, group, rank, dist_rows):
    """Replica ids after the distribution is applied on `rank`: 0 where it saves, 1 elsewhere."""
    me = group.index(rank)
    owner = {(k, o): r for k, o, r in dist_rows["main"]}
    out = []
    for e in layout:
        parts = len(e["shards"])
        for i, sh in enumerate(e["shards"]):
            if rank in sh["holders"]:
                sid = (e["key"], i * e["numel"] if parts > 1 else 0)
                out.append([sid[0], sid[1], 0 if owner.get(sid) == me else 1])
    return sorted(out)


def _calls(n):
    return {k: v for k, v in (n or {}).items() if v}


def _no_calls(n, what):
    assert not _calls(n), f"{what}: expected no torch.distributed call, got {_calls(n)}"


def test_warm_cache_read_is_local():
    d = workdir("pgcache-")
    out = run(_WARM_READ, {"world": 2, "dir": d, "layout": LAYOUT_2}, timeout=420, env=_CPU_ONLY)
    want = expected(LAYOUT_2, [0, 1])
    assert sorted(os.listdir(d)) == ["pg_dist_0.pkl"], f"cache directory holds {sorted(os.listdir(d))}"
    for rank, r in enumerate(out["ranks"]):
        assert r["prefix"] == "pg_dist"
        assert r["path"] == os.path.join(d, "pg_dist_0.pkl"), f"rank {rank}: cache file path {r['path']!r}"
        assert r["create"] == want, f"rank {rank}: creating the cache gave {r['create']}, want {want}"
        assert _calls(r["create_calls"]) == {"all_gather_object": 1}, \
            f"rank {rank}: creating the cache should gather the metadata once, made {_calls(r['create_calls'])}"
        assert r["create_again"] == want, f"rank {rank}: second create call gave {r['create_again']}"
        _no_calls(r["create_again_calls"], f"rank {rank}: a second create call for the same group in the same process")
        assert r["read"] == want, f"rank {rank}: reading the cache gave {r['read']}, want {want}"
        _no_calls(r["read_calls"], f"rank {rank}: reading a warm cache")
        assert r["plain"] == want, f"rank {rank}: without the cache the distribution is {r['plain']}"
        assert _calls(r["plain_calls"]) == {"all_gather_object": 1}, \
            f"rank {rank}: without the cache the metadata is gathered once, made {_calls(r['plain_calls'])}"


def test_one_cache_file_serves_save_and_load():
    d = workdir("pgcache-")
    out = run(_BOTH_MODES, {"world": 2, "dir": d, "layout": LAYOUT_2_CROSS}, timeout=420, env=_CPU_ONLY)
    save = expected(LAYOUT_2_CROSS, [0, 1])
    load = expected(LAYOUT_2_CROSS, [0, 1], load=True)
    assert save != load
    for rank, r in enumerate(out["ranks"]):
        assert r["create_save"] == save, f"rank {rank}: save distribution {r['create_save']}, want {save}"
        assert _calls(r["create_calls"]) == {"all_gather_object": 1}, \
            f"rank {rank}: creating the cache should gather the metadata once, made {_calls(r['create_calls'])}"
        assert r["files_after_create"] == ["pg_dist_0.pkl"], \
            f"rank {rank}: after the create call the cache directory holds {r['files_after_create']}"
        assert r["read_load"] == load, \
            f"rank {rank}: load distribution read from a cache created by a save: {r['read_load']}, want {load}"
        _no_calls(r["read_load_calls"], f"rank {rank}: reading the load distribution")
        assert r["read_save"] == save, \
            f"rank {rank}: save distribution after the file was read once: {r['read_save']}, want {save}"
        _no_calls(r["read_save_calls"], f"rank {rank}: reading the save distribution from memory")


def test_one_cache_file_per_group_and_directory():
    dirs = [workdir("pgcache-a-"), workdir("pgcache-b-")]
    out = run(_GROUPS, {"world": 4, "dirs": dirs, "groups": GROUPS_4, "layout": LAYOUT_4}, timeout=480, env=_CPU_ONLY)
    for d in dirs:
        assert sorted(os.listdir(d)) == ["pg_dist_0.pkl", "pg_dist_1.pkl"], \
            f"{d} holds {sorted(os.listdir(d))}, want one file per group named by its lowest rank"
    for rank, r in enumerate(out["ranks"]):
        group = [g for g in GROUPS_4 if rank in g][0]
        want = expected(LAYOUT_4, group)
        name = "pg_dist_%d.pkl" % min(group)
        assert r["paths"] == [os.path.join(d, name) for d in dirs], f"rank {rank}: cache file paths {r['paths']}"
        assert r["files"] == [["pg_dist_0.pkl", "pg_dist_1.pkl"]] * 2, f"rank {rank} saw {r['files']}"
        for i, d in enumerate(dirs):
            assert r["create"][i] == want, f"rank {rank}, directory {i}: created {r['create'][i]}, want {want}"
            assert _calls(r["create_calls"][i]) == {"all_gather_object": 1}, \
                (f"rank {rank}: creating the cache in directory {i} should gather once (a cache in another "
                 f"directory is another cache), made {_calls(r['create_calls'][i])}")
            assert r["read"][i] == want, f"rank {rank}, directory {i}: read {r['read'][i]}, want {want}"
            _no_calls(r["read_calls"][i], f"rank {rank}: reading the cache in directory {i}")


def test_wrappers_take_the_distribution_from_the_cache():
    d = workdir("pgcache-")
    out = run(_WRAPPERS, {"world": 2, "dir": d, "layout": LAYOUT_2}, timeout=420, env=_CPU_ONLY)
    dist_rows = expected(LAYOUT_2, [0, 1])
    load_rows = expected(LAYOUT_2, [0, 1], load=True)
    assert sorted(os.listdir(d)) == ["pg_dist_0.pkl"], f"cache directory holds {sorted(os.listdir(d))}"
    for rank, r in enumerate(out["ranks"]):
        want = expected_replicas(LAYOUT_2, [0, 1], rank, dist_rows)
        assert r["attrs"] == [d, True] and r["read_attrs"] == [d, False] and r["load_attrs"] == [d, False], \
            f"rank {rank}: wrapper attributes {r['attrs']}, {r['read_attrs']}, {r['load_attrs']}"
        assert r["create_replicas"] == want, f"rank {rank}: replica ids after a create-mode save {r['create_replicas']}, want {want}"
        assert _calls(r["create_calls"]).get("all_gather_object", 0) >= 1, \
            f"rank {rank}: a create-mode save should gather the metadata, made {_calls(r['create_calls'])}"
        assert r["read_replicas"] == want, f"rank {rank}: replica ids after a read-mode save {r['read_replicas']}, want {want}"
        _no_calls(r["read_calls"], f"rank {rank}: a save's parallelization in read mode")
        assert r["load"] == load_rows, f"rank {rank}: load distribution {r['load']}, want {load_rows}"
        assert r["load_replicas"] == expected_replicas(LAYOUT_2, [0, 1], rank, load_rows), \
            f"rank {rank}: replica ids after a read-mode load {r['load_replicas']}"
        _no_calls(r["load_calls"], f"rank {rank}: a load's parallelization in read mode")


_BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-4",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "128"]
_CACHE = ["--ckpt-pg-tensors-cache-path", "/tmp/pg-cache"]


def test_training_config_and_arguments():
    cases = [
        [],
        _CACHE,
        _CACHE + ["--ckpt-pg-tensors-cache-create"],
        _CACHE + ["--ckpt-fully-parallel-save-process-group", "ep_dp"],
        _CACHE + ["--ckpt-fully-parallel-load-process-group", "ep_dp"],
        _CACHE + ["--ckpt-fully-parallel-save-process-group", "ep_dp",
                  "--ckpt-fully-parallel-load-process-group", "ep_dp", "--ckpt-pg-tensors-cache-create"],
        ["--ckpt-fully-parallel-save-process-group", "ep_dp"],
    ]
    out = run(_CONFIG, {"fields": ["ckpt_pg_tensors_cache_path", "ckpt_pg_tensors_cache_create"],
                        "base": _BASE, "cases": cases}, timeout=300, env=_CPU_ONLY)
    assert out["fields"] == {"ckpt_pg_tensors_cache_path": None, "ckpt_pg_tensors_cache_create": False}, out["fields"]
    assert out["defaults"] == [None, False], out["defaults"]
    want = [
        ["ok", None, False],
        ["ok", "/tmp/pg-cache", False],
        ["ok", "/tmp/pg-cache", True],
        ["AssertionError", "/tmp/pg-cache", False],
        ["AssertionError", "/tmp/pg-cache", False],
        ["ok", "/tmp/pg-cache", True],
        ["ok", None, False],
    ]
    for extra, got, w in zip(cases, out["cases"], want):
        assert got == w, f"arguments {extra}: validate_args gave {got}, want {w}"
