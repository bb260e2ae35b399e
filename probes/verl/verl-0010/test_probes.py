"""Probes for verl-0010 (group-level data-parallel balancing for shared-prefix training).

The judge (this module) never imports verl, torch or transformers. Every probe draws its
scenario fresh (how many groups, their sizes, uids, sequence lengths, the number of partitions
or data-parallel ranks, which invalid calls are made and in what order, attention shapes and
values) and runs a driver in a child that sends back plain data: the partitions
get_group_balanced_partitions returns, the order RayPPOTrainer._balance_batch leaves a batch in
(on a stand-in trainer with a fixed data-parallel size) with its metrics, and what a wrapped
attention function returns through a stand-in PrefixGrouper. The judge checks the contract
itself from the inputs (every sample once, whole groups, equal group counts, ascending indices,
the balance metrics' values), compares the heaviest partition's workload with gold's on the same
inputs (reference), and compares attention outputs with gold's child on the same tensors.

Everything runs on CPU.
"""

import numpy as np

from infradev_probe import fresh, reference, run, same


def _workload(s):
    return 24576 * s + s * s


def _groups(uids):
    out, start = [], 0
    for i in range(1, len(uids) + 1):
        if i == len(uids) or uids[i] != uids[start]:
            out.append(list(range(start, i)))
            start = i
    return out


def _uids(rng, n_groups, kind):
    """n_groups distinct uids, as strings or ints, in no particular order."""
    if kind == "str":
        tags = set()
        while len(tags) < n_groups:
            tags.add("q%x" % int(rng.integers(1 << 40)))
        return sorted(tags, key=lambda _: rng.random())
    return [int(x) for x in rng.choice(10 ** 6, size=n_groups, replace=False)]


def _case(rng, n_groups, k, sizes, lo, hi, kind="str", increasing=False):
    """A batch of contiguous uid groups. With increasing, group workloads strictly increase with
    the group's position (so a partition listed heaviest group first is not in index order)."""
    while True:
        lens = [rng.integers(lo, hi + 1, size=n).tolist() for n in sizes]
        if not increasing:
            break
        tot = [sum(_workload(s) for s in g) for g in lens]
        if len(set(tot)) == len(tot):
            lens = [g for _, g in sorted(zip(tot, lens))]
            sizes = [len(g) for g in lens]
            break
    uids = _uids(rng, n_groups, kind)
    return {"seqlens": [int(s) for g in lens for s in g],
            "uids": [u for u, n in zip(uids, sizes) for _ in range(n)], "k": int(k)}


PARTS = r"""
from verl.utils.seqlen_balancing import get_group_balanced_partitions

res = {}
for name, case in ARGS["cases"].items():
    try:
        parts = get_group_balanced_partitions(case["seqlens"], case["uids"], k_partitions=case["k"])
        res[name] = {"parts": [[int(i) for i in p] for p in parts]}
    except AssertionError:
        res[name] = {"error": "AssertionError"}
    except Exception as e:
        res[name] = {"error": type(e).__name__}
emit(**res)
"""


def _check_partition(name, case, parts):
    k, n = case["k"], len(case["uids"])
    groups = _groups(case["uids"])
    assert len(parts) == k, f"{name}: {len(parts)} partitions, want {k}"
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(n)), f"{name}: partitions {parts} do not hold every one of the {n} samples exactly once"
    where = {i: r for r, p in enumerate(parts) for i in p}
    for g in groups:
        ranks = sorted({where[i] for i in g})
        assert len(ranks) == 1, f"{name}: the samples {g} of uid {case['uids'][g[0]]!r} are split over partitions {ranks}"
    for r, p in enumerate(parts):
        assert p == sorted(p), f"{name}: partition {r} is {p}, not in ascending order"
    counts = [sum(1 for g in groups if where[g[0]] == r) for r in range(k)]
    assert len(set(counts)) == 1, f"{name}: the partitions hold {counts} groups; want the same number each"
    return groups, where


def _heaviest(case, parts):
    return max(sum(_workload(case["seqlens"][i]) for i in p) for p in parts)


def test_groups_stay_whole_on_one_rank():
    rng = fresh()
    cases = {}
    # uneven groups (1-5 samples, at least one larger than 1), string uids
    k = int(rng.integers(2, 5))
    g = k * int(rng.integers(2, 4))
    sizes = rng.integers(1, 6, size=g).tolist()
    sizes[int(rng.integers(g))] = int(rng.integers(2, 6))
    cases["uneven"] = _case(rng, g, k, sizes, 1, 2000)
    # GRPO-like: equal groups of n responses, int uids, workloads rising with the group's position
    k = int(rng.integers(2, 4))
    g = k * int(rng.integers(2, 5))
    cases["grpo"] = _case(rng, g, k, [int(rng.integers(2, 6))] * g, 10, 900, kind="int", increasing=True)
    # single-sample groups
    k = int(rng.integers(2, 5))
    g = k * int(rng.integers(1, 4))
    cases["singletons"] = _case(rng, g, k, [1] * g, 1, 3000)
    out = run(PARTS, {"cases": cases}, timeout=200)
    for name, case in cases.items():
        assert "parts" in out[name], f"{name}: get_group_balanced_partitions raised {out[name].get('error')}"
        _check_partition(name, case, out[name]["parts"])


def test_groups_are_balanced_by_workload():
    rng = fresh()
    cases = {}
    for j in range(3):
        k = int(rng.integers(2, 4))
        g = k * int(rng.integers(3, 6))
        if j == 0:
            # groups of different sizes whose lengths vary a lot: the workload, not the sample count
            cases["sizes"] = _case(rng, g, k, rng.integers(1, 7, size=g).tolist(), 5, 1500)
        else:
            # equal-size groups, one of them far heavier than the rest: only a split that puts the
            # lightest groups beside it balances the work
            n = int(rng.integers(2, 5))
            c = _case(rng, g, k, [n] * g, 10, 400)
            heavy = _groups(c["uids"])[int(rng.integers(g))]
            for i in heavy:
                c["seqlens"][i] = int(rng.integers(2000, 4000))
            cases["skewed%d" % j] = c
    out = run(PARTS, {"cases": cases}, timeout=200)
    want = reference(PARTS, {"cases": cases}, timeout=200)
    for name, case in cases.items():
        assert "parts" in out[name], f"{name}: get_group_balanced_partitions raised {out[name].get('error')}"
        groups, where = _check_partition(name, case, out[name]["parts"])
        got = _heaviest(case, out[name]["parts"])
        best = _heaviest(case, want[name]["parts"])
        gw = [sum(_workload(case["seqlens"][i]) for i in grp) for grp in groups]
        assert got <= best, (
            f"{name}: the heaviest of the {case['k']} partitions has workload {got}; Karmarkar-Karp over the "
            f"groups' workloads reaches {best} (group workloads {gw})")


def test_invalid_group_counts_are_refused():
    rng = fresh()
    kinds = [str(x) for x in rng.choice(["too-few-groups", "length-mismatch", "valid"], size=int(rng.integers(2, 5)))]
    kinds = ["too-few-groups", "extra-lengths"] + kinds
    kinds = [kinds[i] for i in rng.permutation(len(kinds))]
    cases = {}
    for j, kind in enumerate(kinds):
        if kind == "too-few-groups":
            k = int(rng.integers(3, 7))
            g = int(rng.integers(1, k))
        else:
            k = int(rng.integers(1, 4))
            g = k * int(rng.integers(2, 5))
        c = _case(rng, g, k, rng.integers(1, 5, size=g).tolist(), 1, 500)
        extra = int(rng.integers(1, 4))
        if kind == "extra-lengths" or (kind == "length-mismatch" and rng.random() < 0.4):
            kind = "extra-lengths"
            c["seqlens"] = c["seqlens"] + rng.integers(1, 500, size=extra).tolist()
        elif kind == "length-mismatch":
            if rng.random() < 0.5:
                kind = "extra-uids"
                c["uids"] = c["uids"] + [c["uids"][-1]] * extra
            else:
                kind = "missing-uid"
                c["uids"] = c["uids"][:-1]
        cases["%d-%s" % (j, kind)] = c
    out = run(PARTS, {"cases": cases}, timeout=200)
    assert set(out) == set(cases), f"results for calls {sorted(out)}, want {sorted(cases)}"
    for name, case in cases.items():
        kind = name.split("-", 1)[1]
        if kind == "valid":
            assert "parts" in out[name], f"{name}: get_group_balanced_partitions raised {out[name].get('error')}"
            _check_partition(name, case, out[name]["parts"])
        else:
            assert out[name].get("error") == "AssertionError", (
                f"{name} ({len(case['seqlens'])} lengths, {len(case['uids'])} uids, "
                f"{len(_groups(case['uids']))} groups, k={case['k']}): get_group_balanced_partitions gave "
                f"{out[name]}; want an AssertionError")


TRAINER = r"""
import types

import numpy as np
import torch

from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.workers.config import ActorConfig

res = {}
for name, case in ARGS["cases"].items():
    # the stand-in trainer's option comes from an ActorConfig: the field's default, or set explicitly
    kw = {} if case["on"] is None else {"use_prefix_grouper": case["on"]}
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)
    lens = case["seqlens"]
    L = max(lens) + 2
    mask = torch.zeros(len(lens), L, dtype=torch.long)
    for i, s in enumerate(lens):
        mask[i, L - s:] = 1
    batch = DataProto.from_dict(
        tensors={"attention_mask": mask, "sample": torch.arange(len(lens))},
        non_tensors={"uid": np.array(case["uids"], dtype=object)},
    )
    fake = types.SimpleNamespace(
        use_prefix_grouper=cfg.use_prefix_grouper,
        config=None,
        actor_rollout_wg=None,
        _get_dp_size=lambda wg, role, k=case["dp"]: k,
    )
    metrics = {}
    try:
        RayPPOTrainer._balance_batch(fake, batch, metrics)
        res[name] = {"order": batch.batch["sample"].numpy(), "uids": [str(u) for u in batch.non_tensor_batch["uid"]],
                     "metrics": {k: float(v) for k, v in metrics.items()}}
    except ValueError:
        res[name] = {"error": "ValueError"}
emit(**res)
"""


def _unbalance(seqlens, order, dp):
    """The balance metrics _balance_batch records, from the sequence lengths in the original order
    and the reordered batch (rank r's share is the r-th slice)."""
    n = len(seqlens)
    share = n // dp
    before = [sum(seqlens[o:o + share]) for o in range(0, n, share)]
    after = [sum(seqlens[i] for i in order[r * share:(r + 1) * share]) for r in range(dp)]
    p = "global_seqlen"
    return {f"{p}/min": min(before), f"{p}/max": max(before), f"{p}/minmax_diff": max(before) - min(before),
            f"{p}/balanced_min": min(after), f"{p}/balanced_max": max(after), f"{p}/mean": sum(before) / dp}


def test_trainer_balances_whole_groups():
    rng = fresh()
    dp = int(rng.integers(2, 5))
    n_groups, n = dp * int(rng.integers(2, 4)), int(rng.integers(2, 6))
    grouped = _case(rng, n_groups, dp, [n] * n_groups, 10, 60, increasing=True)
    grouped.update(dp=dp, on=True)
    dp2 = int(rng.integers(2, 5))
    g2 = dp2 * int(rng.integers(1, 4)) + int(rng.integers(1, dp2))
    odd = _case(rng, g2, dp2, [int(rng.integers(1, 5))] * g2, 10, 60)
    odd.update(dp=dp2, on=True)
    dp3 = int(rng.integers(2, 5))
    g3 = dp3 * int(rng.integers(1, 3))
    off = _case(rng, g3, dp3, [int(rng.integers(2, 5))] * g3, 10, 60)
    off.update(dp=dp3, on=None)  # the ActorConfig default: the option is off
    cases = {"grouped": grouped, "not-divisible": odd, "default-off": off}
    out = run(TRAINER, {"cases": cases}, timeout=300)
    got = out["grouped"]
    assert "order" in got, f"_balance_batch with use_prefix_grouper on raised {got.get('error')}"
    uids, seqlens = grouped["uids"], grouped["seqlens"]
    order = [int(i) for i in got["order"]]
    assert sorted(order) == list(range(len(uids))), f"the reordered batch holds samples {order}"
    share = len(order) // dp
    for r in range(dp):
        part = order[r * share:(r + 1) * share]
        ids = {uids[i] for i in part}
        assert all(sum(1 for i in part if uids[i] == u) == n for u in ids), (
            f"rank {r} of {dp}: its share of the reordered batch, samples {part}, does not hold whole uid groups "
            f"({[uids[i] for i in part]})")
        assert part == sorted(part), (
            f"rank {r}'s share {part} was reordered inside the partition; with the option on, each group's "
            f"samples keep their order")
    assert got["uids"] == [str(uids[i]) for i in order], "the uid entries were not reordered with the batch"
    same(got["metrics"], _unbalance(seqlens, order, dp), rtol=1e-6,
         path="balance metrics of the reordered batch (recomputed from the sequence lengths)")
    assert out["not-divisible"].get("error") == "ValueError", (
        f"{g2} uid groups over {dp2} data-parallel ranks gave {out['not-divisible']}; want a ValueError")
    # Without the option (ActorConfig's default), _balance_batch does what it did before: gold's order.
    want = reference(TRAINER, {"cases": {"default-off": off}}, timeout=300)["default-off"]
    same(out["default-off"], want, rtol=1e-6,
         path="_balance_batch with use_prefix_grouper left at ActorConfig's default (compared with the reference)")


PATCH = r"""
import numpy as np
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from verl.models.transformers.monkey_patch import apply_prefix_grouper_patch


def t(a):
    return torch.tensor(np.asarray(a), dtype=torch.float32)


q, k, v = t(ARGS["q"]), t(ARGS["k"]), t(ARGS["v"])
module = torch.nn.Module()
module.is_causal = bool(ARGS["causal"])
scaling = float(ARGS["scaling"])
plain = ALL_ATTENTION_FUNCTIONS["sdpa"](module, q, k, v, None, scaling=scaling)[0]
for _ in range(ARGS["patches"]):
    apply_prefix_grouper_patch()
wrapped = ALL_ATTENTION_FUNCTIONS["sdpa"]


class Grouper:
    # A stand-in PrefixGrouper: runs the attention it is handed and scales the result; its output
    # also shows which keywords reached it (each extra keyword's value is added).
    def __init__(self, factor, inner=None):
        self.factor, self.inner, self.kwargs = factor, inner, []

    def forward(self, attn_func, q_, k_, v_, *args, **kwargs):
        self.kwargs.append(sorted(kwargs))
        extra = {"prefix_grouper": self.inner} if self.inner is not None else {}
        out = attn_func(q_, k_, v_, None, *args, **kwargs, **extra)
        shift = sum(float(x) for key, x in kwargs.items() if key.startswith("extra_"))
        shift += 1000.0 * sum(1 for key in kwargs if key == "prefix_grouper")
        return out * self.factor + shift


calls = []
for c in ARGS["calls"]:
    kw = dict(c["kwargs"])
    if c["mode"] == "grouper":
        g = Grouper(c["factor"], Grouper(c["inner"]) if c["inner"] else None)
        o = wrapped(module, q, k, v, None, scaling=scaling, prefix_grouper=g, **kw)
        calls.append({"out": o[0], "second_is_none": o[1] is None, "kwargs": g.kwargs,
                      "inner_kwargs": g.inner.kwargs if g.inner is not None else []})
    else:
        extra = {"prefix_grouper": None} if c["mode"] == "none" else {}
        o = wrapped(module, q, k, v, None, scaling=scaling, **kw, **extra)
        calls.append({"out": o[0], "second_is_none": o[1] is None})
emit(plain=plain, calls=calls)
"""


def test_attention_hook_hands_the_call_to_prefix_grouper():
    rng = fresh()
    b, h, s, d = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(2, 7)),
                  int(rng.choice([4, 8])))
    shape = (b, h, s, d)
    modes = ["grouper", "absent", "none"] + [str(m) for m in rng.choice(["grouper", "absent", "none"],
                                                                         size=int(rng.integers(1, 4)))]
    modes = [modes[i] for i in rng.permutation(len(modes))]
    calls = []
    for mode in modes:
        names = ["extra_%x" % int(rng.integers(1 << 24)) for _ in range(int(rng.integers(0, 3)))]
        calls.append({"mode": mode, "kwargs": {n: float(rng.normal()) for n in names},
                      "factor": float(rng.uniform(0.5, 4.0)),
                      # half the grouper calls hand a further prefix_grouper to attn_func: that one
                      # must reach the original attention (which ignores it), not a second wrapper
                      "inner": float(rng.uniform(5.0, 9.0)) if rng.random() < 0.5 else 0.0})
    args = {"q": rng.normal(size=shape).astype(np.float32), "k": rng.normal(size=shape).astype(np.float32),
            "v": rng.normal(size=shape).astype(np.float32), "scaling": float(rng.uniform(0.2, 1.0)),
            "causal": bool(rng.random() < 0.5), "patches": int(rng.integers(2, 4)), "calls": calls}
    out = run(PATCH, args, timeout=200)
    want = reference(PATCH, args, timeout=200)
    same(out["plain"], want["plain"], atol=1e-5, path="sdpa attention before the patch (compared with the reference)")
    for i, (c, got, ref) in enumerate(zip(calls, out["calls"], want["calls"], strict=True)):
        label = {"grouper": "with a prefix_grouper", "absent": "without a prefix_grouper",
                 "none": "with prefix_grouper=None"}[c["mode"]]
        same(got, ref, atol=1e-5,
             path=f"call {i + 1}, {label}, keywords {sorted(c['kwargs'])} (compared with the reference)")
