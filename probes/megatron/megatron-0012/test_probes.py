"""Probes for megatron-0012 (an on-disk cache of the fully parallel save/load distribution).

The judge never imports megatron or torch. Each probe draws a fresh scenario (how many
tensors, their names, sizes and dtypes, which ranks hold which shard with which replica id,
how tensors are split, which rank pairs form the groups, the order in which ranks read, the
command lines) and runs drivers in child processes that fork their own ranks (RANKS_PRELUDE,
CPU ranks on gloo with no GPU visible: the distribution is metadata only). The children build
the sharded state dicts, call the code under test and send back plain data: the distributions
as (key, offset, rank) rows, the replica ids the wrappers set, and how many torch.distributed
calls each step issued.

The judge computes every expected distribution itself from the layout it drew, with the greedy
assignment Megatron-LM already uses and the task leaves unchanged (distribute_shards_to_ranks:
shards with fewer holders first, then larger ones, then by shard id, each to the least loaded
holder; in load mode shards whose main replica is outside the group go last). What is on disk
is the judge's own reading: it lists the cache directories after the creating run, then copies
the cache files into directories of its own, and a second run, in fresh processes, must read
the distributions from those copies. Reads (and repeated create calls) run on one rank at a
time while the other ranks wait outside any collective (on the rendezvous store), so a step that
still needs its group cannot finish however the collective is reached.
"""

import os
import shutil

from infradev_probe import RANKS_PRELUDE, fresh, run, workdir

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

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def one_at_a_time(rank, order, tag, fn):
    """Runs fn on each rank in turn (in `order`); the others wait on the store, outside any
    collective."""
    store = dist.distributed_c10d._get_default_store()
    out = None
    for turn in order:
        key = "%s-%d" % (tag, turn)
        if turn == rank:
            out = fn()
            store.set(key, "1")
        else:
            store.wait([key], datetime.timedelta(seconds=90))
    return out


def build(layout, rank):
    """This rank's sharded state dict: layout entries are {key, numel, dtype, shards:
    [{holders, replica}]}."""
    sd = {}
    for e in layout:
        parts = len(e["shards"])
        for i, sh in enumerate(e["shards"]):
            if rank not in sh["holders"]:
                continue
            rid = sh["replica"][sh["holders"].index(rank)]
            data = torch.full((e["numel"],), float(rank), dtype=DTYPES[e["dtype"]])
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

# Run 1: create the cache (all ranks), create again (each rank alone), then the default path.
_WARM_CREATE = _RANKS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    g = dist.group.WORLD
    out = {"path": eu._pg_dist_cache_file_path(a["dir"], g), "prefix": eu.PG_DIST_CACHE_FILE_PREFIX}
    eu._PG_DIST_CACHE.clear()
    with Calls() as c:
        d = dmrud(build(a["layout"], rank), g, pg_cache_path=a["dir"], pg_cache_create=True)
    out["create"], out["create_calls"] = rows(d), c.n
    dist.barrier()

    def again():
        with Calls() as c:
            d = dmrud(build(a["layout"], rank), g, pg_cache_path=a["dir"], pg_cache_create=True)
        return rows(d), c.n

    out["create_again"], out["create_again_calls"] = one_at_a_time(rank, a["order"], "again", again)
    dist.barrier()
    with Calls() as c:
        d = dmrud(build(a["layout"], rank), g)
    out["plain"], out["plain_calls"] = rows(d), c.n
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

# Run 2, fresh processes: each rank alone reads the judge's copy of the cache.
_WARM_READ = _RANKS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    g = dist.group.WORLD

    def read():
        eu._PG_DIST_CACHE.clear()
        with Calls() as c:
            d = dmrud(build(a["layout"], rank), g, ignore_groups=a["load"], pg_cache_path=a["dir"],
                      pg_cache_create=False)
        return rows(d), c.n

    out = {}
    out["read"], out["read_calls"] = one_at_a_time(rank, a["order"], "read", read)
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_SAVE_CREATE = _RANKS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    g = dist.group.WORLD
    eu._PG_DIST_CACHE.clear()
    with Calls() as c:
        d = dmrud(build(a["layout"], rank), g, ignore_groups=False, pg_cache_path=a["dir"], pg_cache_create=True)
    out = {"create_save": rows(d), "create_calls": c.n}
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_BOTH_READ = _RANKS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    g = dist.group.WORLD
    out = {}

    def read_load():
        eu._PG_DIST_CACHE.clear()
        with Calls() as c:
            d = dmrud(build(a["layout"], rank), g, ignore_groups=True, pg_cache_path=a["dir"])
        return rows(d), c.n

    out["read_load"], out["read_load_calls"] = one_at_a_time(rank, a["order"], "load", read_load)
    dist.barrier()
    if rank == a["remover"]:
        for name in os.listdir(a["dir"]):
            os.remove(os.path.join(a["dir"], name))
    dist.barrier()

    def read_save_from_memory():
        with Calls() as c:
            d = dmrud(build(a["layout"], rank), g, ignore_groups=False, pg_cache_path=a["dir"])
        return rows(d), c.n

    out["read_save"], out["read_save_calls"] = one_at_a_time(rank, a["order"][::-1], "save", read_save_from_memory)
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_GROUPS_CREATE = _RANKS + r'''
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
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_GROUPS_READ = _RANKS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    groups = [dist.new_group(ranks) for ranks in a["groups"]]
    mine = [g for g, ranks in zip(groups, a["groups"]) if rank in ranks][0]
    out = {"paths": [eu._pg_dist_cache_file_path(d, mine) for d in a["dirs"]], "read": [], "read_calls": []}
    for i, d in enumerate(a["dirs"]):
        def read(d=d):
            eu._PG_DIST_CACHE.clear()
            with Calls() as c:
                dd = dmrud(build(a["layout"], rank), mine, pg_cache_path=d)
            return rows(dd), c.n

        r, n = one_at_a_time(rank, a["orders"][i], "read%d" % i, read)
        out["read"].append(r)
        out["read_calls"].append(n)
    dist.barrier()
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_WRAPPERS_IMPORTS = r'''
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelLoadStrategyWrapper,
    FullyParallelSaveStrategyWrapper,
)
from megatron.core.dist_checkpointing.strategies.torch import (
    TorchDistLoadShardedStrategy,
    TorchDistSaveShardedStrategy,
)
'''

_WRAPPERS_CREATE = _RANKS + _WRAPPERS_IMPORTS + r'''
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
    return out


emit(ranks=spawn_ranks(ARGS["world"], scenario, ARGS, 240, cuda=False))
'''

_WRAPPERS_READ = _RANKS + _WRAPPERS_IMPORTS + r'''
def scenario(rank, world, port, a):
    init(rank, world, port)
    g = dist.group.WORLD
    out = {}

    def save_read():
        eu._PG_DIST_CACHE.clear()
        w = FullyParallelSaveStrategyWrapper(TorchDistSaveShardedStrategy(), g, pg_cache_path=a["dir"])
        sd = build(a["layout"], rank)
        with Calls() as c:
            w.apply_saving_parallelization(sd)
        return replicas(sd), c.n, [w.pg_cache_path, w.pg_cache_create]

    out["read_replicas"], out["read_calls"], out["read_attrs"] = one_at_a_time(rank, a["order"], "save", save_read)
    dist.barrier()

    def load_read():
        eu._PG_DIST_CACHE.clear()
        w = FullyParallelLoadStrategyWrapper(TorchDistLoadShardedStrategy(), g, pg_cache_path=a["dir"])
        sd = build(a["layout"], rank)
        with Calls() as c:
            d = w.apply_loading_parallelization(sd)
        return rows(d), replicas(sd), c.n, [w.pg_cache_path, w.pg_cache_create]

    out["load"], out["load_replicas"], out["load_calls"], out["load_attrs"] = one_at_a_time(
        rank, a["order"][::-1], "load", load_read)
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
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def _names(rng, n, prefix):
    """n distinct tensor names (lengths and letters vary, so their order does too)."""
    out = set()
    while len(out) < n:
        size = int(rng.integers(1, 4))
        out.add(prefix + "".join(chr(ord("a") + int(c)) for c in rng.integers(0, 26, size=size)))
    return [str(x) for x in rng.permutation(sorted(out))]


def draw_layout(rng, ranks, n, cross=0, prefix="", main_ranks=None):
    """n tensors held by `ranks`: each whole or split in 2 or 3 parts, each part held by a random
    set of ranks with distinct replica ids. A part has its main replica (replica id 0) on one of
    its holders among `main_ranks` (default: any holder), except in the last `cross` tensors,
    which have no main replica at all among `ranks`."""
    layout = []
    for t, key in enumerate(_names(rng, n, prefix)):
        parts = 1 if rng.random() < 0.6 else int(rng.integers(2, 4))
        is_cross = t >= n - cross
        shards = []
        for _ in range(parts):
            k = int(rng.integers(1, len(ranks) + 1))
            holders = sorted(int(r) for r in rng.choice(ranks, size=k, replace=False))
            ids = [int(x) for x in rng.permutation(k)]
            if is_cross:
                ids = [i + 1 for i in ids]
            else:
                allowed = [i for i, h in enumerate(holders) if main_ranks is None or h in main_ranks]
                if not allowed:
                    ids = [i + 1 for i in ids]
                else:
                    at = allowed[int(rng.integers(len(allowed)))]
                    zero = ids.index(0)
                    ids[zero], ids[at] = ids[at], ids[zero]
            shards.append({"holders": holders, "replica": ids})
        layout.append({"key": key, "numel": int(rng.integers(1, 300)),
                       "dtype": str(rng.choice(list(_ITEMSIZE))), "shards": shards})
    return layout


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
            size = _ITEMSIZE[e["dtype"]] * e["numel"]
            out[(e["key"], i * e["numel"] if parts > 1 else 0)] = (sorted(pos[h] for h in holders), size, main)
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


def _order(rng, world):
    return [int(r) for r in rng.permutation(world)]


def _listing(d):
    return sorted(os.listdir(d))


def _copy_cache(src_dir, names, sticky=True):
    """The judge's own copy of the cache files, in a directory no child has seen yet."""
    dst = workdir("pgcache-copy-")
    if not sticky:
        os.chmod(dst, 0o777)  # so a child may remove the judge's copy
    for name in names:
        shutil.copyfile(os.path.join(src_dir, name), os.path.join(dst, name))
        os.chmod(os.path.join(dst, name), 0o666)
    return dst


def test_warm_cache_read_is_local():
    rng = fresh()
    world = int(rng.integers(2, 4))
    layout = draw_layout(rng, list(range(world)), int(rng.integers(3, 9)))
    want = expected(layout, list(range(world)))
    d = workdir("pgcache-")
    out = run(_WARM_CREATE, {"world": world, "dir": d, "layout": layout, "order": _order(rng, world)},
              timeout=420, env=_CPU_ONLY)
    assert _listing(d) == ["pg_dist_0.pkl"], f"cache directory holds {_listing(d)}, want pg_dist_0.pkl only"
    for rank, r in enumerate(out["ranks"]):
        assert r["prefix"] == "pg_dist"
        assert r["path"] == os.path.join(d, "pg_dist_0.pkl"), f"rank {rank}: cache file path {r['path']!r}"
        assert r["create"] == want, f"rank {rank}: creating the cache gave {r['create']}, want {want}"
        assert _calls(r["create_calls"]) == {"all_gather_object": 1}, \
            f"rank {rank}: creating the cache should gather the metadata once, made {_calls(r['create_calls'])}"
        assert r["create_again"] == want, f"rank {rank}: second create call (each rank alone) gave {r['create_again']}"
        _no_calls(r["create_again_calls"], f"rank {rank}: a second create call for the same group in the same process")
        assert r["plain"] == want, f"rank {rank}: without the cache the distribution is {r['plain']}, want {want}"
        assert _calls(r["plain_calls"]) == {"all_gather_object": 1}, \
            f"rank {rank}: without the cache the metadata is gathered once, made {_calls(r['plain_calls'])}"
    copy = _copy_cache(d, ["pg_dist_0.pkl"])
    load = bool(rng.random() < 0.5)
    want_read = expected(layout, list(range(world)), load=load)
    out = run(_WARM_READ, {"world": world, "dir": copy, "layout": layout, "order": _order(rng, world),
                           "load": load}, timeout=420, env=_CPU_ONLY)
    for rank, r in enumerate(out["ranks"]):
        assert r["read"] == want_read, \
            (f"rank {rank}, a fresh process reading the judge's copy of the cache file alone "
             f"({'load' if load else 'save'} mode): got {r['read']}, want {want_read}")
        _no_calls(r["read_calls"], f"rank {rank}: reading a warm cache")


def test_one_cache_file_serves_save_and_load():
    rng = fresh()
    world = int(rng.integers(2, 4))
    # Shards with no main replica in the group: left out of the save distribution, last in the load one.
    layout = draw_layout(rng, list(range(world)), int(rng.integers(4, 9)), cross=int(rng.integers(1, 3)))
    save = expected(layout, list(range(world)))
    load = expected(layout, list(range(world)), load=True)
    assert save != load, "probe setup"
    d = workdir("pgcache-")
    out = run(_SAVE_CREATE, {"world": world, "dir": d, "layout": layout}, timeout=420, env=_CPU_ONLY)
    assert _listing(d) == ["pg_dist_0.pkl"], f"after the create call the cache directory holds {_listing(d)}"
    for rank, r in enumerate(out["ranks"]):
        assert r["create_save"] == save, f"rank {rank}: save distribution {r['create_save']}, want {save}"
        assert _calls(r["create_calls"]) == {"all_gather_object": 1}, \
            f"rank {rank}: creating the cache should gather the metadata once, made {_calls(r['create_calls'])}"
    copy = _copy_cache(d, ["pg_dist_0.pkl"], sticky=False)
    out = run(_BOTH_READ, {"world": world, "dir": copy, "layout": layout, "order": _order(rng, world),
                           "remover": int(rng.integers(world))}, timeout=420, env=_CPU_ONLY)
    assert _listing(copy) == [], f"the driver removed the cache file, yet {copy} holds {_listing(copy)}"
    for rank, r in enumerate(out["ranks"]):
        assert r["read_load"] == load, \
            f"rank {rank}: load distribution read from a cache created by a save: {r['read_load']}, want {load}"
        _no_calls(r["read_load_calls"], f"rank {rank}: reading the load distribution")
        assert r["read_save"] == save, \
            f"rank {rank}: save distribution after the file was read once and removed: {r['read_save']}, want {save}"
        _no_calls(r["read_save_calls"], f"rank {rank}: reading the save distribution from memory")


def test_one_cache_file_per_group_and_directory():
    rng = fresh()
    perm = [int(r) for r in rng.permutation(4)]
    groups = sorted(sorted(p) for p in (perm[:2], perm[2:]))
    # Each group's own tensors, plus tensors held across the groups whose main replica sits in one
    # of them (the other group leaves them out of its save distribution).
    layout = (draw_layout(rng, groups[0], int(rng.integers(2, 5)), prefix="g0.")
              + draw_layout(rng, groups[1], int(rng.integers(2, 5)), prefix="g1.")
              + draw_layout(rng, [0, 1, 2, 3], int(rng.integers(1, 3)), prefix="x.",
                            main_ranks=groups[int(rng.integers(2))]))
    dirs = [workdir("pgcache-a-"), workdir("pgcache-b-")]
    names = sorted("pg_dist_%d.pkl" % min(g) for g in groups)
    out = run(_GROUPS_CREATE, {"world": 4, "dirs": dirs, "groups": groups, "layout": layout},
              timeout=480, env=_CPU_ONLY)
    for d in dirs:
        assert _listing(d) == names, \
            f"groups {groups}: {d} holds {_listing(d)}, want {names} (one file per group, named by its lowest rank)"
    for rank, r in enumerate(out["ranks"]):
        group = [g for g in groups if rank in g][0]
        want = expected(layout, group)
        name = "pg_dist_%d.pkl" % min(group)
        assert r["paths"] == [os.path.join(d, name) for d in dirs], f"rank {rank}: cache file paths {r['paths']}"
        for i in range(len(dirs)):
            assert r["create"][i] == want, f"rank {rank}, directory {i}: created {r['create'][i]}, want {want}"
            assert _calls(r["create_calls"][i]) == {"all_gather_object": 1}, \
                (f"rank {rank}: creating the cache in directory {i} should gather once (a cache in another "
                 f"directory is another cache), made {_calls(r['create_calls'][i])}")
    copies = [_copy_cache(d, names) for d in dirs]
    out = run(_GROUPS_READ, {"world": 4, "dirs": copies, "groups": groups, "layout": layout,
                             "orders": [_order(rng, 4) for _ in copies]}, timeout=480, env=_CPU_ONLY)
    for rank, r in enumerate(out["ranks"]):
        group = [g for g in groups if rank in g][0]
        want = expected(layout, group)
        name = "pg_dist_%d.pkl" % min(group)
        assert r["paths"] == [os.path.join(d, name) for d in copies], f"rank {rank}: cache file paths {r['paths']}"
        for i in range(len(copies)):
            assert r["read"][i] == want, \
                f"rank {rank} (group {group}), the judge's copy of directory {i}: read {r['read'][i]}, want {want}"
            _no_calls(r["read_calls"][i], f"rank {rank}: reading the cache in directory {i}")


def test_wrappers_take_the_distribution_from_the_cache():
    rng = fresh()
    world = int(rng.integers(2, 4))
    layout = draw_layout(rng, list(range(world)), int(rng.integers(3, 9)))
    group = list(range(world))
    dist_rows = expected(layout, group)
    load_rows = expected(layout, group, load=True)
    d = workdir("pgcache-")
    out = run(_WRAPPERS_CREATE, {"world": world, "dir": d, "layout": layout}, timeout=420, env=_CPU_ONLY)
    assert _listing(d) == ["pg_dist_0.pkl"], f"cache directory holds {_listing(d)}"
    for rank, r in enumerate(out["ranks"]):
        want = expected_replicas(layout, group, rank, dist_rows)
        assert r["attrs"] == [d, True], f"rank {rank}: creating wrapper's attributes {r['attrs']}"
        assert r["create_replicas"] == want, \
            f"rank {rank}: replica ids after a create-mode save {r['create_replicas']}, want {want}"
        assert _calls(r["create_calls"]).get("all_gather_object", 0) >= 1, \
            f"rank {rank}: a create-mode save should gather the metadata, made {_calls(r['create_calls'])}"
    copy = _copy_cache(d, ["pg_dist_0.pkl"])
    out = run(_WRAPPERS_READ, {"world": world, "dir": copy, "layout": layout, "order": _order(rng, world)},
              timeout=420, env=_CPU_ONLY)
    for rank, r in enumerate(out["ranks"]):
        want = expected_replicas(layout, group, rank, dist_rows)
        assert r["read_attrs"] == [copy, False] and r["load_attrs"] == [copy, False], \
            f"rank {rank}: wrapper attributes {r['read_attrs']}, {r['load_attrs']}"
        assert r["read_replicas"] == want, f"rank {rank}: replica ids after a read-mode save {r['read_replicas']}, want {want}"
        _no_calls(r["read_calls"], f"rank {rank}: a save's parallelization in read mode")
        assert r["load"] == load_rows, f"rank {rank}: load distribution {r['load']}, want {load_rows}"
        assert r["load_replicas"] == expected_replicas(layout, group, rank, load_rows), \
            f"rank {rank}: replica ids after a read-mode load {r['load_replicas']}"
        _no_calls(r["load_calls"], f"rank {rank}: a load's parallelization in read mode")


_BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-4",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "128"]
_GROUP_CHOICES = [None, "dp", "ep_dp"]


def _case(path, create, save, load):
    extra = []
    if path is not None:
        extra += ["--ckpt-pg-tensors-cache-path", path]
    if create:
        extra += ["--ckpt-pg-tensors-cache-create"]
    if save is not None:
        extra += ["--ckpt-fully-parallel-save-process-group", save]
    if load is not None:
        extra += ["--ckpt-fully-parallel-load-process-group", load]
    return extra


def test_training_config_and_arguments():
    rng = fresh()
    path = "/tmp/pg-cache-%s" % "".join("%02x" % int(b) for b in rng.integers(0, 256, size=6))
    combos = [(p, c, s, l) for p in (None, path) for c in (False, True)
              for s in _GROUP_CHOICES for l in _GROUP_CHOICES]
    picked = [combos[int(i)] for i in rng.choice(len(combos), size=int(rng.integers(6, 11)), replace=False)]
    # Always one read-mode case with different groups (refused) and one with the cache and equal groups.
    picked.append((path, False, *[("dp", "ep_dp"), ("ep_dp", None), (None, "ep_dp")][int(rng.integers(3))]))
    picked.append((path, bool(rng.random() < 0.5), *[(None, None), ("dp", "dp"), ("ep_dp", "ep_dp")][int(rng.integers(3))]))
    picked = [picked[int(i)] for i in rng.permutation(len(picked))]
    cases = [_case(*c) for c in picked]
    out = run(_CONFIG, {"fields": ["ckpt_pg_tensors_cache_path", "ckpt_pg_tensors_cache_create"],
                        "base": _BASE, "cases": cases}, timeout=300, env=_CPU_ONLY)
    assert out["fields"] == {"ckpt_pg_tensors_cache_path": None, "ckpt_pg_tensors_cache_create": False}, out["fields"]
    assert len(out["cases"]) == len(cases), \
        f"the driver sent {len(out['cases'])} verdicts for {len(cases)} command lines"
    for (p, c, s, l), extra, got in zip(picked, cases, out["cases"]):
        refused = p is not None and (s or "dp") != (l or "dp")
        want = ["AssertionError" if refused else "ok", p, c]
        assert got == want, f"arguments {extra}: validate_args gave {got}, want {want}"
