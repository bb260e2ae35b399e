"""Hidden probes for vllm-0007 (EPLB: vectorized exchange planning, slot-preserving placements,
balancedness logging interval).

The judge never imports vllm or torch. Each probe runs a driver in a child process; for the GPU
probes the driver forks one process per GPU (rank), the ranks join NCCL groups, run the code under
test and send back plain data (the point-to-point operations they issued, the weights and maps
they end with). Everything is drawn fresh for each attempt: placements, loads, sizes, policy
shapes, configuration values, and the expert weights themselves: weight k of logical expert e in
layer l holds (column * mult + base[l][e][k]) mod 2**24 - 3, with mult and the (distinct) bases
drawn by the judge, which evaluates the same formula. The judge derives the transfer plan from
the instruction's rule and applies the instruction's slot-preserving rule itself; placements the
policy computes without the old placement come from reference children (gold, on the same
inputs), and so does the placement EplbState ends with, which the submission's must equal.
Every scenario runs in a child of its own."""

import json

import numpy as np

from infradev_probe import RANKS_PRELUDE, fresh, reference, run, same

_MOD = (1 << 24) - 3  # every value stays an integer that float32 holds exactly

_SPAWN = RANKS_PRELUDE + r'''
import datetime
import os
import time
import types

os.environ.setdefault("USER", "infradev-probe")  # torch's caches name a user; the probe's has none

import torch


def expert_row(layer, logical, k, cols):
    v = (torch.arange(cols, dtype=torch.int64) * ARGS["mult"] + ARGS["base"][layer][logical][k]) % ARGS["mod"]
    return v.to(torch.float32)


def layer_weights(layer, row, rank, local, hidden, dev):
    return [torch.stack([expert_row(layer, row[rank * local + i], k, h) for i in range(local)]).to(dev)
            for k, h in enumerate(hidden)]
'''

_TRAFFIC = _SPAWN + r'''
def traffic(rank, world, port, args):
    import torch.distributed as dist
    import vllm.distributed.eplb.rebalance_execute as rex
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=world,
                            device_id=dev, timeout=datetime.timedelta(seconds=180))
    warm = torch.ones(1, device=dev)
    dist.all_reduce(warm)
    torch.cuda.synchronize()
    real = rex.batch_isend_irecv
    batches = []

    def spy(ops):
        rec = []
        for op in ops:
            kind = getattr(op.op, "__name__", str(op.op))
            first = float(op.tensor.reshape(-1)[0].item()) if kind == "isend" else None
            rec.append({"kind": kind, "peer": int(op.peer), "numel": int(op.tensor.numel()),
                        "first": first})
        batches.append(rec)
        return real(ops)

    rex.batch_isend_irecv = spy
    local, hidden = args["local"], args["hidden"]
    weights = [layer_weights(0, args["old"], rank, local, hidden, dev)]
    torch.cuda.synchronize()
    rex.rearrange_expert_weights_inplace(
        torch.tensor([args["old"]], dtype=torch.long), torch.tensor([args["new"]], dtype=torch.long),
        weights, dist.group.WORLD)
    torch.cuda.synchronize()
    return {"batches": batches, "weights": [w.cpu().numpy() for w in weights[0]]}


emit(ranks=spawn_ranks(4, traffic, ARGS, 240))
'''

_STATE = _SPAWN + r'''
class _MoE:
    """A stand-in MoE model with the attributes EplbState reads."""


def state_flow(rank, world, port, args):
    from vllm.config.parallel import EPLBConfig, ParallelConfig
    from vllm.distributed import parallel_state as ps
    from vllm.distributed.eplb.eplb_state import EplbState
    dev = torch.device("cuda", rank)
    ps.set_custom_all_reduce(False)
    ps.init_distributed_environment(world_size=world, rank=rank,
                                    distributed_init_method=f"tcp://127.0.0.1:{port}",
                                    local_rank=rank, backend="nccl")
    ps.ensure_model_parallel_initialized(tensor_model_parallel_size=world,
                                         pipeline_model_parallel_size=1)
    ep = ps.get_ep_group()
    w = torch.ones(1, device=dev)
    torch.distributed.all_reduce(w, group=ep.device_group)
    torch.cuda.synchronize()

    layers, local, logical, hidden = args["layers"], args["local"], args["logical"], args["hidden"]
    physical = local * world
    initial = args["initial"]
    model = _MoE()
    model.num_moe_layers = layers
    model.num_logical_experts = logical
    model.num_routed_experts = logical
    model.num_physical_experts = physical
    model.num_local_physical_experts = local
    model.num_redundant_experts = physical - logical
    model.num_expert_groups = 1
    model.num_shared_experts = 0
    model.expert_weights = [layer_weights(l, initial, rank, local, hidden, dev) for l in range(layers)]
    held = {}

    def set_eplb_state(expert_load_view, logical_to_physical_map, logical_replica_count):
        held["load"] = expert_load_view

    model.set_eplb_state = set_eplb_state
    model_config = types.SimpleNamespace(model="probe-moe", compute_hash=lambda: "probe-moe")
    parallel = ParallelConfig(eplb_config=EPLBConfig(window_size=4, step_interval=1_000_000))
    state = EplbState(parallel, dev)
    state.add_model(model, model_config)
    # The next step() reaches the (very long) interval: exactly one rearrangement in this run.
    state.expert_rearrangement_step = state.expert_rearrangement_step_interval - 1
    held["load"] += torch.tensor(args["load"], dtype=torch.int32, device=dev)
    state.step()
    torch.cuda.synchronize()
    ms = next(iter(state.model_states.values()))
    return {
        "p2l": ms.physical_to_logical_map.cpu().numpy(),
        "l2p": ms.logical_to_physical_map.cpu()[:, :, :physical].numpy(),
        "count": ms.logical_replica_count.cpu().numpy(),
        "weights": [[x.cpu().numpy() for x in ws] for ws in model.expert_weights],
    }


emit(ranks=spawn_ranks(2, state_flow, ARGS, 240))
'''

_POLICY = r'''
import os

os.environ.setdefault("USER", "infradev-probe")

import torch
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy


def plain(res):
    p2l, l2p, cnt = res
    return {"p2l": p2l.cpu().numpy(), "l2p": l2p.cpu().numpy(), "count": cnt.cpu().numpy()}


out = {"raw": []}
for w in ARGS["weights"]:
    args = (torch.tensor(w, dtype=torch.int64), ARGS["replicas"], ARGS["groups"], ARGS["nodes"], ARGS["ranks"])
    out["raw"].append(plain(DefaultEplbPolicy.rebalance_experts(*args)))
out["olds"] = {}
for name, old in ARGS["olds"].items():
    args = (torch.tensor(ARGS["weights"][0], dtype=torch.int64), ARGS["replicas"], ARGS["groups"],
            ARGS["nodes"], ARGS["ranks"])
    out["olds"][name] = plain(DefaultEplbPolicy.rebalance_experts(
        *args, old_global_expert_indices=torch.tensor(old, dtype=torch.int64)))
emit(**out)
'''

_CONFIG = r'''
import os

os.environ.setdefault("USER", "infradev-probe")

import pydantic
from vllm.config.parallel import EPLBConfig


def outcome(fn):
    try:
        value = fn()
    except ValueError:
        return "ValueError"
    except BaseException as e:
        return type(e).__name__
    return value


adapter = pydantic.TypeAdapter(EPLBConfig)
out = []
for c in ARGS["cases"]:
    if c["how"] == "keyword":
        out.append(outcome(lambda: EPLBConfig(**c["given"]).log_balancedness_interval))
    else:
        out.append(outcome(lambda: adapter.validate_json(c["json"]).log_balancedness_interval))
emit(results=out)
'''


# ---- the judge's references ----

def _formula(rng, layers, logical, weights):
    """The weights' formula: mult and a distinct base for every (layer, expert, weight)."""
    n = layers * logical * weights
    base = rng.choice(_MOD, size=n, replace=False).reshape(layers, logical, weights)
    return {"mod": _MOD, "mult": int(rng.integers(1, _MOD)), "base": base.tolist()}


def _expert_row(f, layer, logical, k, cols):
    v = (np.arange(cols, dtype=np.int64) * f["mult"] + f["base"][layer][logical][k]) % f["mod"]
    return v.astype(np.float64)


def _expected(f, row, rank, local, layer, k, cols):
    return np.stack([_expert_row(f, layer, row[rank * local + i], k, cols) for i in range(local)])


def _same(got, want, what):
    assert isinstance(got, np.ndarray), f"{what}: got {type(got).__name__}, want an array"
    got = got.astype(np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    bad = np.argwhere(got != want)
    if bad.size:
        slot = int(bad[0][0])
        raise AssertionError(f"{what}: {len(bad)} wrong values; slot {slot} holds "
                             f"{got[slot][:3].tolist()}..., want {want[slot][:3].tolist()}...")


def _holders_needers(old, new, local):
    holders, needers = {}, {}
    for p, e in enumerate(old):
        if e >= 0 and p // local not in holders.setdefault(e, []):
            holders[e].append(p // local)
    for p, e in enumerate(new):
        r = p // local
        if e >= 0 and r not in holders.get(e, []) and r not in needers.setdefault(e, []):
            needers[e].append(r)
    return holders, needers


def _plan(old, new, local):
    """The instruction's transfer plan: (sender, receiver, expert) triples."""
    holders, needers = _holders_needers(old, new, local)
    plan = []
    for e, R in needers.items():
        S = sorted(holders.get(e, []))
        R = sorted(R)
        if not S or not R:
            continue
        q = len(R) // len(S)
        for i, r in enumerate(R):
            s = S[i // q] if i < q * len(S) else S[i - q * len(S)]
            plan.append((s, r, e))
    return plan


def _row(rng, size, logical):
    row = list(range(logical)) + [int(v) for v in rng.integers(0, logical, size - logical)]
    return [int(v) for v in rng.permutation(row)]


def _traffic_placement(rng, world, local, logical):
    """Old and new placements of one layer over the ranks in which: an expert held by two or
    more ranks is needed by two or more others (the receivers split among the holders), some
    rank needs a remote expert in two of its slots (one receive), some slot moves within its
    rank, some slot keeps its expert, and every rank sends or receives something."""
    while True:
        old, new = _row(rng, world * local, logical), _row(rng, world * local, logical)
        holders, needers = _holders_needers(old, new, local)
        split = any(len(holders[e]) >= 2 and len(needers.get(e, [])) >= 2 for e in holders)
        twice = any(sum(1 for i in range(local) if new[r * local + i] == e) >= 2
                    for e, R in needers.items() for r in R)
        moved = any(old[p] != new[p] and new[p] in old[(p // local) * local:(p // local + 1) * local]
                    for p in range(world * local))
        kept = any(old[p] == new[p] for p in range(world * local))
        plan = _plan(old, new, local)
        busy = all(any(r in (s, d) for s, d, _ in plan) for r in range(world))
        if split and twice and moved and kept and busy:
            return old, new


def test_exchange_follows_the_transfer_plan():
    # Four ranks rearrange one layer: the point-to-point operations each rank issues are exactly
    # the plan of the instruction (receivers split among holders, one receive per rank and remote
    # expert, nothing for experts a rank already holds), in one batch, and the weights end up in
    # place.
    rng = fresh()
    world, local = 4, int(rng.integers(3, 6))
    logical = int(rng.integers(local + 2, 2 * local + 1))
    old, new = _traffic_placement(rng, world, local, logical)
    hidden = [int(v) for v in rng.integers(8, 65, int(rng.integers(1, 4)))]
    f = _formula(rng, 1, logical, len(hidden))
    which = {f["base"][0][e][k]: (e, k) for e in range(logical) for k in range(len(hidden))}
    args = dict(f, old=old, new=new, local=local, hidden=hidden)
    ranks = run(_TRAFFIC, args, timeout=300)["ranks"]
    plan = _plan(old, new, local)
    assert isinstance(ranks, list) and len(ranks) == world, "the driver sent no result for every rank"
    for rank, r in enumerate(ranks):
        batches = [b for b in r["batches"] if b]
        want_batches = 1 if any(rank in (s, d) for s, d, _ in plan) else 0
        assert len(batches) == want_batches, (
            f"rank {rank}: {len(batches)} batches of point-to-point operations, want {want_batches}")
        ops = batches[0] if batches else []
        other = [o["kind"] for o in ops if o["kind"] not in ("isend", "irecv")]
        assert not other, f"rank {rank}: unexpected operations {other}"
        sends = []
        for o in ops:
            if o["kind"] == "isend":
                e, k = which.get(o["first"], (None, None))
                sends.append((o["peer"], e, k, o["numel"]))
        recvs = sorted((o["peer"], o["numel"]) for o in ops if o["kind"] == "irecv")
        want_sends = sorted((d, e, k, hidden[k]) for s, d, e in plan if s == rank for k in range(len(hidden)))
        want_recvs = sorted((s, hidden[k]) for s, d, e in plan if d == rank for k in range(len(hidden)))
        assert sorted(sends, key=repr) == sorted(want_sends, key=repr), (
            f"rank {rank} sent (peer, expert, weight, elements) {sorted(sends, key=repr)}; the plan is {want_sends}")
        assert recvs == want_recvs, (
            f"rank {rank} received (peer, elements) {recvs}; the plan is {want_recvs}")
        assert isinstance(r["weights"], list) and len(r["weights"]) == len(hidden)
        for k, w in enumerate(r["weights"]):
            _same(w, _expected(f, new, rank, local, 0, k, hidden[k]), f"rank {rank}, weight {k}")


def _preserve(raw, old, ranks):
    """The instruction's slot-preserving rule, per layer and rank."""
    raw = [list(map(int, row)) for row in raw]
    old = [list(map(int, row)) for row in old]
    out = []
    for new_row, old_row in zip(raw, old):
        slots = len(new_row) // ranks
        row = list(new_row)
        for g in range(ranks):
            new_seg = new_row[g * slots:(g + 1) * slots]
            old_seg = old_row[g * slots:(g + 1) * slots]
            claimed = [False] * slots
            kept = [False] * slots
            seg = [None] * slots
            for s, e in enumerate(old_seg):
                for j, x in enumerate(new_seg):
                    if not claimed[j] and x == e:
                        claimed[j], kept[s], seg[s] = True, True, e
                        break
            rest = [x for j, x in enumerate(new_seg) if not claimed[j]]
            for s in range(slots):
                if not kept[s]:
                    seg[s] = rest.pop(0)
            row[g * slots:(g + 1) * slots] = seg
        out.append(row)
    return out


def _check_maps(p2l, l2p, count, logical, what):
    p2l, l2p, count = np.asarray(p2l), np.asarray(l2p), np.asarray(count)
    assert count.shape == (p2l.shape[0], logical), f"{what}: replica counts of shape {count.shape}"
    assert l2p.ndim == 3 and l2p.shape[:2] == (p2l.shape[0], logical), f"{what}: log2phy of shape {l2p.shape}"
    for layer, row in enumerate(p2l.tolist()):
        for e in range(logical):
            slots = sorted(p for p, x in enumerate(row) if x == e)
            assert int(count[layer][e]) == len(slots), (
                f"{what}, layer {layer}: replica count of expert {e} is {int(count[layer][e])}, "
                f"the placement {row} holds it {len(slots)} times")
            listed = l2p[layer][e].tolist()
            assert sorted(listed[:len(slots)]) == slots and all(x == -1 for x in listed[len(slots):]), (
                f"{what}, layer {layer}: logical-to-physical entry of expert {e} is {listed}, "
                f"the placement {row} puts it in slots {slots}")


def _policy_shape(rng):
    """A policy call: hierarchical (groups divisible by nodes) or global, two or more slots per
    rank."""
    nodes = int(rng.choice([1, 2]))
    ranks = nodes * int(rng.integers(1, 4))
    ranks = max(ranks, 2)
    if rng.integers(3):
        groups = nodes * int(rng.integers(1, 4))  # hierarchical
    else:
        groups = int(rng.choice([g for g in (1, 3, 5) if g % nodes])) if nodes > 1 else 1
    logical = groups * int(rng.integers(1, 5))
    while logical < 2:
        logical += groups
    slots = max(2, -(-logical // ranks)) + int(rng.integers(0, 3))
    return {"replicas": ranks * slots, "groups": groups, "nodes": nodes, "ranks": ranks,
            "logical": logical, "slots": slots, "layers": int(rng.integers(1, 4))}


def _olds(rng, raw, ranks, slots, logical):
    """Old placements for the policy: each made from the placement it gives without one (raw)."""
    def per_rank(row, fn):
        return sum((fn(g, list(row[g * slots:(g + 1) * slots])) for g in range(ranks)), [])

    olds = {}
    # Every rank keeps its experts: its slots reversed, or shuffled.
    olds["reversed"] = [per_rank(row, lambda g, seg: seg[::-1]) for row in raw]
    olds["shuffled"] = [per_rank(row, lambda g, seg: [seg[i] for i in rng.permutation(len(seg))]) for row in raw]
    # Two ranks trade a slot, then every rank's slots are rotated.
    traded = []
    for row in raw:
        r = list(row)
        a, b = (int(v) for v in rng.choice(ranks, 2, replace=False))
        i, j = a * slots + int(rng.integers(slots)), b * slots + int(rng.integers(slots))
        r[i], r[j] = r[j], r[i]
        shift = int(rng.integers(1, slots))
        traded.append(per_rank(r, lambda g, seg: seg[shift:] + seg[:shift]))
    olds["traded"] = traded
    # A placement unrelated to the new one.
    olds["unrelated"] = [_row(rng, ranks * slots, logical) for _ in raw]
    return olds


def test_policy_keeps_experts_in_their_slots():
    # Told the old placement, the policy keeps every rank's experts but puts each one that stays on
    # a rank back in its old slot(s), the rest in order; log2phy and logcnt describe the result.
    # The placement without an old one comes from gold (a reference child) and must be the
    # submission's too.
    rng = fresh()
    shape = _policy_shape(rng)
    ranks, slots, logical = shape["ranks"], shape["slots"], shape["logical"]
    weights = [rng.permutation(np.arange(1, 20 * logical * shape["layers"] + 1))
               [:shape["layers"] * logical].reshape(shape["layers"], logical).tolist()]
    base = {k: shape[k] for k in ("replicas", "groups", "nodes", "ranks")}
    first = reference(_POLICY, dict(base, weights=weights, olds={}), timeout=180)
    raw = np.asarray(first["raw"][0]["p2l"]).tolist()
    olds = _olds(rng, raw, ranks, slots, logical)
    got = run(_POLICY, dict(base, weights=weights, olds=olds), timeout=180)
    assert isinstance(got["raw"], list) and len(got["raw"]) == 1
    same(got["raw"][0]["p2l"], first["raw"][0]["p2l"],
         path=f"the policy's placement without an old one ({shape})")
    _check_maps(got["raw"][0]["p2l"], got["raw"][0]["l2p"], got["raw"][0]["count"], logical,
                "the placement without an old one")
    assert isinstance(got["olds"], dict) and set(got["olds"]) == set(olds)
    for name, old in olds.items():
        p2l = np.asarray(got["olds"][name]["p2l"])
        want = np.asarray(_preserve(raw, old, ranks))
        assert p2l.shape == want.shape, f"{name}: placement shape {p2l.shape}, want {want.shape}"
        assert np.array_equal(p2l, want), (
            f"old placement '{name}': the policy returned {p2l.tolist()}; keeping each rank's "
            f"experts in their old slots gives {want.tolist()} (placement without the old one: "
            f"{raw}, old: {old}, {shape})")
        _check_maps(p2l, got["olds"][name]["l2p"], got["olds"][name]["count"], logical,
                    f"old placement '{name}'")


def _state_case(rng):
    """A 2-rank EplbState scenario whose load makes the policy move some expert between two slots
    of the rank it stays on (so keeping slots changes the result): candidate loads are run
    through gold's policy (a reference child) and the first such one is taken."""
    world, local = 2, int(rng.integers(3, 6))
    physical = world * local
    logical = physical - int(rng.integers(0, 3))
    layers = int(rng.integers(2, 4))
    initial = list(range(logical)) + [i % logical for i in range(physical - logical)]
    candidates = []
    for _ in range(8):
        # Per-physical-slot loads as the ranks record them (the same on both ranks).
        candidates.append(rng.integers(1, 1000, (layers, physical)).tolist())

    def logical_load(load):
        out = np.zeros((layers, logical), dtype=np.int64)
        for p, e in enumerate(initial):
            out[:, e] += np.asarray(load)[:, p]
        return (out * world).tolist()

    res = reference(_POLICY, {"weights": [logical_load(c) for c in candidates], "olds": {},
                              "replicas": physical, "groups": 1, "nodes": 1, "ranks": world},
                    timeout=180)
    pick = 0
    for i, r in enumerate(res["raw"]):
        raw = np.asarray(r["p2l"]).tolist()
        if _preserve(raw, [initial] * layers, world) != raw:
            pick = i
            break
    hidden = [int(v) for v in rng.integers(8, 33, 2)]
    f = _formula(rng, layers, logical, len(hidden))
    return dict(f, layers=layers, local=local, logical=logical, hidden=hidden, initial=initial,
                load=candidates[pick])


def test_eplb_state_rearrangement_keeps_slots():
    # A synchronous EplbState rearrangement on 2 GPUs passes the current placement to the policy:
    # the placement it ends with is gold's on the same loads (experts that stay on a rank keep
    # their slots), the maps agree with it, the weights follow it.
    rng = fresh()
    args = _state_case(rng)
    want = reference(_STATE, args, timeout=300)["ranks"]
    ranks = run(_STATE, args, timeout=300)["ranks"]
    assert isinstance(ranks, list) and len(ranks) == 2, "the driver sent no result for every rank"
    for rank, (r, w) in enumerate(zip(ranks, want)):
        p2l = np.asarray(r["p2l"])
        same(p2l, np.asarray(w["p2l"]), path=f"rank {rank}: the placement after the rearrangement")
        _check_maps(r["p2l"], r["l2p"], r["count"], args["logical"], f"rank {rank}")
        assert isinstance(r["weights"], list) and len(r["weights"]) == args["layers"]
        for layer in range(args["layers"]):
            row = np.asarray(w["p2l"])[layer].tolist()
            for k, x in enumerate(r["weights"][layer]):
                _same(x, _expected(args, row, rank, args["local"], layer, k, args["hidden"][k]),
                      f"rank {rank}, layer {layer}, weight {k}")


def test_balancedness_interval_config():
    # EPLBConfig.log_balancedness_interval: 1 by default, set by keyword or JSON, refused when not
    # positive while log_balancedness is on, accepted when it is off.
    rng = fresh()
    kinds = ["default", "positive", "positive", "refused", "unused"]
    kinds += [str(k) for k in rng.choice(["positive", "refused", "unused", "default"], int(rng.integers(2, 6)))]
    cases, want = [], []
    for i in rng.permutation(len(kinds)):
        kind = kinds[i]
        if kind == "default":
            given = {} if rng.integers(2) else {"log_balancedness": bool(rng.integers(2))}
            expect = 1
        elif kind == "positive":
            given = {"log_balancedness_interval": int(rng.integers(1, 10000))}
            if rng.integers(3):
                given["log_balancedness"] = bool(rng.integers(2))
            expect = given["log_balancedness_interval"]
        elif kind == "refused":
            given = {"log_balancedness": True, "log_balancedness_interval": -int(rng.integers(0, 50))}
            expect = "ValueError"
        else:
            given = {"log_balancedness_interval": -int(rng.integers(0, 50))}
            if rng.integers(2):
                given["log_balancedness"] = False
            expect = given["log_balancedness_interval"]
        if rng.integers(2):
            given["window_size"] = int(rng.integers(1, 5000))
        items = list(given.items())
        given = dict(items[j] for j in rng.permutation(len(items)))
        cases.append({"how": "keyword" if rng.integers(2) else "json", "given": given,
                      "json": json.dumps(given)})
        want.append(expect)
    got = run(_CONFIG, {"cases": cases}, timeout=180)["results"]
    assert isinstance(got, list) and len(got) == len(cases), "a result per case expected"
    for c, g, w in zip(cases, got, want):
        assert type(g) is type(w) and g == w, (
            f"EPLBConfig by {c['how']} from {c['json']}: log_balancedness_interval gave {g!r}, want {w!r}")
