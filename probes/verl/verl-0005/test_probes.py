"""Probes for verl-0005 (TensorDicts, jagged nested tensors included, through the mesh dispatch).

The judge (this module) never imports verl, torch, tensordict or ray. Every probe draws its
scenario fresh (the mesh layout and world size, row counts and lengths, token values, labels,
non-tensor values, which calls are made and in what order, how much the data is edited) and
runs a driver in a child that sends back plain data (ids, nested rows as lists, labels,
devices, which rank produced which row, what every input and result holds after edits). The
judge computes what every value must be from the inputs it chose itself.

The dispatch probe starts Ray with CPU actors (use_gpu=False) whose mesh layout is given to them
as a per-rank (dp_rank, is_collect) list, so it needs no GPU; the other probes call the
tensordict helpers directly."""

from infradev_probe import fresh, run, workdir


def _rows(rng, n, lo=1, hi=6):
    """n jagged rows of random lengths and token values."""
    return [rng.integers(0, 10 ** 6, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def _offsets(rows):
    out = [0]
    for row in rows:
        out.append(out[-1] + len(row))
    return out


def _layout(rng, world, dp):
    """Per rank [dp_rank, is_collect]: one collecting rank per dp_rank, the collecting ranks
    ordered like their dp_ranks, every other rank in a random dp_rank."""
    collectors = sorted(int(c) for c in rng.choice(world, size=dp, replace=False))
    layout = [[int(rng.integers(dp)), False] for _ in range(world)]
    for d, r in enumerate(collectors):
        layout[r] = [d, True]
    return layout


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

# Ray starts no idle worker processes ahead of need: the sandbox caps the threads of the whole
# attempt, and every Ray worker process holds a few dozen.
os.environ["RAY_prestart_worker_first_driver"] = "0"
ray.init(num_cpus=64, num_gpus=0, include_dashboard=False, object_store_memory=1 << 30,
         _temp_dir=os.path.join(ARGS["dir"], "ray"))


@ray.remote
class MeshWorker(Worker):
    def __init__(self, layout, shift):
        super().__init__()
        self.seen = []
        self.shift = shift
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
        seq = jagged([[x + self.shift * (self.rank + 1) for x in r] for r in rows_of(data["seq"])])
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
    rng = fresh()
    world = int(rng.integers(3, 7))
    dp = int(rng.integers(2, min(4, world) + 1))
    layout = _layout(rng, world, dp)
    per = int(rng.integers(1, 4))
    n = dp * per
    rows = _rows(rng, n)
    labels = ["s%x" % int(rng.integers(1 << 32)) for _ in range(n)]
    ids = rng.permutation(10 ** 5)[:n].tolist()
    w = rng.integers(-10 ** 6, 10 ** 6, size=n).tolist()
    temp = float(rng.uniform(0.1, 3.0))
    shift = int(rng.integers(10 ** 6, 10 ** 7))
    out = run(DISPATCH_SETUP + """
try:
    pool = RayResourcePool([len(ARGS["layout"])], use_gpu=False, max_colocate_count=1)
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(
        cls=MeshWorker, layout=ARGS["layout"], shift=ARGS["shift"]))
    data = tu.get_tensordict({"ids": torch.tensor(ARGS["ids"]), "seq": jagged(ARGS["rows"]), "labels": ARGS["labels"]},
                             {"temp": ARGS["temp"]})
    extra = tu.get_tensordict({"ids": torch.tensor(ARGS["ids"]), "w": torch.tensor(ARGS["w"])})
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
""", {"dir": workdir(), "layout": layout, "rows": rows, "labels": labels, "ids": ids, "w": w, "temp": temp,
      "shift": shift}, timeout=600)
    assert "error" not in out, (
        f"calling a mesh-dispatched method with one TensorDict positionally and one by keyword raised: {out['error']}")
    assert len(out["seen"]) == world, f"{len(out['seen'])} ranks reported, want {world}"
    for r, (d, _) in enumerate(layout):
        want_idx = list(range(d * per, (d + 1) * per))
        calls = out["seen"][r]
        assert len(calls) == 1, f"rank {r} ran the method {len(calls)} times, want once"
        got = calls[0]
        assert got["type"] == "TensorDict" and got["extra_type"] == "TensorDict", (
            f"rank {r} received a {got['type']} and a {got['extra_type']}, want TensorDict shards")
        assert got["ids"] == [ids[i] for i in want_idx] and got["extra_ids"] == [ids[i] for i in want_idx], (
            f"rank {r} (dp_rank {d} of {dp}) received ids {got['ids']} and, by keyword, {got['extra_ids']}; "
            f"want rows {want_idx} of both")
        assert got["extra_w"] == [w[i] for i in want_idx], f"rank {r}: keyword shard holds {got['extra_w']}"
        assert got["seq"] == [rows[i] for i in want_idx], (
            f"rank {r}: nested rows {got['seq']}, want {[rows[i] for i in want_idx]}")
        assert got["labels"] == [labels[i] for i in want_idx], f"rank {r}: labels {got['labels']}"
        assert got["temp"] == temp, f"rank {r}: the non-tensor entry temp is {got['temp']}, want {temp}"
    res = out["out"]
    collector = {d: r for r, (d, c) in enumerate(layout) if c}
    by = [collector[i // per] for i in range(n)]
    assert res["type"] == "TensorDict" and res["batch"] == [n], (
        f"the collected result is a {res['type']} of batch size {res['batch']}, want a TensorDict of {n} rows")
    assert res["ids"] == ids and res["by"] == by, (
        f"collected ids {res['ids']} from ranks {res['by']}; want {ids} from the collecting ranks {by}")
    assert res["seq"] == [[x + shift * (by[i] + 1) for x in row] for i, row in enumerate(rows)], (
        f"collected nested rows {res['seq']} are not each collecting rank's rows in input order")
    assert res["labels"] == labels, f"collected labels {res['labels']}, want {labels}"
    assert res["temp"] == temp, f"collected temp {res['temp']}, want {temp}"


CONCAT = HELPERS + """
parts, res = [], {}
for k, p in enumerate(ARGS["parts"]):
    n = len(p["rows"])
    part = tu.get_tensordict({"ids": torch.tensor(p["ids"]), "x": torch.tensor(p["x"], dtype=torch.float32),
                              "seq": jagged(p["rows"]), "labels": p["labels"]},
                             {"temp": p["temp"]})
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
"""


def test_concatenated_tensordict_keeps_device_batch_and_layout():
    rng = fresh()
    parts = []
    for _ in range(int(rng.integers(2, 5))):
        n = int(rng.integers(1, 5))
        parts.append({"rows": _rows(rng, n), "ids": rng.integers(0, 10 ** 6, size=n).tolist(),
                      "x": rng.normal(size=(n, 3)).astype("float32").tolist(),
                      "labels": ["p%x" % int(rng.integers(1 << 32)) for _ in range(n)],
                      "temp": float(rng.uniform(0.1, 5.0))})
    out = run(CONCAT, {"parts": parts}, timeout=300)
    total = sum(len(p["rows"]) for p in parts)
    ids = [i for p in parts for i in p["ids"]]
    xs = [x for p in parts for x in p["x"]]
    seq = [row for p in parts for row in p["rows"]]
    labels = [s for p in parts for s in p["labels"]]
    for case in ("nested", "plain", "only_nested"):
        got = out[case]
        assert got["device"] == "cpu", (
            f"{case}: concat_tensordict of TensorDicts on device cpu returned one on device {got['device']}; "
            f"the result must keep the inputs' device")
        assert got["batch"] == [total], f"{case}: batch size {got['batch']}, want [{total}]"
    for case in ("nested", "plain"):
        got = out[case]
        assert got["ids"] == ids and got["x"] == xs, f"{case}: rows {got['ids']} / {got['x']}, want {ids} / {xs}"
        assert got["labels"] == labels, f"{case}: labels {got['labels']}, want {labels}"
        assert got["temp"] == parts[0]["temp"], f"{case}: temp {got['temp']}, want the first input's {parts[0]['temp']}"
    for case in ("nested", "only_nested"):
        got = out[case]
        assert got["seq_nested"] and got["seq_layout"] == "torch.jagged" and got["seq_contiguous"], (
            f"{case}: the concatenated nested entry is nested={got['seq_nested']}, layout {got['seq_layout']}, "
            f"contiguous={got['seq_contiguous']}; want a contiguous jagged nested tensor")
        assert got["seq"] == seq and got["seq_offsets"] == _offsets(seq), (
            f"{case}: nested rows {got['seq']} with offsets {got['seq_offsets']}; want {seq} with offsets "
            f"{_offsets(seq)}")
    assert sorted(out["plain"]["keys"]) == ["ids", "labels", "temp", "x"], f"plain: keys {out['plain']['keys']}"


NARROW = HELPERS + """
res = []
for call in ARGS["calls"]:
    def make(spec):
        if spec["kind"] == "narrow":
            dense = torch.tensor(spec["dense"])
            return torch.nested.narrow(dense, 1, torch.tensor(spec["starts"]), torch.tensor(spec["lengths"]),
                                       layout=torch.jagged)
        t = jagged(spec["rows"])
        if spec["kind"] == "chunk":
            return list(t.chunk(spec["chunks"]))
        return [t]

    try:
        ins = []
        for spec in call["inputs"]:
            m = make(spec)
            ins.extend(m if isinstance(m, list) else [m])
        if call["fn"] == "get_tensordict":
            td = tu.get_tensordict({"seq": ins[0], "ids": torch.arange(ins[0].shape[0])})
            res.append({"rows": rows_of(td["seq"])})
        else:
            joined = tu.concat_nested_tensors(ins)
            res.append({"rows": rows_of(joined), "offsets": joined.offsets().tolist()})
    except AssertionError:
        res.append({"error": "AssertionError"})
    except Exception as e:
        res.append({"error": "%s: %s" % (type(e).__name__, str(e)[:300])})
emit(calls=res)
"""


def _narrow_spec(rng):
    # torch treats a narrow() view as contiguous only when its rows lie back to back: here every row
    # is shorter than the dense width and the first one ends before the end of its dense row
    n, width = int(rng.integers(3, 6)), int(rng.integers(6, 12))
    lengths = rng.integers(1, width // 2 + 1, size=n)
    starts = [int(rng.integers(1, width - l)) for l in lengths]
    return {"kind": "narrow", "dense": rng.integers(0, 10 ** 6, size=(n, width)).tolist(), "starts": starts,
            "lengths": [int(l) for l in lengths]}


def test_non_contiguous_nested_tensors_are_refused():
    rng = fresh()
    kinds = ["get_tensordict-narrow", "concat-narrow-first", "concat-narrow-later", "concat-chunks"]
    kinds += [str(k) for k in rng.choice(kinds + ["get_tensordict-ok"], size=int(rng.integers(1, 4)))]
    kinds = [kinds[i] for i in rng.permutation(len(kinds))]
    calls, wants = [], []
    for kind in kinds:
        good = {"kind": "plain", "rows": _rows(rng, int(rng.integers(1, 5)))}
        if kind == "get_tensordict-narrow":
            calls.append({"fn": "get_tensordict", "inputs": [_narrow_spec(rng)]})
            wants.append(None)
        elif kind == "get_tensordict-ok":
            calls.append({"fn": "get_tensordict", "inputs": [good]})
            wants.append({"rows": good["rows"]})
        elif kind in ("concat-narrow-first", "concat-narrow-later"):
            ins = [good, {"kind": "plain", "rows": _rows(rng, int(rng.integers(1, 4)))}]
            ins.insert(0 if kind.endswith("first") else int(rng.integers(1, 3)), _narrow_spec(rng))
            calls.append({"fn": "concat", "inputs": ins})
            wants.append(None)
        else:
            # chunk() pieces of a jagged tensor are contiguous, and are concatenated
            rows = _rows(rng, int(rng.integers(2, 8)))
            more = _rows(rng, int(rng.integers(1, 3)))
            calls.append({"fn": "concat", "inputs": [{"kind": "chunk", "rows": rows, "chunks": int(rng.integers(2, 4))},
                                                     {"kind": "plain", "rows": more}]})
            wants.append({"rows": rows + more, "offsets": _offsets(rows + more)})
    out = run(NARROW, {"calls": calls}, timeout=300)["calls"]
    assert len(out) == len(calls), f"{len(out)} results for {len(calls)} calls"
    for i, (kind, got, want) in enumerate(zip(kinds, out, wants)):
        if want is None:
            assert got == {"error": "AssertionError"}, (
                f"call {i + 1} ({kind}): given a non-contiguous jagged nested tensor (a narrow() view of a dense "
                f"tensor), got {got}; want an AssertionError, never a result built from the view's buffer")
        else:
            assert got == want, f"call {i + 1} ({kind}): got {got}, want {want}"


OWN = HELPERS + """
res = {}


def make(p):
    return tu.get_tensordict({"ids": torch.tensor(p["ids"]), "seq": jagged(p["rows"])})


for name, case in ARGS["cases"].items():
    nested = case["nested"]
    inputs = [make(p) for p in case["parts"]]
    if not nested:
        inputs = [td.exclude("seq") for td in inputs]
    out = tu.concat_tensordict(inputs)
    # edit the result in place: the inputs must not see it
    out["ids"].add_(ARGS["a"])
    if nested:
        out["seq"].values().add_(ARGS["a"])
    after_result_edit = [{"ids": td["ids"].tolist(), "seq": rows_of(td["seq"]) if nested else None} for td in inputs]
    # edit the inputs in place: the result must not see it
    for td in inputs:
        td["ids"].add_(ARGS["b"])
        if nested:
            td["seq"].values().add_(ARGS["b"])
    res[name] = {"inputs": after_result_edit, "result_ids": out["ids"].tolist(),
                 "result_seq": rows_of(out["seq"]) if nested else None}
single = jagged(ARGS["single"])
joined = tu.concat_nested_tensors([single])
joined.values().add_(ARGS["a"])
single.values().add_(ARGS["b"])
res["nested_single"] = {"input": rows_of(single), "result": rows_of(joined)}
emit(**res)
"""


def test_concatenation_results_own_their_data():
    rng = fresh()

    def part():
        n = int(rng.integers(1, 5))
        return {"ids": rng.integers(0, 10 ** 6, size=n).tolist(), "rows": _rows(rng, n)}

    cases = {"one_nested": {"nested": True, "parts": [part()]},
             "many_nested": {"nested": True, "parts": [part() for _ in range(int(rng.integers(2, 4)))]},
             "one_plain": {"nested": False, "parts": [part()]},
             "many_plain": {"nested": False, "parts": [part() for _ in range(int(rng.integers(2, 4)))]}}
    a, b = int(rng.integers(1000, 10 ** 6)), int(rng.integers(10 ** 6, 10 ** 7))
    single = _rows(rng, int(rng.integers(1, 5)))
    out = run(OWN, {"cases": cases, "a": a, "b": b, "single": single}, timeout=300)
    for name, case in cases.items():
        got = out[name]
        nested = case["nested"]
        for k, (after, p) in enumerate(zip(got["inputs"], case["parts"], strict=True)):
            want = {"ids": p["ids"], "seq": p["rows"] if nested else None}
            assert after == want, (
                f"{name}: editing the result of concat_tensordict in place (+{a}) changed input {k} to {after}, "
                f"want it unchanged, {want}; the result must hold its own copy of the data")
        want_ids = [i + a for p in case["parts"] for i in p["ids"]]
        assert got["result_ids"] == want_ids, (
            f"{name}: after +{a} on the result and +{b} on the inputs, the result's ids are {got['result_ids']}, "
            f"want {want_ids}")
        if nested:
            want = [[x + a for x in row] for p in case["parts"] for row in p["rows"]]
            assert got["result_seq"] == want, (
                f"{name}: the result's nested rows are {got['result_seq']} after editing the inputs; want {want}")
    got = out["nested_single"]
    assert got["input"] == [[x + b for x in r] for r in single], (
        f"editing the result of concat_nested_tensors([t]) (+{a}) changed t: {got['input']}; the result must be a "
        f"new nested tensor")
    assert got["result"] == [[x + a for x in r] for r in single], (
        f"editing t (+{b}) after concat_nested_tensors([t]) changed the result: {got['result']}")
