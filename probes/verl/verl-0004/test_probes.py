"""Probes for verl-0004 (splitting a Ray resource pool into sub-pools).

The judge (this module) never imports verl, torch or ray: each probe starts Ray in a child
process, builds a pool, splits it (and, for the placement probes, builds worker groups on the
parts), and sends back plain data: every part's start bundle and size, every worker's rank,
world size and the GPU Ray gave it, and the GPU behind every bundle of the pool. Every scenario
is drawn fresh: how the pool's bundles are spread over placement groups, the split sizes (ints
and lists), which parts are split again and how, which invalid sizes are tried and in what
order. The judge computes from the split sizes alone which bundle every part starts at and which
bundle every worker must sit on.

The placement probes need 8 GPUs (the task's count): one pool of 8 bundles with one GPU each.
The split-size probe runs on a CPU-only pool."""

from infradev_probe import fresh, run, workdir

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

# Ray starts no idle worker processes ahead of need: the sandbox caps the threads of the whole
# attempt, and every Ray worker process holds a few dozen.
os.environ["RAY_prestart_worker_first_driver"] = "0"
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
    # One worker group per pool, one after the other; what each worker reports. Each group's actors
    # are ended once they have answered (they are pinned to their bundles, so the next groups land
    # where they would anyway): the sandbox caps the threads of the whole attempt.
    groups = []
    for tag, sub in pools:
        wg = RayWorkerGroup(resource_pool=sub, ray_cls_with_init=RayClassWithInitArgs(cls=Where, tag=tag))
        groups.append({"tag": tag, "world_size": wg.world_size, "workers": wg.where()})
        for w in wg._workers:
            ray.kill(w)
    return groups


def do_splits(root, plan):
    # plan: [[parent tag, split size, [child tags]]] in order; "root" is the pool itself
    parts = {"root": root}
    for parent, size, tags in plan:
        for tag, p in zip(tags, split_resource_pool(parts[parent], size), strict=True):
            parts[tag] = p
    return parts
"""


def _composition(rng, total, parts):
    """A random list of `parts` positive sizes adding up to total."""
    if parts <= 1:
        return [total]
    cuts = sorted(int(c) for c in rng.choice(range(1, total), size=parts - 1, replace=False))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _size_for(rng, total):
    """A valid split size of a pool of `total` bundles, int or list, never the whole pool as one int."""
    if total > 1 and rng.random() < 0.5:
        return int(rng.choice([d for d in _divisors(total) if d < total]))
    return _composition(rng, total, int(rng.integers(1, min(total, 4) + 1)))


def _sizes(size, total):
    return [size] * (total // size) if isinstance(size, int) else list(size)


def _plan_starts(plan, roots):
    """{tag: (start bundle, size)} for every part of a plan, computed from the split sizes alone."""
    where = dict(roots)
    for parent, size, tags in plan:
        start, total = where[parent]
        for tag, n in zip(tags, _sizes(size, total)):
            where[tag] = (start, n)
            start += n
    return where


def _check_placement(label, out, parts):
    """parts: [(tag, first bundle, size)]. Every worker of part tag sits on bundle first + rank,
    ranks run 0..size-1, and no two workers share a GPU."""
    bundles = out["bundles"]
    assert len(bundles) == 8 and all(len(b) == 1 for b in bundles) and len({b[0] for b in bundles}) == 8, (
        f"{label}: the pool's 8 bundles map to GPUs {bundles}; want one distinct GPU each")
    groups = {g["tag"]: g for g in out["groups"]}
    assert sorted(groups) == sorted(tag for tag, _, _ in parts), (
        f"{label}: worker groups for parts {sorted(groups)}, want {sorted(tag for tag, _, _ in parts)}")
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


PLACE = SETUP + """
try:
    need_gpus(8)
    pool = RayResourcePool(process_on_nodes=ARGS["nodes"])
    pool.get_placement_groups()
    parts = do_splits(pool, ARGS["plan"])
    leaves = [(tag, parts[tag]) for tag in ARGS["leaves"]]
    emit(bundles=bundle_gpus(pool), groups=place(leaves),
         starts={tag: [int(p.start_bundle_index), int(p.world_size)] for tag, p in parts.items() if tag != "root"})
finally:
    ray.shutdown()
"""


def _nodes(rng):
    per = int(rng.choice([2, 4, 8]))
    return [per] * (8 // per)


def test_parts_of_a_split_sit_on_their_own_bundles():
    rng = fresh()
    nodes = _nodes(rng)
    while True:
        sizes = _composition(rng, 8, int(rng.integers(2, 5)))
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        # with several placement groups, some part must cross from one into the next
        if len(nodes) == 1 or any(s // nodes[0] != (s + n - 1) // nodes[0] for s, n in zip(starts, sizes)):
            break
    tags = ["p%d" % i for i in range(len(sizes))]
    plan = [["root", sizes, tags]]
    out = run(PLACE, {"dir": workdir(), "nodes": nodes, "plan": plan, "leaves": tags}, timeout=600)
    want = _plan_starts(plan, {"root": (0, 8)})
    got = {tag: tuple(v) for tag, v in out["starts"].items()}
    assert got == {t: want[t] for t in tags}, (
        f"{nodes} pool split {sizes}: (start_bundle_index, world_size) {got}, want {({t: want[t] for t in tags})}")
    _check_placement(f"{nodes} pool split {sizes}", out, [(t, *want[t]) for t in tags])


def test_splitting_a_part_again_keeps_its_offset():
    rng = fresh()
    nodes = _nodes(rng)
    while True:
        sizes = _composition(rng, 8, int(rng.integers(2, 4)))
        if any(n > 1 for n in sizes[1:]):
            break
    tags = ["p%d" % i for i in range(len(sizes))]
    plan = [["root", sizes, tags]]
    roots = {"root": (0, 8)}
    # split again every later part of more than one bundle (it starts past bundle 0), and maybe the first
    again = [t for t, n in zip(tags, sizes) if n > 1 and (t != "p0" or rng.random() < 0.5)]
    leaves = [t for t in tags if t not in again]
    for t in again:
        start, total = _plan_starts(plan, roots)[t]
        size = _size_for(rng, total)
        if _sizes(size, total) == [total]:
            size = 1
        kids = ["%s.%d" % (t, i) for i in range(len(_sizes(size, total)))]
        plan.append([t, size, kids])
        # a third level under one of them, now and then
        big = [k for k, n in zip(kids, _sizes(size, total)) if n > 1]
        if big and rng.random() < 0.5:
            k = str(rng.choice(big))
            n = _plan_starts(plan, roots)[k][1]
            grand = ["%s.%d" % (k, i) for i in range(n)]
            plan.append([k, 1, grand])
            kids = [x for x in kids if x != k] + grand
        leaves += kids
    out = run(PLACE, {"dir": workdir(), "nodes": nodes, "plan": plan, "leaves": leaves}, timeout=600)
    want = _plan_starts(plan, roots)
    want.pop("root")
    got = {tag: tuple(v) for tag, v in out["starts"].items()}
    assert got == want, (
        f"{nodes} pool split by {plan}: (start_bundle_index, world_size) {got}, want {want}")
    _check_placement(f"nested split {plan}", out, [(t, *want[t]) for t in leaves])


def test_split_sizes_are_checked_and_nothing_is_reserved():
    rng = fresh()
    per = int(rng.integers(1, 5))
    n_pgs = int(rng.integers(1, 4))
    if per * n_pgs < 4:
        per = 4 // n_pgs + 1
    total = per * n_pgs
    colocate = int(rng.integers(1, 4))
    cases = []
    for _ in range(int(rng.integers(2, 5))):
        cases.append({"size": _size_for(rng, total), "valid": True})
    bad = [d for d in range(2, total) if total % d]
    cases.append({"size": int(rng.choice(bad)) if bad else total + 1, "valid": False})
    short = _composition(rng, total - 1, int(rng.integers(1, min(total - 1, 3) + 1)))
    cases.append({"size": short, "valid": False})
    long = _composition(rng, total + int(rng.integers(1, 4)), int(rng.integers(2, 4)))
    cases.append({"size": long, "valid": False})
    cases = [cases[i] for i in rng.permutation(len(cases))]
    out = run(SETUP + """
from ray.util.placement_group import placement_group_table

try:
    pool = RayResourcePool(process_on_nodes=ARGS["nodes"], use_gpu=False, max_colocate_count=ARGS["colocate"])
    pool.get_placement_groups()
    pg_ids = [pg.id.hex() for pg in pool.pgs]
    res = {"cases": []}

    def describe(parts):
        return [{"start": int(p.start_bundle_index), "world": int(p.world_size),
                 "is_pool": isinstance(p, RayResourcePool), "type": type(p).__name__,
                 "use_gpu": bool(p.use_gpu), "colocate": int(p.max_colocate_count),
                 "pgs": [pg_ids.index(pg.id.hex()) if pg.id.hex() in pg_ids else -1
                         for pg in p.get_placement_groups()]} for p in parts]

    for case in ARGS["cases"]:
        try:
            res["cases"].append({"parts": describe(split_resource_pool(pool, case["size"]))})
        except AssertionError:
            res["cases"].append({"refused": "AssertionError"})
        except Exception as e:
            res["cases"].append({"refused": type(e).__name__})
    res["pool_world_size"] = int(pool.world_size)
    res["groups_after"] = len(placement_group_table())
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "nodes": [per] * n_pgs, "colocate": colocate, "cases": cases}, timeout=300)
    assert len(out["cases"]) == len(cases), f"{len(out['cases'])} results for {len(cases)} splits"
    for case, got in zip(cases, out["cases"]):
        size = case["size"]
        label = f"split_resource_pool({total}-bundle pool over {n_pgs} placement groups, {size!r})"
        if not case["valid"]:
            assert got == {"refused": "AssertionError"}, f"{label} must be refused with AssertionError; got {got}"
            continue
        assert "parts" in got, f"{label} was refused: {got}"
        sizes = _sizes(size, total)
        want = [(sum(sizes[:i]), n) for i, n in enumerate(sizes)]
        parts = got["parts"]
        assert [(p["start"], p["world"]) for p in parts] == want, (
            f"{label} gave (start_bundle_index, world_size) {[(p['start'], p['world']) for p in parts]}, want {want}")
        for p in parts:
            assert p["is_pool"] and p["type"] == "SubRayResourcePool", (
                f"{label} returned a {p['type']}, want a SubRayResourcePool (a RayResourcePool)")
            assert p["use_gpu"] is False and p["colocate"] == colocate, (
                f"{label}: a part has use_gpu={p['use_gpu']}, max_colocate_count={p['colocate']}; want the pool's "
                f"False and {colocate}")
            assert p["pgs"] == list(range(n_pgs)), (
                f"{label}: a part's placement groups are, by their place among the pool's {n_pgs}, {p['pgs']} "
                f"(-1: not one of the pool's); want the pool's own, in order")
    assert out["pool_world_size"] == total, f"after splitting, the pool's world_size is {out['pool_world_size']}, want {total}"
    assert out["groups_after"] == n_pgs, (
        f"after splitting and asking every part for its placement groups, Ray holds {out['groups_after']} placement "
        f"groups; the pool made {n_pgs} and splitting must create none")
