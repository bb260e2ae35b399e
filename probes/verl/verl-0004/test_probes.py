"""Probes for verl-0004 (splitting a Ray resource pool into sub-pools).

The judge (this module) never imports verl, torch or ray: each probe starts Ray in a child
process, builds pools, splits them and (for the placement probes) worker groups on the parts,
and sends back plain data: every worker's rank, world size and the GPU Ray gave it, and the GPU
behind every bundle of the pool. The judge computes from the split sizes alone which bundle every
worker must sit on.

The placement probes need 8 GPUs (the task's count): one pool of 8 bundles with one GPU each."""

from infradev_probe import run, workdir

SETUP = """
import os
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    split_resource_pool,
)

ray.init(num_cpus=256, include_dashboard=False, object_store_memory=1 << 30,
         _temp_dir=os.path.join(ARGS["dir"], "ray"))


def need_gpus(n):
    have = int(ray.cluster_resources().get("GPU", 0))
    if have < n:
        raise RuntimeError("this probe needs %d GPUs; Ray sees %d" % (n, have))


@ray.remote
class Where(Worker):
    def __init__(self, tag):
        super().__init__()
        self.tag = tag

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        return {"tag": self.tag, "rank": self.rank, "world": self.world_size,
                "gpus": [str(g) for g in ray.get_gpu_ids()]}


@ray.remote(num_cpus=0, num_gpus=0.01)
def gpu_of_bundle():
    return [str(g) for g in ray.get_gpu_ids()]


def bundle_gpus(pool):
    # The GPU behind every bundle of the root pool, in bundle-number order.
    refs = []
    for pg in pool.pgs:
        for i in range(pg.bundle_count):
            strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
            refs.append(gpu_of_bundle.options(scheduling_strategy=strategy).remote())
    return ray.get(refs)


def place(pools):
    # One worker group per pool; what each worker reports.
    groups = []
    for tag, sub in pools:
        wg = RayWorkerGroup(resource_pool=sub, ray_cls_with_init=RayClassWithInitArgs(cls=Where, tag=tag))
        groups.append({"tag": tag, "world_size": wg.world_size, "workers": wg.where()})
    return groups
"""


def _check_placement(label, out, parts):
    """parts: [(tag, first bundle, size)]. Every worker of part tag sits on bundle first + rank,
    ranks run 0..size-1, and no two workers share a GPU."""
    bundles = out["bundles"]
    assert len(bundles) == 8 and all(len(b) == 1 for b in bundles) and len({b[0] for b in bundles}) == 8, (
        f"{label}: the pool's 8 bundles map to GPUs {bundles}; want one distinct GPU each")
    groups = {g["tag"]: g for g in out["groups"]}
    owner = {}
    for tag, first, size in parts:
        g = groups[tag]
        ranks = sorted(w["rank"] for w in g["workers"])
        assert g["world_size"] == size and ranks == list(range(size)), (
            f"{label}: part {tag} (bundles {first}-{first + size - 1}) has worker group world_size "
            f"{g['world_size']} and ranks {ranks}; want {size} workers ranked 0-{size - 1}")
        for w in g["workers"]:
            assert w["world"] == size, f"{label}: part {tag} rank {w['rank']} sees WORLD_SIZE {w['world']}, want {size}"
            want = bundles[first + w["rank"]]
            assert w["gpus"] == want, (
                f"{label}: part {tag} rank {w['rank']} runs on GPU {w['gpus']}; it belongs on bundle "
                f"{first + w['rank']} of the pool, GPU {want}")
            gpu = w["gpus"][0]
            assert gpu not in owner, (
                f"{label}: GPU {gpu} holds both {owner[gpu]} and part {tag} rank {w['rank']}; parts of one "
                f"pool must not share a bundle")
            owner[gpu] = f"part {tag} rank {w['rank']}"


def test_parts_of_a_split_sit_on_their_own_bundles():
    out = run(SETUP + """
try:
    need_gpus(8)
    pool = RayResourcePool(process_on_nodes=[4, 4])
    pool.get_placement_groups()
    first, second = split_resource_pool(pool, [2, 6])
    emit(bundles=bundle_gpus(pool), groups=place([("A", first), ("B", second)]),
         starts=[int(first.start_bundle_index), int(second.start_bundle_index)])
finally:
    ray.shutdown()
""", {"dir": workdir()}, timeout=600)
    assert out["starts"] == [0, 2], f"split [2, 6] of an [4, 4] pool: start_bundle_index {out['starts']}, want [0, 2]"
    _check_placement("[4, 4] pool split [2, 6]", out, [("A", 0, 2), ("B", 2, 6)])


def test_splitting_a_part_again_keeps_its_offset():
    out = run(SETUP + """
try:
    need_gpus(8)
    pool = RayResourcePool(process_on_nodes=[2, 2, 2, 2])
    pool.get_placement_groups()
    head, middle, tail = split_resource_pool(pool, [2, 4, 2])
    singles = split_resource_pool(middle, 1)
    tail_parts = split_resource_pool(tail, [1, 1])
    parts = [("head", head)] + [("middle%d" % i, p) for i, p in enumerate(singles)] + \\
            [("tail%d" % i, p) for i, p in enumerate(tail_parts)]
    starts = {tag: [int(p.start_bundle_index), int(p.world_size)] for tag, p in parts}
    emit(bundles=bundle_gpus(pool), starts=starts, groups=place(parts))
finally:
    ray.shutdown()
""", {"dir": workdir()}, timeout=600)
    want = {"head": [0, 2], "middle0": [2, 1], "middle1": [3, 1], "middle2": [4, 1], "middle3": [5, 1],
            "tail0": [6, 1], "tail1": [7, 1]}
    assert out["starts"] == want, (
        f"[2, 2, 2, 2] pool split [2, 4, 2], then the middle part split 1 and the last [1, 1]: "
        f"(start_bundle_index, world_size) {out['starts']}, want {want}")
    _check_placement("nested split", out, [(tag, s, n) for tag, (s, n) in want.items()])


def test_split_sizes_are_checked_and_nothing_is_reserved():
    out = run(SETUP + """
from ray.util.placement_group import placement_group_table

try:
    pool = RayResourcePool(process_on_nodes=[4, 4], use_gpu=False, max_colocate_count=1)
    pgs = pool.get_placement_groups()
    pg_ids = [pg.id.hex() for pg in pool.pgs]
    n_groups = len(placement_group_table())
    res = {}

    def describe(parts):
        return [{"start": int(p.start_bundle_index), "world": int(p.world_size),
                 "is_pool": isinstance(p, RayResourcePool), "type": type(p).__name__,
                 "use_gpu": bool(p.use_gpu), "colocate": int(p.max_colocate_count),
                 "pgs": [pg.id.hex() for pg in p.get_placement_groups()]} for p in parts]

    for name, size in (("even", 2), ("list", [3, 5]), ("whole", [8]), ("ones", 1)):
        res[name] = describe(split_resource_pool(pool, size))
    for name, size in (("not_a_divisor", 3), ("short_list", [3, 4]), ("long_list", [4, 5])):
        try:
            parts = split_resource_pool(pool, size)
            res[name] = {"returned": [[int(p.start_bundle_index), int(p.world_size)] for p in parts]}
        except AssertionError:
            res[name] = {"refused": "AssertionError"}
        except Exception as e:
            res[name] = {"refused": type(e).__name__}
    res["pool_world_size"] = int(pool.world_size)
    res["pg_ids"] = pg_ids
    res["groups_before"] = n_groups
    res["groups_after"] = len(placement_group_table())
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir()}, timeout=300)
    cases = {"even": (2, [(0, 2), (2, 2), (4, 2), (6, 2)]), "list": ([3, 5], [(0, 3), (3, 5)]),
             "whole": ([8], [(0, 8)]), "ones": (1, [(i, 1) for i in range(8)])}
    for name, (size, want) in cases.items():
        got = out[name]
        assert [(p["start"], p["world"]) for p in got] == want, (
            f"split_resource_pool(8-bundle pool, {size!r}) gave (start_bundle_index, world_size) "
            f"{[(p['start'], p['world']) for p in got]}, want {want}")
        for p in got:
            assert p["is_pool"] and p["type"] == "SubRayResourcePool", (
                f"split_resource_pool(..., {size!r}) returned a {p['type']}, want a SubRayResourcePool (a RayResourcePool)")
            assert p["use_gpu"] is False and p["colocate"] == 1, (
                f"split_resource_pool(..., {size!r}): a part has use_gpu={p['use_gpu']}, max_colocate_count="
                f"{p['colocate']}; want the pool's False and 1")
            assert p["pgs"] == out["pg_ids"], (
                f"split_resource_pool(..., {size!r}): a part's placement groups are {p['pgs']}, want the pool's own "
                f"{out['pg_ids']}")
    for name, size in (("not_a_divisor", 3), ("short_list", [3, 4]), ("long_list", [4, 5])):
        assert out[name] == {"refused": "AssertionError"}, (
            f"split_resource_pool(8-bundle pool, {size!r}) must be refused with AssertionError; got {out[name]}")
    assert out["pool_world_size"] == 8, f"after splitting, the pool's world_size is {out['pool_world_size']}, want 8"
    assert out["groups_after"] == out["groups_before"], (
        f"splitting created placement groups: {out['groups_before']} before, {out['groups_after']} after")
