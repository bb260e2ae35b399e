"""Probes for verl-0003 (dispatch and collect by a device mesh each worker registers).

The judge (this module) never imports verl, torch or ray: each probe starts Ray and worker groups
in a child process and checks the plain data it sends back (which samples every rank received,
which rank produced every output row, how often the layout was queried, how many bytes the
driver serialized) against what the scenario implies. Every scenario is drawn fresh: the world
size, each mesh's layout (data-parallel size, which rank holds which dp_rank, which ranks
collect), the sample ids and values, the sequence of calls, and how often the test itself asks
the workers for a layout.

The worker groups here are CPU actors (use_gpu=False) whose meshes are given as explicit per-rank
(dp_rank, is_collect) lists, so the layouts differ from the official test's GPU meshes and the
probes need no GPU of their own."""

from infradev_probe import fresh, run, workdir

# A Ray instance of the child's own (its own temp dir, generous logical CPUs) and a worker whose
# registrations come from a layout: {mesh_name: [[dp_rank, is_collect] per rank]}.
SETUP = """
import os
import ray
import torch

from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

# Ray starts no idle worker processes ahead of need: the sandbox caps the threads of the whole
# attempt, and every Ray worker process holds a few dozen.
os.environ["RAY_prestart_worker_first_driver"] = "0"
ray.init(num_cpus=64, num_gpus=0, include_dashboard=False, object_store_memory=1 << 30,
         _temp_dir=os.path.join(ARGS["dir"], "ray"))


@ray.remote
class MeshWorker(Worker):
    def __init__(self, layout):
        super().__init__()
        self.seen = []
        self.queries = {}
        for name, per_rank in layout.items():
            dp, collect = per_rank[self.rank]
            self._register_dispatch_collect_info(name, dp_rank=int(dp), is_collect=bool(collect))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name):
        key = "dispatch:" + mesh_name
        self.queries[key] = self.queries.get(key, 0) + 1
        return Worker._query_dispatch_info(self, mesh_name)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name):
        key = "collect:" + mesh_name
        self.queries[key] = self.queries.get(key, 0) + 1
        return Worker._query_collect_info(self, mesh_name)

    def _tag(self, name, data):
        ids = data.batch["ids"]
        self.seen.append([name, ids.tolist()])
        return DataProto.from_dict({"ids": ids.clone(), "by": torch.full_like(ids, self.rank)})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="m"))
    def tag_m(self, data):
        return self._tag("tag_m", data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="m"))
    def other_m(self, data):
        return self._tag("other_m", data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="n"))
    def tag_n(self, data):
        return self._tag("tag_n", data)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="m"))
    def pair_m(self, a, b):
        ids = a.batch["ids"]
        self.seen.append(["pair_m", ids.tolist(), b.batch["ids"].tolist()])
        return DataProto.from_dict({"ids": ids.clone(), "by": torch.full_like(ids, self.rank),
                                    "s": a.batch["x"] + b.batch["y"]})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="m"), blocking=False)
    def later_m(self, data):
        return self._tag("later_m", data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self):
        return {"seen": self.seen, "queries": self.queries}


def make_group(layout, world):
    pool = RayResourcePool([world], use_gpu=False, max_colocate_count=1)
    return RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=MeshWorker, layout=layout))


def batch(ids, width=1):
    ids = torch.tensor(ids)
    return DataProto.from_dict({"ids": ids, "x": torch.ones(len(ids), width)})


def rows(out):
    return {"ids": out.batch["ids"].tolist(), "by": out.batch["by"].tolist()}
"""


def _layout(rng, world, dp, group=None):
    """Per rank [dp_rank, is_collect]: one collecting rank per dp_rank, the collecting ranks
    ordered like their dp_ranks, the other ranks in random dp_ranks (each dp_rank held by
    `group` ranks when given)."""
    collectors = sorted(int(c) for c in rng.choice(world, size=dp, replace=False))
    layout = [None] * world
    for d, r in enumerate(collectors):
        layout[r] = [d, True]
    rest = [r for r in range(world) if layout[r] is None]
    if group is None:
        dps = [int(rng.integers(dp)) for _ in rest]
    else:
        dps = [int(d) for d in rng.permutation([d for d in range(dp) for _ in range(group - 1)])]
    for r, d in zip(rest, dps):
        layout[r] = [d, False]
    return layout


def _ids(rng, n):
    return [int(i) for i in rng.choice(10 ** 6, size=n, replace=False)]


def _seen(report, name, k):
    """What every rank received in its k-th call of method name (None where it has no such call)."""
    out = []
    for rep in report:
        calls = [e[1] for e in rep["seen"] if e[0] == name]
        out.append(calls[k] if k < len(calls) else None)
    return out


def _check_call(label, got_rows, seen, layout, ids):
    """One dispatched call: every rank got its dp shard; the result is the collecting ranks'
    outputs, one per dp rank, in input order."""
    n = len(ids)
    dp_size = max(dp for dp, _ in layout) + 1
    per = n // dp_size
    assert len(seen) == len(layout), f"{label}: {len(seen)} ranks reported, want {len(layout)}"
    for r, (dp, _) in enumerate(layout):
        want = ids[dp * per:(dp + 1) * per]
        assert seen[r] == want, (
            f"{label}: rank {r} (dp_rank {dp} of {dp_size}) received samples {seen[r]}, want shard {want}")
    collector = {dp: r for r, (dp, c) in enumerate(layout) if c}
    want_by = [collector[i // per] for i in range(n)]
    assert got_rows["ids"] == ids and got_rows["by"] == want_by, (
        f"{label}: result rows {got_rows['ids']} produced by ranks {got_rows['by']}; want rows "
        f"{ids} from the collecting ranks {want_by}")


def test_each_mesh_is_queried_once_per_worker_group():
    rng = fresh()
    world = int(rng.integers(4, 7))
    layout = {"m": _layout(rng, world, int(rng.integers(2, 5))),
              "n": _layout(rng, world, int(rng.integers(2, 5)))}
    names = ["tag_m", "other_m", "tag_n", "tag_n"] + [str(x) for x in rng.choice(["tag_m", "other_m", "tag_n"],
                                                                                 size=int(rng.integers(1, 5)))]
    names = [names[i] for i in rng.permutation(len(names))]
    calls = []
    for name in names:
        mesh = name.split("_")[1]
        dp = max(d for d, _ in layout[mesh]) + 1
        calls.append([name, _ids(rng, dp * int(rng.integers(1, 4)))])
    # the test itself asks the workers for a layout a few times, somewhere in the sequence
    asks = {f"{kind}:{mesh}": int(rng.integers(0, 3)) for kind in ("dispatch", "collect") for mesh in ("m", "n")}
    ask_at = int(rng.integers(0, len(calls) + 1))
    out = run(SETUP + """
try:
    wg = make_group(ARGS["layout"], ARGS["world"])
    res = {"calls": []}

    def ask():
        for key, times in ARGS["asks"].items():
            kind, mesh = key.split(":")
            for _ in range(times):
                getattr(wg, "_query_%s_info" % kind)(mesh)

    for i, (name, ids) in enumerate(ARGS["calls"]):
        if i == ARGS["ask_at"]:
            ask()
        res["calls"].append([name, rows(getattr(wg, name)(batch(ids)))])
    if ARGS["ask_at"] == len(ARGS["calls"]):
        ask()
    res["dispatch_info"] = {k: list(v) for k, v in wg._dispatch_info.items()}
    res["collect_info"] = {k: [bool(x) for x in v] for k, v in wg._collect_info.items()}
    res["report"] = wg.report()
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "layout": layout, "world": world, "calls": calls, "asks": asks, "ask_at": ask_at},
        timeout=600)
    count = {}
    assert len(out["calls"]) == len(calls), f"{len(out['calls'])} results for {len(calls)} calls"
    for i, ((name, ids), (got_name, got)) in enumerate(zip(calls, out["calls"])):
        mesh = name.split("_")[1]
        k = count.get(name, 0)
        count[name] = k + 1
        _check_call(f"call {i + 1} ({name}, mesh {mesh})", got, _seen(out["report"], name, k), layout[mesh], ids)
    for mesh in ("m", "n"):
        assert out["dispatch_info"].get(mesh) == [dp for dp, _ in layout[mesh]], (
            f"_dispatch_info[{mesh!r}] is {out['dispatch_info'].get(mesh)}, want {[dp for dp, _ in layout[mesh]]}")
        assert out["collect_info"].get(mesh) == [bool(c) for _, c in layout[mesh]], (
            f"_collect_info[{mesh!r}] is {out['collect_info'].get(mesh)}, want {[bool(c) for _, c in layout[mesh]]}")
    want = {key: times + 1 for key, times in asks.items()}
    per_mesh = {mesh: sum(1 for name in names if name.endswith("_" + mesh)) for mesh in ("m", "n")}
    for r, rep in enumerate(out["report"]):
        assert rep["queries"] == want, (
            f"after {per_mesh['m']} calls on mesh m and {per_mesh['n']} on mesh n, and the test's own "
            f"queries {asks}, rank {r} was queried {rep['queries']}; want each mesh's dispatch and collect info "
            f"queried once per worker group besides the test's own: {want}")


def test_each_shard_is_serialized_once_not_once_per_rank():
    rng = fresh()
    dp = int(rng.integers(2, 4))
    group = int(rng.integers(2, 6 // dp + 1))
    world = dp * group
    layout = {"m": _layout(rng, world, dp, group=group)}
    n = dp * int(rng.integers(1, 5))
    width = int(rng.integers(1 << 20, 5 << 20)) // (4 * n)  # 1-5 MiB of float32 per batch
    sizes = [n, width]
    ids = [_ids(rng, n) for _ in range(int(rng.integers(2, 4)))]
    out = run(SETUP + """
try:
    wg = make_group(ARGS["layout"], ARGS["world"])
    original = DataProto.__getstate__
    sent = {"bytes": 0, "objects": 0}

    def counting(self):
        state = original(self)
        sent["bytes"] += len(state[0])
        sent["objects"] += 1
        return state

    per_call = []
    results = []
    for ids in ARGS["ids"]:
        data = batch(ids, width=ARGS["width"])
        DataProto.__getstate__ = counting
        try:
            sent["bytes"], sent["objects"] = 0, 0
            results.append(rows(wg.tag_m(data)))
            per_call.append(dict(sent))
        finally:
            DataProto.__getstate__ = original
    emit(per_call=per_call, results=results, report=wg.report())
finally:
    ray.shutdown()
""", {"dir": workdir(), "layout": layout, "world": world, "ids": ids, "width": width}, timeout=600)
    assert len(out["results"]) == len(ids), f"{len(out['results'])} results for {len(ids)} calls"
    for i, got in enumerate(out["results"]):
        _check_call(f"call {i + 1}", got, _seen(out["report"], "tag_m", i), layout["m"], ids[i])
    payload = n * width * 4 + n * 8  # the float32 x and int64 ids of every sample
    limit = 1.5 * payload + 65536 * dp
    for i, sent in enumerate(out["per_call"]):
        assert sent["bytes"] <= limit, (
            f"call {i + 1}: dispatching a batch of {sizes[0]} samples ({payload} bytes of tensors) in {dp} shards over "
            f"{world} ranks made the driver serialize {sent['bytes']} bytes of DataProto in {sent['objects']} "
            f"objects; each shard must go to the object store once and be shared by its {group} ranks (about "
            f"{payload} bytes in {dp} objects)")


def test_keyword_arguments_and_non_blocking_calls():
    rng = fresh()
    world = int(rng.integers(4, 7))
    dp = int(rng.integers(2, 5))
    layout = {"m": _layout(rng, world, dp)}
    n = dp * int(rng.integers(1, 4))
    ids = _ids(rng, n)
    x = rng.integers(-1000, 1000, size=n).tolist()
    y = rng.integers(-10 ** 6, 10 ** 6, size=n).tolist()
    later_ids = _ids(rng, dp * int(rng.integers(1, 4)))
    out = run(SETUP + """
try:
    wg = make_group(ARGS["layout"], ARGS["world"])
    ids = torch.tensor(ARGS["ids"])
    a = DataProto.from_dict({"ids": ids, "x": torch.tensor(ARGS["x"], dtype=torch.float64)})
    b = DataProto.from_dict({"ids": ids.clone(), "y": torch.tensor(ARGS["y"], dtype=torch.float64)})
    res = {}
    try:
        out = wg.pair_m(a, b=b)
        res["pair"] = {"ids": out.batch["ids"].tolist(), "by": out.batch["by"].tolist(),
                       "s": out.batch["s"].tolist()}
    except Exception as e:
        res["pair_error"] = "%s: %s" % (type(e).__name__, str(e)[:2000])
    fut = wg.later_m(batch(ARGS["later_ids"]))
    res["future_type"] = type(fut).__name__
    res["later"] = rows(fut.get()) if hasattr(fut, "get") and not isinstance(fut, DataProto) else rows(fut)
    res["report"] = wg.report()
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "layout": layout, "world": world, "ids": ids, "x": x, "y": y, "later_ids": later_ids},
        timeout=600)
    assert "pair_error" not in out, (
        f"a method called with one DataProto positionally and one by keyword raised: {out.get('pair_error')}")
    lay = layout["m"]
    per = n // dp
    pair_seen = [[e for e in rep["seen"] if e[0] == "pair_m"] for rep in out["report"]]
    assert len(pair_seen) == world, f"{len(pair_seen)} ranks reported, want {world}"
    for r, (d, _) in enumerate(lay):
        want = ids[d * per:(d + 1) * per]
        assert len(pair_seen[r]) == 1 and pair_seen[r][0][1] == want and pair_seen[r][0][2] == want, (
            f"rank {r} (dp_rank {d}) received {pair_seen[r]}; want shard {want} of both the positional "
            f"and the keyword argument")
    got = out["pair"]
    want_s = [float(a + b) for a, b in zip(x, y)]
    assert got["ids"] == ids and got["s"] == want_s, (
        f"positional + keyword call: rows {got['ids']} with sums {got['s']}, want rows {ids} with x + y = {want_s}")
    collector = {d: r for r, (d, c) in enumerate(lay) if c}
    want_by = [collector[i // per] for i in range(n)]
    assert got["by"] == want_by, f"positional + keyword call: rows from ranks {got['by']}, want {want_by}"
    assert out["future_type"] == "DataProtoFuture", (
        f"a method registered with blocking=False returned a {out['future_type']}, want a DataProtoFuture")
    _check_call("non-blocking call", out["later"], _seen(out["report"], "later_m", 0), lay, later_ids)


def test_worker_groups_keep_their_own_mesh_layouts():
    rng = fresh()
    # Two groups register the same mesh name with different sizes and layouts.
    # (both groups live at once: the sandbox's thread cap keeps them small)
    world_a = int(rng.integers(3, 6))
    world_b = int(rng.integers(2, min(3, world_a - 1) + 1))
    layout_a = {"m": _layout(rng, world_a, int(rng.integers(2, min(4, world_a) + 1)))}
    layout_b = {"m": _layout(rng, world_b, int(rng.integers(1, min(4, world_b) + 1)))}
    layouts = {"A": layout_a["m"], "B": layout_b["m"]}
    tags = ["A", "B", "A", "B"] + [str(t) for t in rng.choice(["A", "B"], size=int(rng.integers(0, 3)))]
    tags = tags[:1] + [tags[1:][i] for i in rng.permutation(len(tags) - 1)]
    if rng.random() < 0.5:
        tags = ["B" if t == "A" else "A" for t in tags]
    calls = []
    for tag in tags:
        dp = max(d for d, _ in layouts[tag]) + 1
        calls.append([tag, _ids(rng, dp * int(rng.integers(1, 4)))])
    out = run(SETUP + """
try:
    groups = {"A": make_group(ARGS["a"], ARGS["world_a"]), "B": make_group(ARGS["b"], ARGS["world_b"])}
    calls = []
    for tag, ids in ARGS["calls"]:
        try:
            calls.append([tag, rows(groups[tag].tag_m(batch(ids)))])
        except Exception as e:
            calls.append([tag, {"error": "%s: %s" % (type(e).__name__, str(e)[:2000])}])
    info = {tag: {"dispatch": list(wg._dispatch_info.get("m", [])),
                  "collect": [bool(x) for x in wg._collect_info.get("m", [])]} for tag, wg in groups.items()}
    emit(calls=calls, info=info, report={tag: wg.report() for tag, wg in groups.items()})
finally:
    ray.shutdown()
""", {"dir": workdir(), "a": layout_a, "b": layout_b, "world_a": world_a, "world_b": world_b, "calls": calls},
        timeout=600)
    for tag, lay in layouts.items():
        got = out["info"][tag]
        assert got["dispatch"] == [dp for dp, _ in lay] and got["collect"] == [bool(c) for _, c in lay], (
            f"group {tag}: _dispatch_info['m'] {got['dispatch']}, _collect_info['m'] {got['collect']}; "
            f"want its own layout {[dp for dp, _ in lay]}, {[bool(c) for _, c in lay]}")
    nth = {"A": 0, "B": 0}
    assert len(out["calls"]) == len(calls), f"{len(out['calls'])} results for {len(calls)} calls"
    for i, ((tag, ids), (_, got)) in enumerate(zip(calls, out["calls"])):
        assert "error" not in got, f"call {i + 1} on group {tag} raised: {got['error']}"
        _check_call(f"call {i + 1} on group {tag}", got, _seen(out["report"][tag], "tag_m", nth[tag]), layouts[tag],
                    ids)
        nth[tag] += 1
