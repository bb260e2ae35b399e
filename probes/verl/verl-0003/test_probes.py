"""Probes for verl-0003 (dispatch and collect by a device mesh each worker registers).

The judge (this module) never imports verl, torch or ray: each probe starts Ray and worker groups
in a child process and checks the plain data it sends back (which samples every rank received,
which rank produced every output row, how often the layout was queried, how many bytes the
driver serialized) against what the layout given to the workers implies.

The worker groups here are CPU actors (use_gpu=False) whose meshes are given as explicit per-rank
(dp_rank, is_collect) lists, so the layouts differ from the official test's GPU meshes and the
probes need no GPU of their own."""

from infradev_probe import run, workdir

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


def batch(n, width=1):
    return DataProto.from_dict({"ids": torch.arange(n), "x": torch.ones(n, width)})


def rows(out):
    return {"ids": out.batch["ids"].tolist(), "by": out.batch["by"].tolist()}
"""


def _layout(world, dp_of, collect_of):
    return [[dp_of(r), collect_of(r)] for r in range(world)]


def _shard(n, dp_size, d):
    per = n // dp_size
    return list(range(d * per, (d + 1) * per))


def _seen(report, name, k):
    """What every rank received in its k-th call of method name (None where it has no such call)."""
    out = []
    for rep in report:
        calls = [e[1] for e in rep["seen"] if e[0] == name]
        out.append(calls[k] if k < len(calls) else None)
    return out


def _check_call(label, got_rows, seen, layout, n):
    """One dispatched call: every rank got its dp shard; the result is the collecting ranks'
    outputs, one per dp rank, in input order."""
    dp_size = max(dp for dp, _ in layout) + 1
    for r, (dp, _) in enumerate(layout):
        want = _shard(n, dp_size, dp)
        assert seen[r] == want, (
            f"{label}: rank {r} (dp_rank {dp} of {dp_size}) received samples {seen[r]}, want shard {want}")
    collector = {dp: r for r, (dp, c) in enumerate(layout) if c}
    want_by = [collector[i // (n // dp_size)] for i in range(n)]
    assert got_rows["ids"] == list(range(n)) and got_rows["by"] == want_by, (
        f"{label}: result rows {got_rows['ids']} produced by ranks {got_rows['by']}; want rows "
        f"{list(range(n))} from the collecting ranks {want_by}")


def test_each_mesh_is_queried_once_per_worker_group():
    # mesh m: dp = rank // 4 (2 shards), collected by ranks 0 and 4;
    # mesh n: dp = rank % 4 (4 shards, interleaved), collected by ranks 0-3.
    layout = {"m": _layout(8, lambda r: r // 4, lambda r: r % 4 == 0),
              "n": _layout(8, lambda r: r % 4, lambda r: r < 4)}
    out = run(SETUP + """
try:
    wg = make_group(ARGS["layout"], 8)
    res = {"calls": []}
    for name in ["tag_m", "other_m", "tag_n", "tag_m", "tag_n", "other_m"]:
        res["calls"].append([name, rows(getattr(wg, name)(batch(8)))])
    res["dispatch_info"] = {k: list(v) for k, v in wg._dispatch_info.items()}
    res["collect_info"] = {k: [bool(x) for x in v] for k, v in wg._collect_info.items()}
    res["report"] = wg.report()
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "layout": layout}, timeout=600)
    count = {}
    for i, (name, got) in enumerate(out["calls"]):
        mesh = name.split("_")[1]
        k = count.get(name, 0)
        count[name] = k + 1
        _check_call(f"call {i + 1} ({name}, mesh {mesh})", got, _seen(out["report"], name, k), layout[mesh], 8)
    for mesh in ("m", "n"):
        assert out["dispatch_info"].get(mesh) == [dp for dp, _ in layout[mesh]], (
            f"_dispatch_info[{mesh!r}] is {out['dispatch_info'].get(mesh)}")
        assert out["collect_info"].get(mesh) == [bool(c) for _, c in layout[mesh]], (
            f"_collect_info[{mesh!r}] is {out['collect_info'].get(mesh)}")
    for r, rep in enumerate(out["report"]):
        want = {f"{kind}:{mesh}": 1 for kind in ("dispatch", "collect") for mesh in ("m", "n")}
        assert rep["queries"] == want, (
            f"after 4 calls on mesh m (two methods) and 2 on mesh n, rank {r} was queried {rep['queries']}; "
            f"want each mesh's dispatch and collect info queried once per worker group: {want}")


def test_each_shard_is_serialized_once_not_once_per_rank():
    # 8 ranks, dp = rank // 4: a 16-sample batch of 4 MiB goes out as 2 shards.
    layout = {"m": _layout(8, lambda r: r // 4, lambda r: r % 4 == 0)}
    out = run(SETUP + """
try:
    wg = make_group(ARGS["layout"], 8)
    data = batch(16, width=65536)
    full = len(DataProto.__getstate__(data)[0])
    original = DataProto.__getstate__
    sent = {"bytes": 0, "objects": 0}

    def counting(self):
        state = original(self)
        sent["bytes"] += len(state[0])
        sent["objects"] += 1
        return state

    per_call = []
    results = []
    DataProto.__getstate__ = counting
    try:
        for _ in range(2):
            sent["bytes"], sent["objects"] = 0, 0
            results.append(rows(wg.tag_m(batch(16, width=65536))))
            per_call.append(dict(sent))
    finally:
        DataProto.__getstate__ = original
    emit(full=full, per_call=per_call, results=results, report=wg.report())
finally:
    ray.shutdown()
""", {"dir": workdir(), "layout": layout}, timeout=600)
    for i, got in enumerate(out["results"]):
        _check_call(f"call {i + 1}", got, _seen(out["report"], "tag_m", i), layout["m"], 16)
    full = out["full"]
    for i, sent in enumerate(out["per_call"]):
        assert sent["bytes"] <= 2.5 * full, (
            f"call {i + 1}: dispatching a {full}-byte batch (2 shards over 8 ranks) made the driver serialize "
            f"{sent['bytes']} bytes of DataProto in {sent['objects']} objects; each shard must go to the "
            f"object store once and be shared by its ranks (about {full} bytes, 2 objects)")


def test_keyword_arguments_and_non_blocking_calls():
    # 8 ranks, dp = rank // 2 (4 shards), collected by the even ranks.
    layout = {"m": _layout(8, lambda r: r // 2, lambda r: r % 2 == 0)}
    out = run(SETUP + """
try:
    wg = make_group(ARGS["layout"], 8)
    a = DataProto.from_dict({"ids": torch.arange(8), "x": torch.arange(8).float()})
    b = DataProto.from_dict({"ids": torch.arange(8), "y": 100 * torch.arange(8).float()})
    res = {}
    try:
        out = wg.pair_m(a, b=b)
        res["pair"] = {"ids": out.batch["ids"].tolist(), "by": out.batch["by"].tolist(),
                       "s": out.batch["s"].tolist()}
    except Exception as e:
        res["pair_error"] = "%s: %s" % (type(e).__name__, str(e)[:2000])
    fut = wg.later_m(batch(8))
    res["future_type"] = type(fut).__name__
    res["later"] = rows(fut.get()) if hasattr(fut, "get") and not isinstance(fut, DataProto) else rows(fut)
    res["report"] = wg.report()
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "layout": layout}, timeout=600)
    assert "pair_error" not in out, (
        f"a method called with one DataProto positionally and one by keyword raised: {out.get('pair_error')}")
    lay = layout["m"]
    pair_seen = [[e for e in rep["seen"] if e[0] == "pair_m"] for rep in out["report"]]
    for r, (dp, _) in enumerate(lay):
        want = _shard(8, 4, dp)
        assert len(pair_seen[r]) == 1 and pair_seen[r][0][1] == want and pair_seen[r][0][2] == want, (
            f"rank {r} (dp_rank {dp}) received {pair_seen[r]}; want shard {want} of both the positional "
            f"and the keyword argument")
    got = out["pair"]
    assert got["ids"] == list(range(8)) and got["s"] == [101.0 * i for i in range(8)], (
        f"positional + keyword call: rows {got['ids']} with sums {got['s']}, want rows 0-7 with x + y = 101 * id")
    assert got["by"] == [2 * (i // 2) for i in range(8)], f"positional + keyword call: rows from ranks {got['by']}"
    assert out["future_type"] == "DataProtoFuture", (
        f"a method registered with blocking=False returned a {out['future_type']}, want a DataProtoFuture")
    _check_call("non-blocking call", out["later"], _seen(out["report"], "later_m", 0), lay, 8)


def test_worker_groups_keep_their_own_mesh_layouts():
    # Two groups register the same mesh name with different sizes and layouts:
    # A: 8 ranks, dp = rank // 2, collected by the odd ranks; B: 4 ranks, dp = rank % 2, collected by ranks 0, 1.
    layout_a = {"m": _layout(8, lambda r: r // 2, lambda r: r % 2 == 1)}
    layout_b = {"m": _layout(4, lambda r: r % 2, lambda r: r < 2)}
    out = run(SETUP + """
try:
    wa = make_group(ARGS["a"], 8)
    wb = make_group(ARGS["b"], 4)
    calls = []
    for tag, wg in (("A", wa), ("B", wb), ("A", wa), ("B", wb)):
        try:
            calls.append([tag, rows(wg.tag_m(batch(8)))])
        except Exception as e:
            calls.append([tag, {"error": "%s: %s" % (type(e).__name__, str(e)[:2000])}])
    info = {tag: {"dispatch": list(wg._dispatch_info.get("m", [])),
                  "collect": [bool(x) for x in wg._collect_info.get("m", [])]} for tag, wg in (("A", wa), ("B", wb))}
    emit(calls=calls, info=info, report={"A": wa.report(), "B": wb.report()})
finally:
    ray.shutdown()
""", {"dir": workdir(), "a": layout_a, "b": layout_b}, timeout=600)
    layouts = {"A": layout_a["m"], "B": layout_b["m"]}
    for tag, lay in layouts.items():
        got = out["info"][tag]
        assert got["dispatch"] == [dp for dp, _ in lay] and got["collect"] == [bool(c) for _, c in lay], (
            f"group {tag}: _dispatch_info['m'] {got['dispatch']}, _collect_info['m'] {got['collect']}; "
            f"want its own layout {[dp for dp, _ in lay]}, {[bool(c) for _, c in lay]}")
    nth = {"A": 0, "B": 0}
    for i, (tag, got) in enumerate(out["calls"]):
        assert "error" not in got, f"call {i + 1} on group {tag} raised: {got['error']}"
        _check_call(f"call {i + 1} on group {tag}", got, _seen(out["report"][tag], "tag_m", nth[tag]), layouts[tag], 8)
        nth[tag] += 1
