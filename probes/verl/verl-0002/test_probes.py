"""Probes for verl-0002 (TensorDict helpers and DataProto.to_tensordict).

The judge (this module) never imports verl: each probe draws a batch fresh (its size, names,
values, which cases are refused and which are not), builds it in a child process, runs the
helpers there and checks the plain values it sends back against what the judge expects from
the drawn inputs and against gold's child on the same inputs."""

import copy
import string

import numpy as np

from infradev_probe import fresh, reference, run, same

# In the child: verl, the helpers, and `plain`, which turns whatever a TensorDict hands back
# into JSON values without hiding what it was (a tensor, a numpy array or scalar stays tagged,
# so it never compares equal to the plain Python value the judge expects). `build` makes the
# inputs a spec describes: tensors from arrays, per-sample lists, lists of tensors (rows of an
# array), batch-wide values.
SETUP = """
import copy
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


def attempt(fn):
    try:
        return {"ok": fn()}
    except Exception as e:
        return {"raised": type(e).__name__}


def kind(td, k):
    from tensordict import NonTensorData, NonTensorStack
    v = td.get(k)
    if isinstance(v, NonTensorStack):
        return "stack"
    if isinstance(v, NonTensorData):
        return "data"
    if isinstance(v, torch.Tensor):
        return "tensor"
    return type(v).__name__


def inputs(spec):
    per_sample = {k: torch.from_numpy(np.array(v)) for k, v in spec.get("tensors", {}).items()}
    per_sample.update({k: copy.deepcopy(v) for k, v in spec.get("columns", {}).items()})
    per_sample.update({k: [torch.from_numpy(np.array(r)) for r in v] for k, v in spec.get("tensor_lists", {}).items()})
    return per_sample, copy.deepcopy(spec.get("meta", {}))


def build(spec):
    per_sample, meta = inputs(spec)
    return tu.get_tensordict(per_sample, meta or None)


def make_dp(spec):
    return DataProto.from_dict(
        tensors={k: torch.from_numpy(np.array(v)) for k, v in spec["tensors"].items()},
        non_tensors={k: copy.deepcopy(v) for k, v in spec["columns"].items()},
        meta_info=copy.deepcopy(spec["meta"]))
"""


# ---- drawing inputs -------------------------------------------------------------------------

def _names(rng, n, taken=()):
    """n distinct random identifiers not in taken."""
    out, seen = [], set(taken)
    while len(out) < n:
        name = "".join(rng.choice(list(string.ascii_lowercase), size=int(rng.integers(3, 7))))
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


def _word(rng):
    return "".join(rng.choice(list(string.ascii_letters), size=int(rng.integers(1, 6))))


def _int_tensor(rng, n):
    return rng.integers(-1000, 1000, size=(n, int(rng.integers(1, 4)))).astype(np.int64)


def _float_tensor(rng, n):
    return rng.standard_normal((n, int(rng.integers(1, 4)))).astype(np.float32)


def _column(rng, n, kind):
    if kind == "str":
        return [_word(rng) for _ in range(n)]
    return [{"i": int(rng.integers(1000)), "tag": _word(rng)} for _ in range(n)]


def _meta_value(rng, n, kind):
    if kind == "str":
        return "run-" + _word(rng)
    if kind == "int":
        return int(rng.integers(-50, 10_000))
    if kind == "dict":
        return {"top_p": round(float(rng.random()), 3), "n": int(rng.integers(1, 9))}
    return [int(x) for x in rng.integers(0, 100, size=n)]  # a list as long as the batch


def _spec(rng, n, tensors, columns, metas, taken=()):
    """A batch of n samples: `tensors` tensors (int or float), `columns` per-sample lists,
    and batch-wide values of the given kinds, all under fresh names."""
    names = _names(rng, tensors + columns + len(metas), taken)
    spec = {"tensors": {}, "columns": {}, "meta": {}}
    for i in range(tensors):
        spec["tensors"][names.pop()] = _int_tensor(rng, n) if i % 2 == 0 else _float_tensor(rng, n)
    for i in range(columns):
        spec["columns"][names.pop()] = _column(rng, n, "str" if i % 2 == 0 else "dict")
    for kind in metas:
        spec["meta"][names.pop()] = _meta_value(rng, n, kind)
    return spec


def _all_names(spec):
    return [k for part in ("tensors", "columns", "tensor_lists", "meta") for k in spec.get(part, {})]


def _tagged(arr):
    return {"tensor": arr.tolist()}


def _rows(spec, idx):
    """What td[idx][name] gives for each name: tensor rows tagged, list items, batch-wide
    values whole."""
    out = {k: _tagged(v[idx]) for k, v in spec["tensors"].items()}
    if isinstance(idx, (int, np.integer)):
        out.update({k: v[idx] for k, v in spec["columns"].items()})
    else:
        out.update({k: [v[i] for i in idx] for k, v in spec["columns"].items()})
    out.update(copy.deepcopy(spec["meta"]))
    return out


def _check(got, want, what):
    """Compares a value the child sent with the judge's expectation, naming what it is."""
    try:
        same(got, want)
    except AssertionError as e:
        raise AssertionError(f"{what}: got {_show(got)}, want {_show(want)} ({e})") from None


def _show(v):
    text = repr(v.tolist() if isinstance(v, np.ndarray) else v)
    return text if len(text) <= 600 else text[:600] + "..."


def _both(driver, args):
    return run(driver, args), reference(driver, args)


# ---- to_tensordict: contents --------------------------------------------------------------

CONTENTS = SETUP + """
spec = ARGS["dp"]
td = make_dp(spec).to_tensordict()
names = list(spec["tensors"]) + list(spec["columns"]) + list(spec["meta"])
res = {"batch_size": list(td.batch_size), "keys": sorted(td.keys()),
       "tensors": {k: td[k] for k in spec["tensors"]},
       "whole": {k: plain(td[k]) for k in list(spec["columns"]) + list(spec["meta"])},
       "rows": [{k: plain(td[i][k]) for k in names} for i in range(ARGS["n"])]}
pick = td[torch.tensor(ARGS["pick"])]
res["pick"] = {k: plain(pick[k]) for k in names}
a, b = ARGS["slice"]
part = td[a:b]
res["slice"] = {k: plain(part[k]) for k in names}
res["slice_rows"] = [{k: plain(part[i][k]) for k in spec["columns"]} for i in range(b - a)]
res["clashes"] = [attempt(lambda: sorted(make_dp(c).to_tensordict().keys())) for c in ARGS["clashes"]]
emit(**res)
"""


def _clash_case(rng, kind):
    """A small DataProto whose names clash as `kind` says: batch and non_tensor_batch, meta_info
    and batch, meta_info and non_tensor_batch, or none."""
    n = int(rng.integers(2, 6))
    spec = _spec(rng, n, 1, 1, ["int"])
    t, c, m = list(spec["tensors"]), list(spec["columns"]), list(spec["meta"])
    if kind == "batch_nt":
        spec["columns"] = {t[0]: spec["columns"][c[0]]}
    elif kind == "meta_batch":
        spec["meta"] = {t[0]: spec["meta"][m[0]]}
    elif kind == "meta_nt":
        spec["meta"] = {c[0]: spec["meta"][m[0]]}
    return spec


def _clashes(rng):
    kinds = ["batch_nt", "meta_batch", "meta_nt"] + list(rng.choice(
        ["batch_nt", "meta_batch", "meta_nt", "none"], size=int(rng.integers(1, 4)))) + ["none"]
    rng.shuffle(kinds)
    return kinds, [_clash_case(rng, k) for k in kinds]


def test_to_tensordict_contents():
    rng = fresh()
    n = int(rng.integers(4, 10))
    dp = _spec(rng, n, 2, 2, ["str", "int", "dict", "list"])
    pick = [int(i) for i in rng.choice(n, size=int(rng.integers(2, n + 1)), replace=False)]
    a = int(rng.integers(0, n - 1))
    b = int(rng.integers(a + 1, n + 1))
    kinds, clashes = _clashes(rng)
    args = {"n": n, "dp": dp, "pick": pick, "slice": [a, b], "clashes": clashes}
    got, want = _both(CONTENTS, args)

    names = _all_names(dp)
    _check(got["batch_size"], [n], "to_tensordict(): batch_size")
    _check(got["keys"], sorted(names), "to_tensordict(): keys")
    for k, v in dp["tensors"].items():
        _check(got["tensors"][k], v, f"to_tensordict()[{k!r}] (a tensor of batch)")
    for k, v in {**dp["columns"], **dp["meta"]}.items():
        _check(got["whole"][k], v, f"to_tensordict()[{k!r}]")
    for i in range(n):
        for k, w in _rows(dp, i).items():
            role = ("a per-sample value" if k in dp["columns"] else "a batch-wide (meta_info) value, whole"
                    if k in dp["meta"] else "a row of a tensor")
            _check(got["rows"][i][k], w, f"to_tensordict()[{i}][{k!r}] ({role})")
    for k, w in _rows(dp, pick).items():
        _check(got["pick"][k], w, f"to_tensordict()[{pick}][{k!r}]")
    for k, w in _rows(dp, list(range(a, b))).items():
        _check(got["slice"][k], w, f"to_tensordict()[{a}:{b}][{k!r}]")
    for i in range(b - a):
        for k in dp["columns"]:
            _check(got["slice_rows"][i][k], dp["columns"][k][a + i], f"to_tensordict()[{a}:{b}][{i}][{k!r}]")
    for kind, case, g in zip(kinds, clashes, got["clashes"]):
        what = {"batch_nt": "a name in both batch and non_tensor_batch",
                "meta_batch": "a meta_info name that is also a batch name",
                "meta_nt": "a meta_info name that is also a non_tensor_batch name",
                "none": "distinct names"}[kind]
        if kind == "none":
            _check(g, {"ok": sorted(_all_names(case))}, f"to_tensordict() with {what}")
        else:
            _check(g, {"raised": "AssertionError"}, f"to_tensordict() with {what}")
    same(got, want, path="to_tensordict (compared with the reference)")


# ---- layout and the helpers ---------------------------------------------------------------

LAYOUT = SETUP + """
res = {}
td = make_dp(ARGS["dp"]).to_tensordict()
res["dp"] = {k: kind(td, k) for k in td.keys()}
g = build(ARGS["get"])
res["get"] = {k: kind(g, k) for k in g.keys()}
res["get_batch"] = list(g.batch_size)
res["lists_only_batch"] = list(build(ARGS["lists_only"]).batch_size)
res["meta_only_batch"] = list(build(ARGS["meta_only"]).batch_size)
res["refusals"] = [attempt(lambda: list(build(c).batch_size)) for c in ARGS["refusals"]]

# assign_non_tensor_data into one of several TensorDicts, assign_non_tensor_dict into another.
cands = [build(ARGS["get"]) for _ in range(ARGS["candidates"])]
key, val = ARGS["assign_one"]
tu.assign_non_tensor_data(cands[ARGS["one_into"]], key, copy.deepcopy(val))
back = tu.assign_non_tensor_dict(cands[ARGS["dict_into"]], copy.deepcopy(ARGS["assign_dict"]))
res["assign"] = {
    "returned": [i for i, c in enumerate(cands) if c is back],
    "one": {"kind": kind(cands[ARGS["one_into"]], key), "whole": plain(cands[ARGS["one_into"]][key]),
            "row": plain(cands[ARGS["one_into"]][ARGS["row"]][key])},
    "dict": {k: {"kind": kind(back, k), "whole": plain(back[k]), "row": plain(back[ARGS["row"]][k])}
             for k in ARGS["assign_dict"]},
}

# pop
src = build(ARGS["pop"]["spec"])
p = tu.pop(src, ARGS["pop"]["keys"])
res["pop"] = {"kinds": {k: kind(p, k) for k in p.keys()}, "batch": list(p.batch_size),
              "values": {k: plain(p[k]) for k in p.keys()}, "left": sorted(src.keys())}

# assert_tensordict_eq over pairs that are equal or differ in one place
res["eq"] = [attempt(lambda: tu.assert_tensordict_eq(build(a), build(b))) for a, b in ARGS["eq"]]
emit(**res)
"""


def _refusal(rng, kind):
    """A get_tensordict input that is refused (tensor_items, lengths, clash) or taken."""
    n = int(rng.integers(2, 7))
    spec = _spec(rng, n, 1, 1, ["int"])
    t, c, m = list(spec["tensors"]), list(spec["columns"]), list(spec["meta"])
    if kind == "tensor_items":
        spec["tensor_lists"] = {_names(rng, 1, _all_names(spec))[0]: _int_tensor(rng, n)}
    elif kind == "lengths":
        spec["columns"][c[0]] = spec["columns"][c[0]][:n - 1] if rng.random() < 0.5 else \
            spec["columns"][c[0]] + [_word(rng)]
    elif kind == "clash":
        clash = t[0] if rng.random() < 0.5 else c[0]
        spec["meta"] = {clash: spec["meta"][m[0]]}
    return spec, n


def _differ(rng, spec):
    """(a, b, refused): a pair of batches equal in values (distinct objects) or differing in
    one drawn place."""
    b = copy.deepcopy(spec)
    how = str(rng.choice(["equal", "equal", "tensor", "column", "meta", "keys", "type"]))
    n = len(next(iter(spec["tensors"].values())))
    if how == "tensor":
        k = list(b["tensors"])[int(rng.integers(len(b["tensors"])))]
        arr = b["tensors"][k].copy()
        arr.flat[int(rng.integers(arr.size))] += 1
        b["tensors"][k] = arr
    elif how == "column":
        k = list(b["columns"])[0]
        i = int(rng.integers(n))
        b["columns"][k][i] = b["columns"][k][i] + "x"
    elif how == "meta":
        k = list(b["meta"])[0]
        b["meta"][k] = b["meta"][k] + 1
    elif how == "keys":
        b["tensors"][_names(rng, 1, _all_names(b))[0]] = _int_tensor(rng, n)
    elif how == "type":
        k = list(b["tensors"])[0]
        b["columns"][k] = [str(int(r[0])) for r in b["tensors"].pop(k)]
    return how, b


def test_tensordict_layout():
    rng = fresh()
    n = int(rng.integers(3, 9))
    dp = _spec(rng, n, int(rng.integers(1, 4)), int(rng.integers(1, 4)),
               list(rng.choice(["str", "int", "dict"], size=int(rng.integers(0, 3)))) + ["list"])
    get = _spec(rng, n, int(rng.integers(1, 3)), int(rng.integers(1, 3)),
                list(rng.choice(["str", "int", "dict"], size=int(rng.integers(1, 3)))) + ["list"])
    m = int(rng.integers(1, 7))
    lists_only = _spec(rng, m, 0, int(rng.integers(1, 3)), [])
    meta_only = _spec(rng, 1, 0, 0, list(rng.choice(["str", "int", "dict"], size=int(rng.integers(1, 3)))))
    kinds = ["tensor_items", "lengths", "clash"] + list(rng.choice(
        ["tensor_items", "lengths", "clash", "taken"], size=int(rng.integers(1, 4)))) + ["taken"]
    rng.shuffle(kinds)
    refusals = [_refusal(rng, k) for k in kinds]
    candidates = int(rng.integers(2, 5))
    taken = _all_names(get)
    new = _names(rng, 3, taken)
    assign_one = [new[0], _meta_value(rng, n, str(rng.choice(["str", "dict", "list"])))]
    assign_dict = {new[1]: _meta_value(rng, n, "list"), new[2]: _meta_value(rng, n, "int")}
    pop_spec = _spec(rng, n, 2, 2, ["int", "dict"])
    pop_names = _all_names(pop_spec)
    pop_keys = [str(k) for k in rng.choice(pop_names, size=int(rng.integers(1, len(pop_names))), replace=False)]
    eq_base = _spec(rng, n, 2, 1, ["int"])
    eq = [_differ(rng, eq_base) for _ in range(int(rng.integers(4, 8)))]
    args = {"dp": dp, "get": get, "lists_only": lists_only, "meta_only": meta_only,
            "refusals": [r[0] for r in refusals], "candidates": candidates,
            "one_into": int(rng.integers(candidates)), "dict_into": int(rng.integers(candidates)),
            "row": int(rng.integers(n)), "assign_one": assign_one, "assign_dict": assign_dict,
            "pop": {"spec": pop_spec, "keys": pop_keys}, "eq": [[eq_base, b] for _, b in eq]}
    got, want = _both(LAYOUT, args)

    def kinds_of(spec):
        out = {k: "tensor" for k in spec["tensors"]}
        out.update({k: "stack" for k in spec["columns"]})
        out.update({k: "data" for k in spec["meta"]})
        return out

    _check(got["dp"], kinds_of(dp), "to_tensordict() stores (tensor: a tensor, stack: NonTensorStack, "
                                    "data: NonTensorData)")
    _check(got["get"], kinds_of(get), "get_tensordict stores (tensor: a tensor, stack: NonTensorStack, "
                                      "data: NonTensorData)")
    _check(got["get_batch"], [n], "get_tensordict: batch_size")
    _check(got["lists_only_batch"], [m], "get_tensordict with per-sample lists only: batch_size")
    _check(got["meta_only_batch"], [], "get_tensordict with no per-sample entry: batch_size (torch.Size([]))")
    for (kind, (_, size)), g in zip(zip(kinds, refusals), got["refusals"]):
        what = {"tensor_items": "a list of tensors", "lengths": "entries of different lengths",
                "clash": "a name in both dicts", "taken": "valid entries"}[kind]
        _check(g, {"ok": [size]} if kind == "taken" else {"raised": "AssertionError"}, f"get_tensordict with {what}")
    a = got["assign"]
    _check(a["returned"], [args["dict_into"]], "assign_non_tensor_dict returned (the index of the TensorDict it was given)")
    _check(a["one"], {"kind": "data", "whole": assign_one[1], "row": assign_one[1]},
           f"assign_non_tensor_data(td, {assign_one[0]!r}, ...): its kind, td[key], td[{args['row']}][key]")
    _check(a["dict"], {k: {"kind": "data", "whole": v, "row": v} for k, v in assign_dict.items()},
           "assign_non_tensor_dict: kinds, whole values and row values")
    p = got["pop"]
    popped = {part: {k: v for k, v in pop_spec[part].items() if k in pop_keys} for part in ("tensors", "columns", "meta")}
    _check(p["kinds"], kinds_of(popped), f"pop(td, {pop_keys}): kinds of the result")
    per_sample = popped["tensors"] or popped["columns"]
    _check(p["batch"], [n] if per_sample else [], f"pop(td, {pop_keys}): batch_size of the result")
    want_values = {k: _tagged(v) for k, v in popped["tensors"].items()}
    want_values.update(popped["columns"])
    want_values.update(popped["meta"])
    _check(p["values"], want_values, f"pop(td, {pop_keys}): values")
    _check(p["left"], sorted(set(pop_names) - set(pop_keys)), f"pop(td, {pop_keys}): keys left in td")
    for (how, _), g in zip(eq, got["eq"]):
        _check(g, {"ok": None} if how == "equal" else {"raised": "AssertionError"},
               f"assert_tensordict_eq on two batches that are {'equal' if how == 'equal' else 'different in ' + how}")
    same(got, want, path="layout (compared with the reference)")


# ---- no copies, no mutation -------------------------------------------------------------

NO_COPY = SETUP + """
res = {}
spec = ARGS["dp"]
dp = make_dp(spec)
td = dp.to_tensordict()


def dp_state():
    return {"batch": sorted(dp.batch.keys()),
            "non_tensor": {k: plain(v.tolist()) for k, v in dp.non_tensor_batch.items()},
            "meta": plain(dp.meta_info)}


res["after_conv"] = dp_state()
for k, i, v in ARGS["writes_td"]:
    td[k].view(-1)[i] = v
res["dp_tensors"] = {k: dp.batch[k].clone() for k in spec["tensors"]}
for k, i, v in ARGS["writes_dp"]:
    dp.batch[k].view(-1)[i] = v
res["td_tensors"] = {k: td[k].clone() for k in spec["tensors"]}
td[ARGS["add"]] = torch.zeros(ARGS["n"])
for k in ARGS["drop"]:
    td.pop(k)
res["after_edit"] = dp_state()

t = torch.from_numpy(np.array(ARGS["given"]))
g = tu.get_tensordict({ARGS["given_name"]: t, "labels": ["a"] * len(t)})
for i, v in ARGS["given_writes"]:
    g[ARGS["given_name"]][i] = v
res["given"] = t.clone()

pads = []
for divisor in ARGS["divisors"]:
    data = build(ARGS["pad"])
    padded, pad = tu.pad_to_divisor(data, divisor)
    names = list(ARGS["pad"]["tensors"]) + list(ARGS["pad"]["columns"]) + list(ARGS["pad"]["meta"])
    back = tu.unpad(padded, pad)
    pads.append({"size": pad, "len": len(padded), "padded": {k: plain(padded[k]) for k in names},
                 "input": {"len": len(data), **{k: plain(data[k]) for k in names}},
                 "unpad": {"len": len(back), **{k: plain(back[k]) for k in names}}})
res["pads"] = pads
emit(**res)
"""


def test_conversion_shares_tensors_and_leaves_inputs_alone():
    rng = fresh()
    n = int(rng.integers(3, 9))
    dp = _spec(rng, n, 2, 2, ["str", "int", "dict", "list"])
    tensors = list(dp["tensors"])

    def writes(count):
        out = []
        for _ in range(count):
            k = tensors[int(rng.integers(len(tensors)))]
            arr = dp["tensors"][k]
            v = int(rng.integers(2000, 9000)) if arr.dtype == np.int64 else float(np.float32(rng.standard_normal() + 50))
            out.append([k, int(rng.integers(arr.size)), v])
        return out

    writes_td, writes_dp = writes(int(rng.integers(1, 4))), writes(int(rng.integers(1, 4)))
    add = _names(rng, 1, _all_names(dp))[0]
    drop = [str(rng.choice(list(dp["columns"]))), str(rng.choice(list(dp["meta"])))]
    if rng.random() < 0.5:
        drop.append(str(rng.choice(tensors)))
    given = rng.standard_normal(int(rng.integers(2, 7))).astype(np.float32)
    given_writes = [[int(rng.integers(len(given))), float(np.float32(rng.standard_normal() + 10))]
                    for _ in range(int(rng.integers(1, 3)))]
    pn = int(rng.integers(1, 8))
    pad = _spec(rng, pn, 1, 1, [str(rng.choice(["str", "int", "dict"]))])
    divisors = [int(rng.integers(2, 3 * pn + 2)) for _ in range(2)]
    divisors.append(int(rng.choice([d for d in range(1, pn + 1) if pn % d == 0])))
    rng.shuffle(divisors)
    args = {"n": n, "dp": dp, "writes_td": writes_td, "writes_dp": writes_dp, "add": add, "drop": drop,
            "given_name": _names(rng, 1, ["labels"])[0], "given": given, "given_writes": given_writes,
            "pad": pad, "divisors": divisors}
    got, want = _both(NO_COPY, args)

    state = {"batch": sorted(tensors), "non_tensor": dp["columns"], "meta": dp["meta"]}
    _check(got["after_conv"], state, "the DataProto after to_tensordict() (batch names, non_tensor_batch, meta_info)")
    current = {k: v.copy() for k, v in dp["tensors"].items()}
    for k, i, v in writes_td:
        current[k].flat[i] = v
    for k, v in current.items():
        _check(got["dp_tensors"][k], v, f"the DataProto's batch[{k!r}] after writes into to_tensordict()'s "
                                        f"tensors {writes_td} (the conversion must not copy tensors)")
    for k, i, v in writes_dp:
        current[k].flat[i] = v
    for k, v in current.items():
        _check(got["td_tensors"][k], v, f"to_tensordict()[{k!r}] after writes into the DataProto's batch {writes_dp}")
    _check(got["after_edit"], state, f"the DataProto after adding {add!r} to and popping {drop} from the result")
    want_given = given.copy()
    for i, v in given_writes:
        want_given[i] = v
    _check(got["given"], want_given, "the tensor given to get_tensordict after writes through the result "
                                     "(get_tensordict must not copy it)")
    names = _all_names(pad)
    whole = {k: _tagged(v) for k, v in pad["tensors"].items()}
    whole.update(pad["columns"])
    whole.update(pad["meta"])
    for divisor, p in zip(divisors, got["pads"]):
        extra = (-pn) % divisor
        rows = list(range(pn)) + [i % pn for i in range(extra)]
        padded = _rows(pad, rows)
        what = f"pad_to_divisor({pn} samples, {divisor})"
        _check([p["size"], p["len"]], [extra, pn + extra], f"{what}: pad_size and length")
        _check(p["padded"], {k: padded[k] for k in names}, f"{what}: the padded data (rows {rows})")
        _check(p["input"], {"len": pn, **whole}, f"{what}: its input afterwards")
        _check(p["unpad"], {"len": pn, **whole}, f"unpad({what})")
    same(got, want, path="no copies (compared with the reference)")


# ---- union -------------------------------------------------------------------------------

UNION = SETUP + """
res = {}
a_spec, b_spec = ARGS["a"], ARGS["b"]
cands = [build(a_spec) for _ in range(ARGS["candidates"])]
a = cands[ARGS["into"]]
b = build(b_spec)
try:
    r = tu.union_tensor_dict(a, b)
    res["merged"] = {"returned": [i for i, c in enumerate(cands) if c is r], "keys": sorted(a.keys()),
                     "values": {k: plain(a[k]) for k in ARGS["new"]},
                     "row": {k: plain(a[ARGS["row"]][k]) for k in ARGS["new"]},
                     "b_keys": sorted(b.keys())}
except Exception as e:
    res["merged"] = {"raised": "%s: %s" % (type(e).__name__, e)}
res["cases"] = [attempt(lambda: sorted(tu.union_tensor_dict(build(a_spec), build(c)).keys())) for c in ARGS["cases"]]
emit(**res)
"""


def _union_case(rng, a, kind):
    n = len(next(iter(a["tensors"].values())))
    c = copy.deepcopy(a)
    t, col, m = list(c["tensors"]), list(c["columns"]), list(c["meta"])
    if kind == "tensor_diff":
        arr = c["tensors"][t[0]].copy()
        arr.flat[int(rng.integers(arr.size))] += 1
        c["tensors"][t[0]] = arr
    elif kind == "list_diff":
        i = int(rng.integers(n))
        c["columns"][col[0]][i] = c["columns"][col[0]][i] + "x"
    elif kind == "meta_diff":
        c["meta"][m[0]] = {**c["meta"][m[0]], "n": c["meta"][m[0]]["n"] + 1}
    elif kind == "batch_len":
        other = int(rng.choice([x for x in range(1, 9) if x != n]))
        c = _spec(rng, other, 1, 0, [], _all_names(a))
    elif kind == "batchless":
        c = {"tensors": {}, "columns": {}, "meta": copy.deepcopy(a["meta"])}
    elif kind == "new_keys":
        c = _spec(rng, n, 1, 1, [], _all_names(a))
    return c


def test_union_merges_in_place_and_compares_values():
    rng = fresh()
    n = int(rng.integers(3, 9))
    a = _spec(rng, n, 1, 1, ["dict"])
    extra = _spec(rng, n, 1, 1, [], _all_names(a))
    b = copy.deepcopy(a)
    for part in ("tensors", "columns"):
        b[part].update(extra[part])
    new = list(extra["tensors"]) + list(extra["columns"])
    kinds = ["equal_copy", "batch_len", "batchless"] + list(rng.choice(
        ["equal_copy", "new_keys", "tensor_diff", "list_diff", "meta_diff", "batch_len", "batchless"],
        size=int(rng.integers(2, 6))))
    rng.shuffle(kinds)
    cases = [_union_case(rng, a, k) for k in kinds]
    candidates = int(rng.integers(2, 5))
    args = {"a": a, "b": b, "new": new, "candidates": candidates, "into": int(rng.integers(candidates)),
            "row": int(rng.integers(n)), "cases": cases}
    got, want = _both(UNION, args)

    merged = got["merged"]
    assert "raised" not in merged, (
        f"union_tensor_dict refused two TensorDicts whose shared keys hold equal values (the tensor a distinct "
        f"one with the same values): {merged['raised']}")
    _check(merged["returned"], [args["into"]], "union_tensor_dict returned (the index of tensor_dict1 among the TensorDicts)")
    _check(merged["keys"], sorted(_all_names(b)), "tensor_dict1's keys after union_tensor_dict (merged in place)")
    _check(merged["values"], {**{k: _tagged(v) for k, v in extra["tensors"].items()}, **extra["columns"]},
           "the entries tensor_dict1 took from tensor_dict2")
    _check(merged["row"], {**{k: _tagged(v[args["row"]]) for k, v in extra["tensors"].items()},
                           **{k: v[args["row"]] for k, v in extra["columns"].items()}},
           f"tensor_dict1[{args['row']}] of the merged entries")
    _check(merged["b_keys"], sorted(_all_names(b)), "tensor_dict2's keys after union_tensor_dict (left as it was)")
    for kind, case, g in zip(kinds, cases, got["cases"]):
        what = {"equal_copy": "shared keys holding equal values (distinct tensors)",
                "new_keys": "only new per-sample keys", "tensor_diff": "tensors with different values",
                "list_diff": "per-sample lists that differ", "meta_diff": "batch-wide values that differ",
                "batch_len": "different batch sizes",
                "batchless": "a TensorDict without batch dimension (batch-wide values only)"}[kind]
        if kind in ("equal_copy", "new_keys"):
            _check(g, {"ok": sorted(set(_all_names(a)) | set(_all_names(case)))}, f"union_tensor_dict with {what}")
        else:
            _check(g, {"raised": "AssertionError"}, f"union_tensor_dict with {what}")
    same(got, want, path="union (compared with the reference)")


# ---- make_iterator -----------------------------------------------------------------------

ITERATOR = SETUP + """
res = {}
ds = build(ARGS["ds"])
idx, lab, meta = ARGS["idx"], ARGS["lab"], ARGS["meta"]


def collect(**kw):
    batches = []
    for b in tu.make_iterator(ds, **kw):
        batches.append({"idx": b[idx].tolist(), "labels": plain(b[lab]), "meta": plain(b[meta]),
                        "size": list(b.batch_size)})
    return batches


kw = {"mini_batch_size": ARGS["mbs"], "epochs": ARGS["epochs"], "dataloader_kwargs": {"shuffle": True}}
res["seeded"] = collect(seed=ARGS["seeds"][0], **kw)
res["seeded_again"] = collect(seed=ARGS["seeds"][0], **kw)
res["other_seed"] = collect(seed=ARGS["seeds"][1], **kw)
res["ordered"] = collect(mini_batch_size=ARGS["mbs2"], epochs=ARGS["epochs2"], dataloader_kwargs={"shuffle": False})
res["sizes"] = [attempt(lambda: len(collect(mini_batch_size=s, epochs=1))) for s in ARGS["sizes"]]
emit(**res)
"""


def test_make_iterator_epochs_and_seed():
    rng = fresh()
    n = int(rng.choice([8, 9, 10, 12, 14, 15, 16]))
    divisors = [d for d in range(1, n // 2 + 1) if n % d == 0]
    mbs = int(rng.choice(divisors))
    epochs = int(rng.integers(3, 5))
    idx, lab, meta = _names(rng, 3)
    values = [int(x) for x in rng.choice(100_000, size=n, replace=False)]
    labels = [f"s{v}" for v in values]
    cfg = _meta_value(rng, n, "dict")
    ds = {"tensors": {idx: np.array(values, dtype=np.int64)}, "columns": {lab: labels}, "meta": {meta: cfg}}
    seeds = [int(x) for x in rng.choice(1 << 31, size=2, replace=False)]
    mbs2 = int(rng.choice(divisors + [n]))
    epochs2 = int(rng.integers(1, 4))
    sizes = [int(rng.choice([d for d in range(2, n) if n % d])) for _ in range(2)] + [int(rng.choice(divisors))]
    rng.shuffle(sizes)
    args = {"ds": ds, "idx": idx, "lab": lab, "meta": meta, "mbs": mbs, "epochs": epochs, "seeds": seeds,
            "mbs2": mbs2, "epochs2": epochs2, "sizes": sizes}
    got, want = _both(ITERATOR, args)

    per_epoch = n // mbs
    for name in ("seeded", "seeded_again", "other_seed"):
        batches = got[name]
        _check(len(batches), per_epoch * epochs, f"{name}: {n} samples, mini_batch_size {mbs}, {epochs} epochs: mini-batches")
        for b in batches:
            _check(b["size"], [mbs], f"{name}: a mini-batch's batch_size")
            _check(b["labels"], [f"s{v}" for v in b["idx"]], f"{name}: a mini-batch's labels (aligned with its samples)")
            _check(b["meta"], cfg, f"{name}: a mini-batch's batch-wide value")
        for e in range(epochs):
            order = sum((b["idx"] for b in batches[e * per_epoch:(e + 1) * per_epoch]), [])
            _check(sorted(order), sorted(values), f"{name}: epoch {e} visits each sample once")
    ref_orders = {name: [b["idx"] for b in want[name]] for name in ("seeded", "other_seed")}
    _check([b["idx"] for b in got["seeded"]], ref_orders["seeded"],
           f"make_iterator(seed={seeds[0]}, shuffle=True): the sequence of mini-batches (reference: one generator "
           "seeded once, each epoch shuffled afresh)")
    _check([b["idx"] for b in got["seeded_again"]], ref_orders["seeded"],
           f"a second make_iterator(seed={seeds[0]}): the sequence (must repeat the first)")
    _check([b["idx"] for b in got["other_seed"]], ref_orders["other_seed"], f"make_iterator(seed={seeds[1]}): the sequence")
    ordered = [values[i:i + mbs2] for i in range(0, n, mbs2)] * epochs2
    _check([b["idx"] for b in got["ordered"]], ordered, f"shuffle=False, mini_batch_size {mbs2}, {epochs2} epochs")
    for s, g in zip(sizes, got["sizes"]):
        _check(g, {"ok": n // s} if n % s == 0 else {"raised": "AssertionError"},
               f"{n} samples in mini-batches of {s}: make_iterator")
    same(got, want, path="make_iterator (compared with the reference)")
