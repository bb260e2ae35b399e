"""Probes for verl-0005 (TensorDicts, jagged nested tensors included, through the mesh dispatch).

The judge (this module) never imports verl, torch, tensordict or ray. Each probe runs a driver in
a child process and checks the plain data it sends back (ids, nested rows as lists, labels,
devices, which rank produced which row) against what the judge computes from the inputs it
chose itself.

The dispatch probe starts Ray with CPU actors (use_gpu=False) whose mesh layout is given to them
as a per-rank (dp_rank, is_collect) list, so it needs no GPU; the other probes call the
tensordict helpers directly."""

from infradev_probe import run, workdir

# Rows of a jagged batch: row i has LENGTHS[i] tokens, token j of row i is 10 * i + j.
LENGTHS = [3, 1, 4, 2, 5, 1, 2, 3]


def _rows(lengths, start=0):
    return [[10 * (start + i) + j for j in range(n)] for i, n in enumerate(lengths)]


HELPERS = """
import torch
from tensordict import TensorDict

import verl.utils.tensordict_utils as tu


def jagged(rows, dtype=torch.int64):
    return torch.nested.as_nested_tensor([torch.tensor(r, dtype=dtype) for r in rows], layout=torch.jagged)


def rows_of(nt):
    return [t.tolist() for t in nt.unbind()]


def labels_of(v):
    if hasattr(v, "tolist"):
        v = v.tolist()
    return [str(x) for x in v]
"""

DISPATCH_SETUP = HELPERS + """
import os
import ray

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
        dp, collect = layout[self.rank]
        self._register_dispatch_collect_info("m", dp_rank=int(dp), is_collect=bool(collect))

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="m"))
    def tag(self, data, extra):
        self.seen.append({
            "type": type(data).__name__,
            "ids": data["ids"].tolist(),
            "seq": rows_of(data["seq"]),
            "labels": labels_of(data["labels"]),
            "temp": float(data["temp"]),
            "extra_type": type(extra).__name__,
            "extra_ids": extra["ids"].tolist(),
            "extra_w": extra["w"].tolist(),
        })
        seq = jagged([[x + 1000 * self.rank for x in r] for r in rows_of(data["seq"])])
        n = data["ids"].shape[0]
        return tu.get_tensordict(
            {"ids": data["ids"].clone(), "by": torch.full((n,), self.rank), "seq": seq,
             "labels": labels_of(data["labels"])},
            {"temp": float(data["temp"])},
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self):
        return self.seen
"""


def test_tensordicts_dispatch_and_collect_by_mesh():
    # 8 ranks, dp = rank % 4 (interleaved), collected by ranks 4-7 (whose dp ranks are 0-3).
    layout = [[r % 4, r >= 4] for r in range(8)]
    out = run(DISPATCH_SETUP + """
try:
    pool = RayResourcePool([8], use_gpu=False, max_colocate_count=1)
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=MeshWorker, layout=ARGS["layout"]))
    n = len(ARGS["rows"])
    data = tu.get_tensordict({"ids": torch.arange(n), "seq": jagged(ARGS["rows"]), "labels": ARGS["labels"]},
                             {"temp": 0.75})
    extra = tu.get_tensordict({"ids": torch.arange(n), "w": 100 * torch.arange(n)})
    res = {}
    try:
        got = wg.tag(data, extra=extra)
        res["out"] = {"type": type(got).__name__, "ids": got["ids"].tolist(), "by": got["by"].tolist(),
                      "seq": rows_of(got["seq"]), "labels": labels_of(got["labels"]),
                      "temp": float(got["temp"]), "batch": list(got.batch_size)}
    except Exception as e:
        res["error"] = "%s: %s" % (type(e).__name__, str(e)[:3000])
    res["seen"] = wg.report()
    emit(**res)
finally:
    ray.shutdown()
""", {"dir": workdir(), "layout": layout, "rows": _rows(LENGTHS), "labels": [f"s{i}" for i in range(8)]},
        timeout=600)
    assert "error" not in out, (
        f"calling a mesh-dispatched method with one TensorDict positionally and one by keyword raised: {out['error']}")
    rows = _rows(LENGTHS)
    for r, (dp, _) in enumerate(layout):
        want_idx = [2 * dp, 2 * dp + 1]
        calls = out["seen"][r]
        assert len(calls) == 1, f"rank {r} ran the method {len(calls)} times, want once"
        got = calls[0]
        assert got["type"] == "TensorDict" and got["extra_type"] == "TensorDict", (
            f"rank {r} received a {got['type']} and a {got['extra_type']}, want TensorDict shards")
        assert got["ids"] == want_idx and got["extra_ids"] == want_idx, (
            f"rank {r} (dp_rank {dp} of 4) received rows {got['ids']} and, by keyword, rows {got['extra_ids']}; "
            f"want shard {want_idx} of both")
        assert got["extra_w"] == [100 * i for i in want_idx], f"rank {r}: keyword shard holds {got['extra_w']}"
        assert got["seq"] == [rows[i] for i in want_idx], (
            f"rank {r}: nested rows {got['seq']}, want {[rows[i] for i in want_idx]}")
        assert got["labels"] == [f"s{i}" for i in want_idx], f"rank {r}: labels {got['labels']}"
        assert got["temp"] == 0.75, f"rank {r}: the non-tensor entry temp is {got['temp']}, want 0.75"
    res = out["out"]
    collector = {dp: r for r, (dp, c) in enumerate(layout) if c}
    by = [collector[i // 2] for i in range(8)]
    assert res["type"] == "TensorDict" and res["batch"] == [8], (
        f"the collected result is a {res['type']} of batch size {res['batch']}, want a TensorDict of 8 rows")
    assert res["ids"] == list(range(8)) and res["by"] == by, (
        f"collected rows {res['ids']} from ranks {res['by']}; want rows 0-7 from the collecting ranks {by}")
    assert res["seq"] == [[x + 1000 * by[i] for x in row] for i, row in enumerate(rows)], (
        f"collected nested rows {res['seq']} are not each collecting rank's rows in input order")
    assert res["labels"] == [f"s{i}" for i in range(8)], f"collected labels {res['labels']}"
    assert res["temp"] == 0.75, f"collected temp {res['temp']}"


def test_concatenated_tensordict_keeps_device_batch_and_layout():
    out = run(HELPERS + """
parts, res = [], {}
for k, rows in enumerate(ARGS["parts"]):
    n = len(rows)
    part = tu.get_tensordict({"ids": torch.arange(n) + 100 * k, "x": torch.full((n, 3), float(k)),
                              "seq": jagged(rows), "labels": ["p%d_%d" % (k, i) for i in range(n)]},
                             {"temp": 0.5 + k})
    parts.append(part.to("cpu"))


def describe(td):
    d = {"device": str(td.device), "batch": list(td.batch_size), "keys": sorted(td.keys())}
    if "ids" in td.keys():
        d["ids"] = td["ids"].tolist()
    if "x" in td.keys():
        d["x"] = td["x"].tolist()
    if "seq" in td.keys():
        s = td["seq"]
        d["seq"] = rows_of(s)
        d["seq_nested"] = bool(s.is_nested)
        d["seq_layout"] = str(s.layout)
        d["seq_contiguous"] = bool(s.is_contiguous())
        d["seq_offsets"] = s.offsets().tolist()
    if "labels" in td.keys():
        d["labels"] = labels_of(td["labels"])
    if "temp" in td.keys():
        d["temp"] = float(td["temp"])
    return d


res["nested"] = describe(tu.concat_tensordict(parts))
res["plain"] = describe(tu.concat_tensordict([p.exclude("seq") for p in parts]))
res["only_nested"] = describe(tu.concat_tensordict([TensorDict({"seq": p["seq"]}, batch_size=p.batch_size, device="cpu")
                                                    for p in parts]))
emit(**res)
""", {"parts": [_rows([2, 1, 3]), _rows([4], 3), _rows([1, 2], 4)]}, timeout=300)
    parts = [_rows([2, 1, 3]), _rows([4], 3), _rows([1, 2], 4)]
    sizes = [len(p) for p in parts]
    ids = [100 * k + i for k, n in enumerate(sizes) for i in range(n)]
    xs = [[float(k)] * 3 for k, n in enumerate(sizes) for _ in range(n)]
    seq = [row for p in parts for row in p]
    offsets = [0]
    for row in seq:
        offsets.append(offsets[-1] + len(row))
    labels = [f"p{k}_{i}" for k, n in enumerate(sizes) for i in range(n)]
    for case in ("nested", "plain", "only_nested"):
        got = out[case]
        assert got["device"] == "cpu", (
            f"{case}: concat_tensordict of TensorDicts on device cpu returned one on device {got['device']}; "
            f"the result must keep the inputs' device")
        assert got["batch"] == [sum(sizes)], f"{case}: batch size {got['batch']}, want [{sum(sizes)}]"
    for case in ("nested", "plain"):
        got = out[case]
        assert got["ids"] == ids and got["x"] == xs, f"{case}: rows {got['ids']} / {got['x']}, want {ids} / {xs}"
        assert got["labels"] == labels, f"{case}: labels {got['labels']}, want {labels}"
        assert got["temp"] == 0.5, f"{case}: temp {got['temp']}, want the first input's 0.5"
    for case in ("nested", "only_nested"):
        got = out[case]
        assert got["seq_nested"] and got["seq_layout"] == "torch.jagged" and got["seq_contiguous"], (
            f"{case}: the concatenated nested entry is nested={got['seq_nested']}, layout {got['seq_layout']}, "
            f"contiguous={got['seq_contiguous']}; want a contiguous jagged nested tensor")
        assert got["seq"] == seq and got["seq_offsets"] == offsets, (
            f"{case}: nested rows {got['seq']} with offsets {got['seq_offsets']}; want {seq} with offsets {offsets}")
    assert "seq" not in out["plain"]["keys"], f"plain: keys {out['plain']['keys']}"


def test_non_contiguous_nested_tensors_are_refused():
    out = run(HELPERS + """
res = {}
dense = torch.arange(40).reshape(4, 10)
starts = torch.tensor([0, 3, 1, 5])
lengths = torch.tensor([2, 4, 1, 3])
narrow = torch.nested.narrow(dense, 1, starts, lengths, layout=torch.jagged)
res["narrow_contiguous"] = bool(narrow.is_contiguous())
good = jagged(ARGS["rows"])
halves = list(good.chunk(2))


def attempt(name, fn):
    try:
        fn()
        res[name] = "accepted"
    except AssertionError:
        res[name] = "AssertionError"
    except Exception as e:
        res[name] = "%s: %s" % (type(e).__name__, str(e)[:300])


attempt("get_tensordict", lambda: tu.get_tensordict({"seq": narrow, "ids": torch.arange(4)}))
attempt("concat_first", lambda: tu.concat_nested_tensors([narrow, good]))
attempt("concat_second", lambda: tu.concat_nested_tensors([good, narrow]))
joined = tu.concat_nested_tensors(halves + [jagged([[7, 8, 9]])])
res["joined"] = rows_of(joined)
res["joined_offsets"] = joined.offsets().tolist()
emit(**res)
""", {"rows": _rows(LENGTHS)}, timeout=300)
    assert out["narrow_contiguous"] is False, "the probe's narrowed nested tensor should not be contiguous"
    for name in ("get_tensordict", "concat_first", "concat_second"):
        assert out[name] == "AssertionError", (
            f"{name} given a non-contiguous jagged nested tensor (a narrow() view of a dense tensor): "
            f"{out[name]}; want an AssertionError, never a result built from the view's underlying buffer")
    rows = _rows(LENGTHS) + [[7, 8, 9]]
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + len(row))
    assert out["joined"] == rows and out["joined_offsets"] == offsets, (
        f"concat_nested_tensors of two chunk() halves and one more row gave {out['joined']} "
        f"(offsets {out['joined_offsets']}); want {rows} (offsets {offsets})")


def test_concatenation_results_own_their_data():
    out = run(HELPERS + """
res = {}


def make(k, rows):
    n = len(rows)
    return tu.get_tensordict({"ids": torch.arange(n) + 100 * k, "seq": jagged(rows)})


def case(name, inputs, nested=True):
    keep = [(td["ids"].clone(), [r[:] for r in rows_of(td["seq"])]) for td in inputs]
    if not nested:
        inputs = [td.exclude("seq") for td in inputs]
    out = tu.concat_tensordict(inputs)
    want_ids = out["ids"].clone()
    # edit the result in place: the inputs must not see it
    out["ids"].add_(1000)
    if nested:
        out["seq"].values().add_(1000)
    after_in = [(td["ids"].tolist(), rows_of(td["seq"]) if nested else None) for td in inputs]
    # edit the inputs in place: the result must not see it
    for td in inputs:
        td["ids"].add_(7)
        if nested:
            td["seq"].values().add_(7)
    res[name] = {
        "inputs_after_result_edit": after_in,
        "inputs_before": [(i.tolist(), s if nested else None) for i, s in keep],
        "result_ids": out["ids"].tolist(),
        "result_want_ids": (want_ids + 1000).tolist(),
        "result_seq": rows_of(out["seq"]) if nested else None,
    }


case("one_nested", [make(0, ARGS["a"])])
case("two_nested", [make(0, ARGS["a"]), make(1, ARGS["b"])])
case("one_plain", [make(0, ARGS["a"])], nested=False)
single = jagged(ARGS["a"])
joined = tu.concat_nested_tensors([single])
joined.values().add_(1000)
res["nested_single_input_after"] = rows_of(single)
emit(**res)
""", {"a": _rows([2, 3]), "b": _rows([1, 4], 2)}, timeout=300)
    a, b = _rows([2, 3]), _rows([1, 4], 2)
    for name, parts in (("one_nested", [a]), ("two_nested", [a, b]), ("one_plain", [a])):
        got = out[name]
        for k, (after, before) in enumerate(zip(got["inputs_after_result_edit"], got["inputs_before"])):
            assert after[0] == before[0] and after[1] == before[1], (
                f"{name}: editing the result of concat_tensordict in place changed input {k} from {before} to "
                f"{after}; the result must hold its own copy of the data")
        assert got["result_ids"] == got["result_want_ids"], (
            f"{name}: editing the inputs after concat_tensordict changed the result's ids to {got['result_ids']}")
        if got["result_seq"] is not None:
            want = [[x + 1000 for x in row] for p in parts for row in p]
            assert got["result_seq"] == want, (
                f"{name}: the result's nested rows are {got['result_seq']} after editing the inputs; want {want}")
    assert out["nested_single_input_after"] == a, (
        f"editing the result of concat_nested_tensors([t]) changed t to {out['nested_single_input_after']}; "
        f"the result must be a new nested tensor")
