"""Probes for verl-0002 (TensorDict helpers and DataProto.to_tensordict).

The judge (this module) never imports verl: each probe builds batches in a child process,
runs the helpers there and checks the plain values it sends back against its own."""

from infradev_probe import run

# In the child: verl, the helpers, and `plain`, which turns whatever a TensorDict hands back
# into JSON values without hiding what it was (a tensor, a numpy array or scalar stays tagged,
# so it never compares equal to the plain Python value the judge expects).
SETUP = """
import numpy as np
import torch
from verl import DataProto
from verl.utils import tensordict_utils as tu


def plain(v):
    if isinstance(v, torch.Tensor):
        return {"tensor": v.tolist()}
    if isinstance(v, np.ndarray):
        return {"ndarray": v.tolist()}
    if isinstance(v, np.generic):
        return {"numpy": v.item()}
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return {"other": type(v).__name__, "repr": repr(v)[:200]}


def raises(fn):
    try:
        fn()
    except Exception as e:
        return type(e).__name__
    return None
"""

LABELS = list("abcdef")
INFO = [{"i": i, "tag": "t%d" % (i % 2)} for i in range(6)]
META = {"name": "run-7", "stop": [7, 8, 9, 10, 11, 12], "cfg": {"top_p": 0.9, "n": 2}, "step": 3}

# A DataProto with two tensors, two per-sample columns and four batch-wide values, one of them
# a list as long as the batch.
DATAPROTO = SETUP + """
LABELS = list("abcdef")
INFO = [{"i": i, "tag": "t%d" % (i % 2)} for i in range(6)]
META = {"name": "run-7", "stop": [7, 8, 9, 10, 11, 12], "cfg": {"top_p": 0.9, "n": 2}, "step": 3}


def make_dp():
    return DataProto.from_dict(
        tensors={"obs": torch.arange(12).reshape(6, 2), "mask": torch.ones(6, 3)},
        non_tensors={"labels": list(LABELS), "info": [dict(d) for d in INFO]},
        meta_info={k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                   for k, v in META.items()},
    )
"""


def test_to_tensordict_contents():
    out = run(DATAPROTO + """
td = make_dp().to_tensordict()
res = {"batch_size": list(td.batch_size), "keys": sorted(td.keys()),
       "obs": td["obs"], "mask": td["mask"]}
res["whole"] = {k: plain(td[k]) for k in ("labels", "info", "name", "stop", "cfg", "step")}
res["rows"] = [{k: plain(td[i][k]) for k in ("labels", "info", "name", "stop", "cfg", "step")}
               for i in range(6)]
res["rows_obs"] = [plain(td[i]["obs"]) for i in range(6)]
pick = td[torch.tensor([4, 0, 2])]
res["pick"] = {"obs": plain(pick["obs"]), "labels": plain(pick["labels"]),
               "info": plain(pick["info"]), "stop": plain(pick["stop"]), "name": plain(pick["name"])}
part = td[1:4]
res["slice"] = {"labels": plain(part["labels"]), "stop": plain(part["stop"]),
                "rows": [plain(part[i]["labels"]) for i in range(3)]}
clash_nt = DataProto.from_dict(tensors={"x": torch.zeros(3)}, non_tensors={"x": ["a", "b", "c"]})
clash_meta = DataProto.from_dict(tensors={"x": torch.zeros(3)}, non_tensors={"y": ["a", "b", "c"]},
                                 meta_info={"y": 1})
res["clash_nt"] = raises(clash_nt.to_tensordict)
res["clash_meta"] = raises(clash_meta.to_tensordict)
emit(**res)
""")
    assert out["batch_size"] == [6], f"to_tensordict(): batch_size {out['batch_size']}, want [6]"
    want_keys = sorted(["obs", "mask", "labels", "info", "name", "stop", "cfg", "step"])
    assert out["keys"] == want_keys, f"to_tensordict(): keys {out['keys']}, want {want_keys}"
    assert out["obs"].tolist() == [[2 * i, 2 * i + 1] for i in range(6)], f"obs is {out['obs'].tolist()}"
    assert out["mask"].tolist() == [[1.0] * 3] * 6, f"mask is {out['mask'].tolist()}"
    want_whole = {"labels": LABELS, "info": INFO, **META}
    for k, want in want_whole.items():
        assert out["whole"][k] == want, f"to_tensordict()[{k!r}] is {out['whole'][k]!r}, want {want!r}"
    for i, row in enumerate(out["rows"]):
        want = {"labels": LABELS[i], "info": INFO[i], **META}
        for k, w in want.items():
            kind = "a per-sample value" if k in ("labels", "info") else "a batch-wide (meta_info) value, whole"
            assert row[k] == w, f"to_tensordict()[{i}][{k!r}] is {row[k]!r}, want {w!r} ({kind})"
        assert out["rows_obs"][i] == {"tensor": [2 * i, 2 * i + 1]}, f"to_tensordict()[{i}]['obs'] is {out['rows_obs'][i]}"
    pick = out["pick"]
    assert pick["obs"] == {"tensor": [[8, 9], [0, 1], [4, 5]]}, f"td[[4, 0, 2]]['obs'] is {pick['obs']}"
    assert pick["labels"] == ["e", "a", "c"], f"td[[4, 0, 2]]['labels'] is {pick['labels']!r}, want ['e', 'a', 'c']"
    assert pick["info"] == [INFO[4], INFO[0], INFO[2]], f"td[[4, 0, 2]]['info'] is {pick['info']!r}"
    assert pick["stop"] == META["stop"] and pick["name"] == META["name"], (
        f"td[[4, 0, 2]] batch-wide values: stop {pick['stop']!r}, name {pick['name']!r}; want them whole")
    sl = out["slice"]
    assert sl["labels"] == ["b", "c", "d"] and sl["rows"] == ["b", "c", "d"], f"td[1:4]['labels'] is {sl}"
    assert sl["stop"] == META["stop"], f"td[1:4]['stop'] is {sl['stop']!r}, want the whole list {META['stop']}"
    assert out["clash_nt"] == "AssertionError", (
        f"a name in both batch and non_tensor_batch: to_tensordict raised {out['clash_nt']}, want AssertionError")
    assert out["clash_meta"] == "AssertionError", (
        f"a meta_info name that is also a per-sample name: to_tensordict raised {out['clash_meta']}, want AssertionError")


def test_tensordict_layout():
    out = run(DATAPROTO + """
from tensordict import NonTensorData, NonTensorStack


def kind(td, k):
    v = td.get(k)
    if isinstance(v, NonTensorStack):
        return "stack"
    if isinstance(v, NonTensorData):
        return "data"
    if isinstance(v, torch.Tensor):
        return "tensor"
    return type(v).__name__


res = {}
td = make_dp().to_tensordict()
res["dp"] = {k: kind(td, k) for k in td.keys()}
g = tu.get_tensordict({"obs": torch.zeros(3, 2), "labels": ["x", "y", "z"]},
                      {"cfg": {"a": 1}, "ids": [4, 5, 6], "n": 2})
res["get"] = {k: kind(g, k) for k in g.keys()}
res["get_batch"] = list(g.batch_size)
res["lists_only_batch"] = list(tu.get_tensordict({"labels": ["x", "y"]}).batch_size)
res["meta_only_batch"] = list(tu.get_tensordict({}, {"info": "x"}).batch_size)
res["tensor_items"] = raises(lambda: tu.get_tensordict({"x": [torch.zeros(2), torch.ones(2), torch.zeros(2)]}))
res["lengths"] = raises(lambda: tu.get_tensordict({"x": torch.zeros(3), "y": ["a", "b"]}))
res["clash"] = raises(lambda: tu.get_tensordict({"x": torch.zeros(3)}, {"x": 1}))
names = ["get_tensordict", "assign_non_tensor_data", "assign_non_tensor_dict", "union_tensor_dict",
         "make_iterator", "assert_tensordict_eq", "pop", "pad_to_divisor", "unpad"]
res["callables"] = sorted(n for n in names if callable(getattr(tu, n, None)))
res["module"] = tu.__name__
emit(**res)
""")
    want_dp = {"obs": "tensor", "mask": "tensor", "labels": "stack", "info": "stack",
               "name": "data", "stop": "data", "cfg": "data", "step": "data"}
    assert out["dp"] == want_dp, (
        f"to_tensordict() stores {out['dp']}; want tensors as tensors, non_tensor_batch columns as "
        f"NonTensorStack (stack) and meta_info items as NonTensorData (data): {want_dp}")
    want_get = {"obs": "tensor", "labels": "stack", "cfg": "data", "ids": "data", "n": "data"}
    assert out["get"] == want_get, f"get_tensordict stores {out['get']}, want {want_get}"
    assert out["get_batch"] == [3], f"get_tensordict: batch_size {out['get_batch']}, want [3]"
    assert out["lists_only_batch"] == [2], f"get_tensordict with lists only: batch_size {out['lists_only_batch']}, want [2]"
    assert out["meta_only_batch"] == [], (
        f"get_tensordict with no per-sample entry: batch_size {out['meta_only_batch']}, want [] (torch.Size([]))")
    for case, what in (("tensor_items", "a list of tensors"), ("lengths", "entries of different lengths"),
                       ("clash", "a name in both dicts")):
        assert out[case] == "AssertionError", f"get_tensordict with {what} raised {out[case]}, want AssertionError"
    assert out["module"] == "verl.utils.tensordict_utils"
    assert len(out["callables"]) == 9, f"verl.utils.tensordict_utils defines only {out['callables']}"


def test_conversion_shares_tensors_and_leaves_inputs_alone():
    out = run(DATAPROTO + """
res = {}
dp = make_dp()
before = {"batch": sorted(dp.batch.keys()), "non_tensor": {k: plain(v.tolist()) for k, v in dp.non_tensor_batch.items()},
          "meta": plain(dp.meta_info)}
td = dp.to_tensordict()
td["obs"][0, 0] = 100
td["mask"][5, 2] = -1.0
after_conv = {"batch": sorted(dp.batch.keys()), "non_tensor": {k: plain(v.tolist()) for k, v in dp.non_tensor_batch.items()},
              "meta": plain(dp.meta_info)}
td["extra"] = torch.zeros(6)
td.pop("labels")
td.pop("name")
after_edit = {"batch": sorted(dp.batch.keys()), "non_tensor": sorted(dp.non_tensor_batch.keys()),
              "meta": sorted(dp.meta_info.keys())}
res.update(before=before, after_conv=after_conv, after_edit=after_edit,
           dp_obs=dp.batch["obs"], dp_mask=dp.batch["mask"])

t = torch.zeros(4)
g = tu.get_tensordict({"t": t, "labels": ["a", "b", "c", "d"]}, {"cfg": {"k": 1}})
g["t"][1] = 5.0
res["given"] = t

data = tu.get_tensordict({"obs": torch.arange(10).reshape(5, 2), "labels": list("vwxyz")}, {"info": "keep"})
padded, pad = tu.pad_to_divisor(data, 4)
res["pad"] = {"size": pad, "len": len(padded), "obs": padded["obs"], "labels": plain(padded["labels"]),
              "info": plain(padded["info"])}
res["input_after_pad"] = {"len": len(data), "obs": data["obs"], "labels": plain(data["labels"])}
back = tu.unpad(padded, pad)
res["unpad"] = {"len": len(back), "obs": back["obs"], "labels": plain(back["labels"]), "info": plain(back["info"])}
same, zero = tu.pad_to_divisor(data, 5)
back0 = tu.unpad(same, zero)
res["pad0"] = {"size": zero, "len": len(back0), "obs": back0["obs"], "labels": plain(back0["labels"])}
emit(**res)
""")
    b, c, e = out["before"], out["after_conv"], out["after_edit"]
    assert b == c, f"to_tensordict() changed the DataProto: before {b}, after {c}"
    want_obs = [[2 * i, 2 * i + 1] for i in range(6)]
    want_obs[0][0] = 100
    assert out["dp_obs"].tolist() == want_obs and out["dp_mask"][5, 2] == -1.0, (
        "writes into the tensors of to_tensordict()'s result are not seen in the DataProto's batch: "
        f"obs {out['dp_obs'].tolist()}, mask[5, 2] {out['dp_mask'][5, 2]}; the conversion must not copy tensors")
    want_edit = {"batch": ["mask", "obs"], "non_tensor": ["info", "labels"], "meta": sorted(META)}
    assert e == want_edit, f"adding and removing keys in to_tensordict()'s result changed the DataProto: {e}, want {want_edit}"
    assert out["given"].tolist() == [0.0, 5.0, 0.0, 0.0], (
        f"get_tensordict copied its tensor: a write through the result left the input at {out['given'].tolist()}")
    p = out["pad"]
    rows = [0, 1, 2, 3, 4, 0, 1, 2]
    assert p["size"] == 3 and p["len"] == 8, f"pad_to_divisor(5 samples, 4): pad_size {p['size']}, length {p['len']}"
    assert p["obs"].tolist() == [[2 * r, 2 * r + 1] for r in rows], f"padded obs {p['obs'].tolist()}"
    assert p["labels"] == ["vwxyz"[r] for r in rows] and p["info"] == "keep", f"padded labels {p['labels']}, info {p['info']}"
    i = out["input_after_pad"]
    assert i["len"] == 5 and i["obs"].tolist() == [[2 * r, 2 * r + 1] for r in range(5)] and i["labels"] == list("vwxyz"), (
        f"pad_to_divisor modified its input: {i}")
    u = out["unpad"]
    assert u["len"] == 5 and u["obs"].tolist() == [[2 * r, 2 * r + 1] for r in range(5)], f"unpad gave {u}"
    assert u["labels"] == list("vwxyz") and u["info"] == "keep", f"unpad gave labels {u['labels']}, info {u['info']}"
    z = out["pad0"]
    assert z["size"] == 0 and z["len"] == 5 and z["labels"] == list("vwxyz"), (
        f"pad_to_divisor(5 samples, 5) then unpad: pad_size {z['size']}, length {z['len']}, labels {z['labels']}")


def test_union_merges_in_place_and_compares_values():
    out = run(SETUP + """
res = {}
obs = torch.arange(8).reshape(4, 2)
a = tu.get_tensordict({"obs": obs, "labels": ["p", "q", "r", "s"]}, {"cfg": {"top_p": 0.9}})
b = tu.get_tensordict({"obs": obs.clone(), "rew": torch.tensor([0.5, 1.5, 2.5, 3.5]), "labels": ["p", "q", "r", "s"],
                       "tags": ["t0", "t1", "t2", "t3"]}, {"cfg": {"top_p": 0.9}})
try:
    r = tu.union_tensor_dict(a, b)
    res["error"] = None
    res["returned_first"] = r is a
    res["keys"] = sorted(a.keys())
    res["rew"] = a["rew"] if "rew" in a.keys() else None
    res["tags"] = plain(a["tags"]) if "tags" in a.keys() else None
    res["row2"] = plain(a[2]["tags"]) if "tags" in a.keys() else None
    res["b_keys"] = sorted(b.keys())
except Exception as e:
    res["error"] = "%s: %s" % (type(e).__name__, e)


def fresh():
    return tu.get_tensordict({"obs": torch.arange(8).reshape(4, 2), "labels": ["p", "q", "r", "s"]}, {"cfg": {"top_p": 0.9}})


res["tensor_conflict"] = raises(lambda: tu.union_tensor_dict(fresh(), tu.get_tensordict({"obs": torch.arange(8).reshape(4, 2) + 1})))
res["list_conflict"] = raises(lambda: tu.union_tensor_dict(fresh(), tu.get_tensordict({"labels": ["p", "q", "r", "x"]})))
res["meta_conflict"] = raises(lambda: tu.union_tensor_dict(fresh(), tu.get_tensordict({"obs": torch.arange(8).reshape(4, 2)}, {"cfg": {"top_p": 0.5}})))
res["batch_mismatch"] = raises(lambda: tu.union_tensor_dict(fresh(), tu.get_tensordict({"z": torch.zeros(5)})))
res["batchless"] = raises(lambda: tu.union_tensor_dict(fresh(), tu.get_tensordict({}, {"cfg": {"top_p": 0.9}})))
emit(**res)
""")
    assert out["error"] is None, (
        f"union_tensor_dict refused two TensorDicts whose shared keys hold equal values (obs a distinct tensor "
        f"with the same values): {out['error']}")
    assert out["returned_first"] is True, "union_tensor_dict did not return tensor_dict1 itself"
    want = ["cfg", "labels", "obs", "rew", "tags"]
    assert out["keys"] == want, f"after union_tensor_dict(a, b), a holds {out['keys']}, want {want} (merged in place)"
    assert out["rew"] is not None and out["rew"].tolist() == [0.5, 1.5, 2.5, 3.5], f"a['rew'] is {out['rew']}"
    assert out["tags"] == ["t0", "t1", "t2", "t3"] and out["row2"] == "t2", (
        f"a['tags'] is {out['tags']!r} (a[2]['tags'] {out['row2']!r}), want the per-sample list ['t0', 't1', 't2', 't3']")
    assert out["b_keys"] == ["cfg", "labels", "obs", "rew", "tags"], f"union_tensor_dict changed tensor_dict2: {out['b_keys']}"
    for case, what in (("tensor_conflict", "tensors with different values"),
                       ("list_conflict", "per-sample lists that differ"),
                       ("meta_conflict", "batch-wide values that differ"),
                       ("batch_mismatch", "different batch sizes"),
                       ("batchless", "a TensorDict without batch dimension (batch-wide values only)")):
        assert out[case] == "AssertionError", f"union_tensor_dict with {what} raised {out[case]}, want AssertionError"


def test_make_iterator_epochs_and_seed():
    out = run(SETUP + """
res = {}
ds = tu.get_tensordict({"idx": torch.arange(8), "labels": ["s%d" % i for i in range(8)]}, {"cfg": {"lr": 0.1}})


def collect(**kw):
    batches = []
    for b in tu.make_iterator(ds, **kw):
        batches.append({"idx": b["idx"].tolist(), "labels": plain(b["labels"]), "cfg": plain(b["cfg"]),
                        "size": list(b.batch_size)})
    return batches


res["seeded"] = collect(mini_batch_size=2, epochs=3, seed=7, dataloader_kwargs={"shuffle": True})
res["seeded_again"] = collect(mini_batch_size=2, epochs=3, seed=7, dataloader_kwargs={"shuffle": True})
res["ordered"] = collect(mini_batch_size=4, epochs=2, dataloader_kwargs={"shuffle": False})
res["indivisible"] = raises(lambda: collect(mini_batch_size=3, epochs=1))
emit(**res)
""")
    seeded = out["seeded"]
    assert len(seeded) == 12, f"8 samples, mini_batch_size 2, 3 epochs: got {len(seeded)} mini-batches, want 12"
    for b in seeded:
        assert b["size"] == [2] and len(b["idx"]) == 2, f"a mini-batch of {b['size']} samples: {b}"
        assert b["labels"] == ["s%d" % i for i in b["idx"]], f"a mini-batch's labels do not follow its samples: {b}"
        assert b["cfg"] == {"lr": 0.1}, f"a mini-batch lost its batch-wide value: {b}"
    epochs = [sum((b["idx"] for b in seeded[e * 4:(e + 1) * 4]), []) for e in range(3)]
    for e, order in enumerate(epochs):
        assert sorted(order) == list(range(8)), f"epoch {e} visits {order}, not each sample once"
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2], (
        f"make_iterator(seed=7, shuffle=True) repeats the same order in successive epochs: {epochs}; "
        "each epoch must be shuffled afresh from the one seeded generator")
    again = [b["idx"] for b in out["seeded_again"]]
    assert again == [b["idx"] for b in seeded], (
        f"two iterators with seed 7 differ: {[b['idx'] for b in seeded]} vs {again}")
    ordered = [b["idx"] for b in out["ordered"]]
    assert ordered == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2, f"shuffle=False, 2 epochs: {ordered}"
    assert out["indivisible"] == "AssertionError", (
        f"8 samples in mini-batches of 3: make_iterator raised {out['indivisible']}, want AssertionError")
