"""Probes for verl-0010 (group-level data-parallel balancing for shared-prefix training).

The judge (this module) never imports verl, torch or transformers. Each probe runs a driver in a
child and gets back plain data: the partitions get_group_balanced_partitions returns for batches
the judge chose, the order RayPPOTrainer._balance_batch leaves a batch in (run on a stand-in
trainer with a fixed data-parallel size), and what a wrapped attention function returns and passes
to a recording stand-in for a PrefixGrouper. The judge checks them against the contract itself:
group integrity and equal group counts it checks directly, balance against the best split it finds
by enumerating every equal-size split (workload 24576 * s + s * s per sample, calculate_workload's
formula), attention outputs against the unwrapped function's output sent along by the child.

Everything runs on CPU.
"""

import itertools

import numpy as np

from infradev_probe import run


def _workload(s):
    return 24576 * s + s * s


def _groups(uids):
    out, start = [], 0
    for i in range(1, len(uids) + 1):
        if i == len(uids) or uids[i] != uids[start]:
            out.append(list(range(start, i)))
            start = i
    return out


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


def _cases():
    rng = np.random.default_rng(7)
    cases = {}
    # 8 prompts x 4 responses over 4 ranks, random lengths
    uids = [f"p{i}" for i in range(8) for _ in range(4)]
    cases["random-8x4-k4"] = {"seqlens": rng.integers(20, 900, size=32).tolist(), "uids": uids, "k": 4}
    # 6 prompts of uneven total size, 3 responses each, over 2 ranks
    uids = [i for i in range(6) for _ in range(3)]
    cases["uneven-6x3-k2"] = {"seqlens": [100, 120, 80, 400, 390, 410, 50, 60, 40, 250, 260, 240, 700, 690, 710, 30, 20, 10],
                              "uids": uids, "k": 2}
    # single-sample groups
    cases["singletons-k3"] = {"seqlens": [300, 20, 150, 500, 75, 260], "uids": list(range(6)), "k": 3}
    return cases


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


def test_groups_stay_whole_on_one_rank():
    cases = _cases()
    out = run(PARTS, {"cases": cases}, timeout=200)
    for name, case in cases.items():
        assert "parts" in out[name], f"{name}: get_group_balanced_partitions raised {out[name].get('error')}"
        _check_partition(name, case, out[name]["parts"])


def test_groups_are_balanced_by_workload():
    cases = {
        # four groups of two: only one pairing of the groups balances the token counts
        "pairs-4x2-k2": {"seqlens": [500, 500, 100, 100, 300, 300, 350, 350],
                         "uids": [0, 0, 1, 1, 2, 2, 3, 3], "k": 2},
        # group sizes differ: workload, not the number of samples or groups, must be balanced
        "sizes-6-k2": {"seqlens": [900] * 4 + [100] * 2 + [800] * 4 + [200] * 2 + [450] * 2 + [350] * 2,
                       "uids": [0] * 4 + [1] * 2 + [2] * 4 + [3] * 2 + [4] * 2 + [5] * 2, "k": 2},
    }
    out = run(PARTS, {"cases": cases}, timeout=200)
    for name, case in cases.items():
        assert "parts" in out[name], f"{name}: get_group_balanced_partitions raised {out[name].get('error')}"
        groups, where = _check_partition(name, case, out[name]["parts"])
        gw = [sum(_workload(case["seqlens"][i]) for i in g) for g in groups]
        k = case["k"]
        got = max(sum(gw[j] for j, g in enumerate(groups) if where[g[0]] == r) for r in range(k))
        best = None
        per = len(groups) // k
        for first in itertools.combinations(range(len(groups)), per):  # k == 2 here
            a = sum(gw[j] for j in first)
            m = max(a, sum(gw) - a)
            best = m if best is None else min(best, m)
        assert got == best, (
            f"{name}: the heaviest partition has workload {got}; a split of the groups with the same number of "
            f"groups per partition reaches {best} (group workloads {gw})")


def test_invalid_group_counts_are_refused():
    cases = {
        "too-few-groups": {"seqlens": [10, 20, 30, 40], "uids": [0, 0, 1, 1], "k": 3},
        "length-mismatch": {"seqlens": [10, 20, 30], "uids": [0, 0], "k": 1},
    }
    out = run(PARTS, {"cases": cases}, timeout=200)
    for name in cases:
        assert out[name].get("error") == "AssertionError", (
            f"{name}: get_group_balanced_partitions gave {out[name]}; want an AssertionError")


TRAINER = r"""
import types

import numpy as np
import torch

from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.workers.config import ActorConfig  # noqa: F401  (the option must exist)
import dataclasses

res = {"field": {f.name: f.default for f in dataclasses.fields(ActorConfig) if f.name == "use_prefix_grouper"}}
for name, case in ARGS["cases"].items():
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
        use_prefix_grouper=case["on"],
        config=None,
        actor_rollout_wg=None,
        _get_dp_size=lambda wg, role, k=case["dp"]: k,
    )
    metrics = {}
    try:
        RayPPOTrainer._balance_batch(fake, batch, metrics)
        res[name] = {"order": batch.batch["sample"].tolist(), "uids": [str(u) for u in batch.non_tensor_batch["uid"]],
                     "metrics": sorted(metrics)}
    except ValueError as e:
        res[name] = {"error": "ValueError"}
emit(**res)
"""


def test_trainer_balances_whole_groups():
    rng = np.random.default_rng(11)
    n_groups, n = 6, 4
    uids = [f"u{i}" for i in range(n_groups) for _ in range(n)]
    seqlens = rng.integers(10, 60, size=n_groups * n).tolist()
    cases = {
        "grouped": {"seqlens": seqlens, "uids": uids, "dp": 3, "on": True},
        "not-divisible": {"seqlens": seqlens[:20], "uids": uids[:20], "dp": 2, "on": True},
    }
    out = run(TRAINER, {"cases": cases}, timeout=300)
    assert out["field"] == {"use_prefix_grouper": False}, (
        f"ActorConfig.use_prefix_grouper: {out['field']} (want a field defaulting to False)")
    got = out["grouped"]
    assert "order" in got, f"_balance_batch with use_prefix_grouper on raised {got.get('error')}"
    order, dp = got["order"], 3
    assert sorted(order) == list(range(len(uids))), f"the reordered batch holds samples {order}"
    share = len(order) // dp
    for r in range(dp):
        part = order[r * share:(r + 1) * share]
        ids = sorted({uids[i] for i in part})
        assert len(ids) * n == share and all(sum(1 for i in part if uids[i] == u) == n for u in ids), (
            f"rank {r}'s share of the reordered batch, samples {part}, does not hold whole uid groups "
            f"({[uids[i] for i in part]})")
        assert part == sorted(part), (
            f"rank {r}'s share {part} was reordered inside the partition; with the option on, each group's "
            f"samples keep their order")
    assert got["uids"] == [uids[i] for i in order], "the uid entries were not reordered with the batch"
    assert got["metrics"], "_balance_batch recorded no balance metrics"
    assert out["not-divisible"].get("error") == "ValueError", (
        f"5 uid groups over 2 data-parallel ranks gave {out['not-divisible']}; want a ValueError")


PATCH = r"""
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from verl.models.transformers.monkey_patch import apply_prefix_grouper_patch

torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
module = torch.nn.Module()
module.is_causal = True
orig = ALL_ATTENTION_FUNCTIONS["sdpa"]
plain = orig(module, q, k, v, None, scaling=0.5)
apply_prefix_grouper_patch()
apply_prefix_grouper_patch()
wrapped = ALL_ATTENTION_FUNCTIONS["sdpa"]


class Recorder:
    def __init__(self):
        self.calls = []

    def forward(self, attn_func, q_, k_, v_, *args, **kwargs):
        inner = attn_func(q_, k_, v_, None, *args, **kwargs)
        self.calls.append({"args": len(args), "kwargs": sorted(kwargs), "inner_is_tensor": torch.is_tensor(inner),
                           "same_q": q_ is q})
        return inner * 3.0


rec = Recorder()
with_pg = wrapped(module, q, k, v, None, scaling=0.5, prefix_grouper=rec)
without = wrapped(module, q, k, v, None, scaling=0.5)
with_none = wrapped(module, q, k, v, None, scaling=0.5, prefix_grouper=None)
emit(
    changed=wrapped is not orig,
    plain=plain[0], plain_second=plain[1] is None,
    without=without[0], without_second=without[1] is None,
    with_none=with_none[0],
    with_pg=with_pg[0], with_pg_second=with_pg[1] is None,
    calls=rec.calls,
)
"""


def test_attention_hook_hands_the_call_to_prefix_grouper():
    out = run(PATCH, timeout=200)
    assert out["changed"], "apply_prefix_grouper_patch() left ALL_ATTENTION_FUNCTIONS['sdpa'] unwrapped"
    plain = np.asarray(out["plain"])
    for key in ("without", "with_none"):
        assert np.allclose(np.asarray(out[key]), plain, atol=1e-6), (
            f"the wrapped sdpa attention called {key.replace('_', ' ')} a prefix_grouper returned something other "
            f"than the original function")
    assert out["without_second"] == out["plain_second"], "the wrapped attention changed the original's return value"
    assert len(out["calls"]) == 1, f"prefix_grouper.forward was called {len(out['calls'])} times for one attention call"
    call = out["calls"][0]
    assert call["inner_is_tensor"], "attn_func handed to prefix_grouper.forward returned a tuple, not the attention output"
    assert call["same_q"], "prefix_grouper.forward did not get the query tensor it was called with"
    assert "prefix_grouper" not in call["kwargs"] and "scaling" in call["kwargs"], (
        f"prefix_grouper.forward got keyword arguments {call['kwargs']}; want the call's own (scaling), "
        f"without prefix_grouper")
    assert out["with_pg_second"], "with a prefix_grouper the wrapped attention must return (output, None)"
    assert np.allclose(np.asarray(out["with_pg"]), 3.0 * plain, atol=1e-5), (
        "with a prefix_grouper the wrapped attention did not return what prefix_grouper.forward computed")
