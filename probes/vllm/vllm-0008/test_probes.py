"""Hidden probes for vllm-0008 (selective_state_update for speculative decoding: packed
variable-length sequences, per-token intermediate states, initial state chosen by the number of
accepted tokens).

The judge never imports vllm or torch. Every scenario is drawn fresh for each attempt: the
sizes (heads, groups, dim, dstate), the number of sequences, their lengths (empty ones
included), the accepted-token counts, the slot tables (a random placement of the slots in the
cache, pad ids at random places), the state cache's dtype, and all the numbers (states, x, dt,
A, B, C, D, z, dt_bias). The judge sends them to a driver that runs selective_state_update on
one GPU and sends back the whole state cache and the outputs, and decides from two things:

- its own float64 recurrence, the one the instruction states (softplus(dt + dt_bias), state =
  state * exp(A * dt) + dt * B * x, out = state . C + D * x, gated by z * sigmoid(z)), reading
  and writing slots by the instruction's rules: every written slot and every specified output
  within a tolerance, every other slot bit for bit as it was;
- a reference child (gold on the same inputs, on the GPU too) whose cache and specified
  outputs must agree within the same tolerance.

The state cache the driver hands to the kernel is a view one slot into a larger buffer whose
first slot holds a guard value drawn by the judge, so a write to the pad slot id (-1) lands in
that guard slot, which the judge also checks."""

import numpy as np

from infradev_probe import fresh, reference, run, same

PAD = -1
RTOL, ATOL = 1e-3, 2e-3

_DRIVER = r'''
import os

os.environ.setdefault("USER", "infradev-probe")  # torch's caches name a user; the probe's has none

import numpy as np
import torch

from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update

dev = torch.device("cuda", 0)
_KEYS = ("cu_seqlens", "state_batch_indices", "dst_state_batch_indices", "num_accepted_tokens")
_INPUTS = ("x", "dt", "A", "B", "C", "D", "dt_bias", "z")


def dev_tensor(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def make(case):
    """Device tensors for a case; the state cache is a view one slot into a guard buffer."""
    st = dev_tensor(case["state"])
    backing = torch.full((st.shape[0] + 1,) + tuple(st.shape[1:]), ARGS["guard"],
                         dtype=st.dtype, device=dev)
    backing[1:].copy_(st)
    t = {"backing": backing, "state": backing[1:]}
    for k in _INPUTS:
        if k in case:
            t[k] = dev_tensor(case[k])
    t["out"] = torch.zeros_like(t["x"])
    for k in _KEYS:
        if k in case:
            t[k] = dev_tensor(case[k])
    return t


def call(t):
    kw = {k: t[k] for k in _KEYS if k in t}
    selective_state_update(
        t["state"], t["x"], t["dt"], t["A"], t["B"], t["C"], D=t["D"], z=t.get("z"),
        dt_bias=t["dt_bias"], dt_softplus=True, pad_slot_id=ARGS["pad"], out=t["out"], **kw)


def result(t):
    return {"backing": t["backing"].cpu().numpy(), "out": t["out"].cpu().numpy()}
'''

_EAGER = _DRIVER + r'''
results = []
for case in ARGS["cases"]:
    t = make(case)
    call(t)
    torch.cuda.synchronize()
    results.append(result(t))
emit(results=results)
'''

_GRAPH = _DRIVER + r'''
rounds = ARGS["rounds"]
t = make(rounds[0])
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    call(t)  # compile and warm up outside the capture
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    call(t)
torch.cuda.synchronize()
results = []
for case in rounds:
    # New contents in the captured tensors, then a replay: nothing is captured again.
    t["backing"][0].fill_(ARGS["guard"])
    t["state"].copy_(dev_tensor(case["state"]))
    for k in _INPUTS + _KEYS:
        if k in case:
            t[k].copy_(dev_tensor(case[k]))
    t["out"].zero_()
    graph.replay()
    torch.cuda.synchronize()
    results.append(result(t))
emit(results=results)
'''


# ---- the judge's draws ----

def _shape(rng):
    """Heads, groups, dim and dstate of one probe: dim and dstate need not fill the kernel's
    blocks, and several heads share a group of B and C."""
    heads = int(rng.choice([2, 4, 6, 8]))
    groups = int(rng.choice([g for g in (1, 2, 3) if heads % g == 0 and g < heads]))
    return {"heads": heads, "groups": groups, "dim": int(rng.integers(8, 72)),
            "dstate": int(rng.choice([8, 12, 16, 24, 32]))}


def _inputs(rng, shape, slots, tokens, with_z, state_dtype=np.float32):
    h, g, d, n = shape["heads"], shape["groups"], shape["dim"], shape["dstate"]
    case = {
        "state": rng.standard_normal((slots, h, d, n)).astype(state_dtype),
        "x": rng.standard_normal((tokens, h, d)).astype(np.float32),
        "dt": rng.standard_normal((tokens, h, d)).astype(np.float32),
        "A": (-rng.random((h, d, n)) - 1.0).astype(np.float32),
        "B": rng.standard_normal((tokens, g, n)).astype(np.float32),
        "C": rng.standard_normal((tokens, g, n)).astype(np.float32),
        "D": rng.standard_normal((h, d)).astype(np.float32),
        "dt_bias": (rng.random((h, d)) - 4.0).astype(np.float32),
    }
    if with_z:
        case["z"] = rng.standard_normal((tokens, h, d)).astype(np.float32)
    return case


def _guard(rng):
    return float(rng.integers(300, 2000))  # exact in float16 and float32, far from any state


def _cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _with_values(rng, lo, hi, n, must):
    """n integers in [lo, hi] that include every value of must (as far as n allows), shuffled."""
    vals = [int(v) for v in must[:n]] + [int(v) for v in rng.integers(lo, hi + 1, n - min(n, len(must)))]
    rng.shuffle(vals)
    return vals


def _spec_case(rng, shape, n, width, lens, accepted, with_dst, with_z, pad_dst=0,
               state_dtype=np.float32, cu_seqlens=True):
    """Packed sequences with accepted-token counts. Every column of every row of the source
    table names a real slot of its own, so reading the wrong column reads a wrong state;
    destination columns name slots of their own too, except pad_dst entries within the
    sequences, which hold the pad id; columns past a sequence's end name real slots that must
    stay untouched. The slots are scattered over the cache in a random order, with spares."""
    need = n * width * (2 if with_dst else 1)
    slots = need + int(rng.integers(1, 5))
    perm = rng.permutation(slots).astype(np.int32)
    src = perm[:n * width].reshape(n, width).copy()
    dst = perm[n * width:need].reshape(n, width).copy() if with_dst else None
    inside = [(b, c) for b in range(n) for c in range(lens[b])]
    if pad_dst and inside:
        for i in rng.choice(len(inside), size=min(pad_dst, len(inside)), replace=False):
            (dst if with_dst else src)[inside[i]] = PAD
    case = _inputs(rng, shape, slots, int(sum(lens)), with_z, state_dtype)
    case.update(state_batch_indices=src, num_accepted_tokens=np.array(accepted, dtype=np.int32))
    if cu_seqlens:
        case["cu_seqlens"] = _cu(lens)
    if with_dst:
        case["dst_state_batch_indices"] = dst
    return case


# ---- the judge's reference ----

def _softplus(v):
    return np.where(v <= 20.0, np.log1p(np.exp(np.minimum(v, 20.0))), v)


def _step(case, s, tok):
    """One token of the recurrence for every head: returns the new state and the output."""
    f = lambda k: case[k].astype(np.float64)
    heads = s.shape[0]
    group = np.arange(heads) // (heads // case["B"].shape[1])
    x, dt = f("x")[tok], _softplus(f("dt")[tok] + f("dt_bias"))
    b, c = f("B")[tok][group], f("C")[tok][group]
    s = s * np.exp(f("A") * dt[..., None]) + (dt[..., None] * b[:, None, :]) * x[..., None]
    out = (s * c[:, None, :]).sum(-1) + x * f("D")
    if "z" in case:
        z = f("z")[tok]
        out = out * z / (1.0 + np.exp(-z))
    return s, out


def _bounds(case):
    if "cu_seqlens" in case:
        cu = [int(v) for v in case["cu_seqlens"]]
        return [(cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    return [(i, i + 1) for i in range(case["x"].shape[0])]


def _table(t, n):
    return None if t is None else np.asarray(t).reshape(n, -1)


def _expected(case):
    """Expected (state cache, outputs, written slots, specified output rows) by the
    instruction's rules."""
    state0 = case["state"].astype(np.float64)
    state = state0.copy()
    out = np.zeros(case["x"].shape, dtype=np.float64)
    written, rows = set(), []
    bounds = _bounds(case)
    src = _table(case.get("state_batch_indices"), len(bounds))
    dst = _table(case.get("dst_state_batch_indices"), len(bounds))
    dst = src if dst is None else dst
    spec = "num_accepted_tokens" in case
    for b, (lo, hi) in enumerate(bounds):
        if hi == lo:
            continue  # an empty sequence reads and writes nothing
        if spec:
            slot = int(src[b, max(int(case["num_accepted_tokens"][b]) - 1, 0)])
        else:
            slot = b if src is None else int(src[b, 0])
        if slot == PAD:
            continue  # neither read nor written; its outputs are unspecified
        s = state0[slot].copy()
        for i, tok in enumerate(range(lo, hi)):
            s, out[tok] = _step(case, s, tok)
            rows.append(tok)
            if spec:
                d = int(dst[b, i])
                if d != PAD:
                    state[d] = s
                    written.add(d)
        if not spec:
            d = b if dst is None else int(dst[b, 0])
            state[d] = s
            written.add(d)
    return state, out, written, rows


def _check(case, got, want, guard, label):
    """got (the submission's child) against the judge's recurrence, and against want (the
    reference child's result on the same case) where the instruction specifies the result."""
    state, out, written, rows = _expected(case)
    backing = got["backing"]
    assert isinstance(backing, np.ndarray) and backing.dtype == case["state"].dtype, (
        f"{label}: the state cache changed dtype")
    assert backing.shape == (state.shape[0] + 1,) + state.shape[1:], (
        f"{label}: the state cache changed shape")
    assert np.all(backing[0] == guard), (
        f"{label}: the kernel wrote a state to the pad slot id {PAD} (the guard slot before "
        "the cache changed)")
    assert got["out"].shape == out.shape, f"{label}: out changed shape"
    for tok in rows:
        np.testing.assert_allclose(got["out"][tok], out[tok], rtol=RTOL, atol=ATOL,
                                   err_msg=f"{label}: output of token {tok}")
    for slot in range(state.shape[0]):
        if slot in written:
            np.testing.assert_allclose(backing[slot + 1].astype(np.float64), state[slot],
                                       rtol=RTOL, atol=ATOL, err_msg=f"{label}: state slot {slot}")
        else:
            assert np.array_equal(backing[slot + 1], case["state"][slot]), (
                f"{label}: state slot {slot} must not be written, but it changed")
    f64 = lambda r: {"backing": r["backing"].astype(np.float64), "out": r["out"][rows].astype(np.float64)}
    same(f64(got), f64(want), rtol=RTOL, atol=ATOL, path=f"{label} against the reference")


def _run_both(driver, args, listed):
    """The submission's results and the reference's, one per case of args[listed]."""
    got = run(driver, args, timeout=600)["results"]
    want = reference(driver, args, timeout=600)["results"]
    n = len(args[listed])
    assert isinstance(got, list) and len(got) == n, f"the driver sent {len(got)} results, want {n}"
    assert len(want) == n, "the reference sent a wrong number of results"
    return got, want


def test_spec_decoding_writes_each_token_state():
    rng = fresh()
    shape = _shape(rng)
    cases = []
    # Packed sequences: accepted 0 (first column), all (last column) and in between; pad ids
    # among the destinations inside the sequences; real slots past each sequence's end; the
    # cache in float32 or float16.
    n, width = int(rng.integers(3, 7)), int(rng.integers(2, 6))
    lens = _with_values(rng, 1, width, n, [width, 1])
    accepted = _with_values(rng, 0, width, n, [0, width, int(rng.integers(1, width + 1))])
    cases.append(_spec_case(rng, shape, n, width, lens, accepted, True, bool(rng.integers(2)),
                            pad_dst=int(rng.integers(1, 4)),
                            state_dtype=[np.float32, np.float16][int(rng.integers(2))]))
    # No destination table: each token's state goes to the source table's slot of its column;
    # an empty sequence among them.
    n, width = int(rng.integers(2, 6)), int(rng.integers(2, 6))
    lens = _with_values(rng, 0, width, n, [0, width])
    accepted = _with_values(rng, 0, width, n, [width, 0])
    cases.append(_spec_case(rng, shape, n, width, lens, accepted, False, bool(rng.integers(2))))
    # One token per sequence (no cu_seqlens): the accepted counts still pick the initial slot.
    n, width = int(rng.integers(2, 7)), int(rng.integers(2, 5))
    accepted = _with_values(rng, 0, width, n, [0, width])
    cases.append(_spec_case(rng, shape, n, width, [1] * n, accepted, True, bool(rng.integers(2)),
                            cu_seqlens=False))
    args = {"cases": cases, "pad": PAD, "guard": _guard(rng)}
    got, want = _run_both(_EAGER, args, "cases")
    for i, (case, g, w) in enumerate(zip(cases, got, want)):
        _check(case, g, w, args["guard"], f"spec-decoding case {i}")


def test_varlen_without_spec_decoding():
    rng = fresh()
    shape = _shape(rng)
    cases = []
    # Packed sequences (at least one empty) with 1-D source and destination tables, all slots
    # distinct and scattered.
    n = int(rng.integers(3, 7))
    lens = _with_values(rng, 0, 4, n, [0, int(rng.integers(2, 5))])
    slots = 2 * n + int(rng.integers(1, 5))
    perm = rng.permutation(slots).astype(np.int32)
    case = _inputs(rng, shape, slots, sum(lens), bool(rng.integers(2)))
    case.update(cu_seqlens=_cu(lens), state_batch_indices=perm[:n].copy(),
                dst_state_batch_indices=perm[n:2 * n].copy())
    cases.append(case)
    # In place without tables: sequence b reads and writes slot b.
    n = int(rng.integers(2, 6))
    lens = _with_values(rng, 0, 4, n, [int(rng.integers(1, 5))])
    case = _inputs(rng, shape, n + int(rng.integers(0, 3)), sum(lens), bool(rng.integers(2)))
    case["cu_seqlens"] = _cu(lens)
    cases.append(case)
    # 2-D tables: only column 0 is used; the other columns name real slots left untouched.
    n, width = int(rng.integers(2, 6)), int(rng.integers(2, 5))
    lens = _with_values(rng, 0, 4, n, [int(rng.integers(1, 5))])
    slots = 2 * n * width + int(rng.integers(1, 4))
    perm = rng.permutation(slots).astype(np.int32)
    case = _inputs(rng, shape, slots, sum(lens), bool(rng.integers(2)))
    case.update(cu_seqlens=_cu(lens), state_batch_indices=perm[:n * width].reshape(n, width).copy(),
                dst_state_batch_indices=perm[n * width:2 * n * width].reshape(n, width).copy())
    cases.append(case)
    # Today's single-token batch mode (no cu_seqlens), in place, with padded entries.
    n = int(rng.integers(3, 8))
    slots = n + int(rng.integers(1, 4))
    src = rng.permutation(slots)[:n].astype(np.int32)
    src[rng.choice(n, size=int(rng.integers(1, n)), replace=False)] = PAD
    case = _inputs(rng, shape, slots, n, bool(rng.integers(2)))
    case["state_batch_indices"] = src
    cases.append(case)
    args = {"cases": cases, "pad": PAD, "guard": _guard(rng)}
    got, want = _run_both(_EAGER, args, "cases")
    for i, (case, g, w) in enumerate(zip(cases, got, want)):
        _check(case, g, w, args["guard"], f"varlen case {i}")


def _lens_summing(rng, n, width, total, empty):
    """n lengths in [0, width] summing to total, one of them 0 when empty is set."""
    while True:
        lens = [0] * n
        free = [b for b in range(n)]
        if empty:
            free.remove(int(rng.integers(n)))
        for _ in range(total):
            b = free[int(rng.integers(len(free)))]
            lens[b] += 1
            if lens[b] == width:
                free.remove(b)
            if not free:
                break
        if sum(lens) == total:
            return lens


def test_graph_replay_reads_metadata_on_device():
    rng = fresh()
    shape = _shape(rng)
    n, width = int(rng.integers(3, 6)), int(rng.integers(2, 5))
    total = int(rng.integers(n, (n - 1) * width + 1))  # room for an empty sequence
    nrounds = int(rng.integers(3, 6))
    with_z = bool(rng.integers(2))
    # Every round has the same shapes (total tokens, n sequences, width columns); only the
    # contents of the captured tensors change between replays: boundaries (an empty sequence
    # in some rounds), accepted counts, slot tables and inputs.
    empties = [False] + [bool(v) for v in rng.integers(0, 2, nrounds - 1)]
    empties[int(rng.integers(1, nrounds))] = True
    rounds = []
    for r in range(nrounds):
        lens = _lens_summing(rng, n, width, total, empties[r])
        accepted = [int(v) for v in rng.integers(0, width + 1, n)]
        case = _spec_case(rng, shape, n, width, lens, accepted, True, with_z)
        rounds.append(case)
    # The same cache size in every round (the captured tensors keep their shapes).
    slots = max(c["state"].shape[0] for c in rounds)
    for c in rounds:
        extra = slots - c["state"].shape[0]
        if extra:
            c["state"] = np.concatenate(
                [c["state"], rng.standard_normal((extra,) + c["state"].shape[1:]).astype(np.float32)])
    args = {"rounds": rounds, "pad": PAD, "guard": _guard(rng)}
    got, want = _run_both(_GRAPH, args, "rounds")
    for i, (case, g, w) in enumerate(zip(rounds, got, want)):
        _check(case, g, w, args["guard"], f"graph replay {i}")
