"""Hidden probes for vllm-0008 (selective_state_update for speculative decoding: packed
variable-length sequences, per-token intermediate states, initial state chosen by the number of
accepted tokens).

The judge never imports vllm or torch. The judge draws every input (SSM states, x, dt, A, B, C,
D, z, dt_bias, sequence boundaries and slot tables) with numpy, sends them to a driver that runs
selective_state_update on one GPU and sends back the whole state cache and the outputs, and
recomputes the expected states and outputs itself in float64 from the recurrence the instruction
states (softplus(dt + dt_bias), state = state * exp(A * dt) + dt * B * x, out = state . C + D * x,
gated by z * sigmoid(z)), reading and writing slots by the instruction's rules. The state cache
the driver hands to the kernel is a view one slot into a larger buffer, so a write to the pad
slot id (-1) lands in a guard slot the judge also checks. Every scenario runs in a child of its
own."""

import numpy as np

from infradev_probe import run

PAD = -1
GUARD = 12345.0

_DRIVER = r'''
import numpy as np
import torch

from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update

dev = torch.device("cuda", 0)
_KEYS = ("cu_seqlens", "state_batch_indices", "dst_state_batch_indices", "num_accepted_tokens")


def dev_tensor(a):
    return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


def make(case):
    """Device tensors for a case; the state cache is a view one slot into a guard buffer."""
    st = case["state"]
    backing = torch.full((st.shape[0] + 1,) + tuple(st.shape[1:]), ARGS["guard"],
                         dtype=torch.float32, device=dev)
    backing[1:].copy_(dev_tensor(st))
    t = {"backing": backing, "state": backing[1:]}
    for k in ("x", "dt", "A", "B", "C", "D", "dt_bias", "z"):
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
    for k in ("x", "dt", "A", "B", "C", "D", "dt_bias", "z", "cu_seqlens",
              "state_batch_indices", "dst_state_batch_indices", "num_accepted_tokens"):
        if k in case:
            t[k].copy_(dev_tensor(case[k]))
    t["out"].zero_()
    graph.replay()
    torch.cuda.synchronize()
    results.append(result(t))
emit(results=results)
'''


# ---- the judge's inputs and reference ----

def _inputs(rng, slots, tokens, heads=4, groups=2, dim=48, dstate=16, with_z=True):
    case = {
        "state": rng.standard_normal((slots, heads, dim, dstate)).astype(np.float32),
        "x": rng.standard_normal((tokens, heads, dim)).astype(np.float32),
        "dt": rng.standard_normal((tokens, heads, dim)).astype(np.float32),
        "A": (-rng.random((heads, dim, dstate)) - 1.0).astype(np.float32),
        "B": rng.standard_normal((tokens, groups, dstate)).astype(np.float32),
        "C": rng.standard_normal((tokens, groups, dstate)).astype(np.float32),
        "D": rng.standard_normal((heads, dim)).astype(np.float32),
        "dt_bias": (rng.random((heads, dim)) - 4.0).astype(np.float32),
    }
    if with_z:
        case["z"] = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    return case


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


def _reference(case):
    """Expected (state cache, outputs, written slots) by the instruction's rules."""
    state0 = case["state"].astype(np.float64)
    state = state0.copy()
    out = np.zeros(case["x"].shape, dtype=np.float64)
    written = set()
    src = case.get("state_batch_indices")
    dst = case.get("dst_state_batch_indices", src)
    spec = "num_accepted_tokens" in case
    for b, (lo, hi) in enumerate(_bounds(case)):
        if hi == lo:
            continue  # an empty sequence reads and writes nothing
        if spec:
            col = max(int(case["num_accepted_tokens"][b]) - 1, 0)
            slot = int(src[b, col])
        else:
            slot = b if src is None else int(np.asarray(src).reshape(len(src), -1)[b, 0])
        s = state0[slot].copy() if slot != PAD else np.zeros_like(state0[0])
        for i, tok in enumerate(range(lo, hi)):
            s, out[tok] = _step(case, s, tok)
            if spec:
                d = int(dst[b, i])
                if d != PAD:
                    state[d] = s
                    written.add(d)
        if not spec and slot != PAD:
            d = b if dst is None else int(np.asarray(dst).reshape(len(dst), -1)[b, 0])
            state[d] = s
            written.add(d)
    return state, out, written


def _check(case, got, label, check_out_rows=None):
    state, out, written = _reference(case)
    backing = got["backing"]
    assert backing.shape[0] == state.shape[0] + 1, f"{label}: the state cache changed shape"
    assert np.all(backing[0] == np.float32(GUARD)), (
        f"{label}: the kernel wrote a state to the pad slot id {PAD} (the guard slot before "
        "the cache changed)")
    rows = range(out.shape[0]) if check_out_rows is None else check_out_rows
    for tok in rows:
        np.testing.assert_allclose(got["out"][tok], out[tok], rtol=1e-3, atol=2e-3,
                                   err_msg=f"{label}: output of token {tok}")
    for slot in range(state.shape[0]):
        if slot in written:
            np.testing.assert_allclose(backing[slot + 1], state[slot], rtol=1e-3, atol=2e-3,
                                       err_msg=f"{label}: state slot {slot}")
        else:
            assert np.array_equal(backing[slot + 1], case["state"][slot]), (
                f"{label}: state slot {slot} must not be written, but it changed")


def _spec_case(rng, lens, accepted, width, with_dst, with_z, pad_dst=()):
    """Packed sequences with accepted-token counts. Every column of every row of the source
    table names a real slot of its own (0..), so reading the wrong column reads a wrong state;
    destination columns within a sequence name fresh slots, except those in pad_dst, which
    hold the pad id; columns past a sequence's end name real slots that must stay untouched."""
    n = len(lens)
    src = np.arange(n * width, dtype=np.int32).reshape(n, width)
    nxt = n * width
    dst = np.zeros((n, width), dtype=np.int32)
    for b in range(n):
        for c in range(width):
            dst[b, c] = nxt
            nxt += 1
    for b, c in pad_dst:
        dst[b, c] = PAD
    slots = nxt + 3
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    case = _inputs(rng, slots, int(cu[-1]), with_z=with_z)
    case.update(cu_seqlens=cu, state_batch_indices=src,
                num_accepted_tokens=np.array(accepted, dtype=np.int32))
    if with_dst:
        case["dst_state_batch_indices"] = dst
    return case


def test_spec_decoding_writes_each_token_state():
    rng = np.random.default_rng(8)
    cases = [
        # accepted 0 (first column), all 4 accepted (last column), and in between; one
        # destination inside a sequence is the pad id; columns past each sequence are real slots.
        _spec_case(rng, [3, 4, 1, 2, 4], [0, 4, 2, 1, 3], 4, True, True, pad_dst=[(1, 2)]),
        # no destination table: the per-token states go to the source table's slots.
        _spec_case(rng, [2, 4, 3], [2, 1, 4], 4, False, False),
        # one token per sequence (no cu_seqlens), accepted counts still pick the initial slot.
        None,
    ]
    one = _spec_case(rng, [1, 1, 1, 1], [1, 3, 0, 2], 3, True, True)
    del one["cu_seqlens"]
    cases[2] = one
    got = run(_EAGER, {"cases": cases, "pad": PAD, "guard": GUARD}, timeout=600)["results"]
    assert len(got) == len(cases)
    for i, (case, g) in enumerate(zip(cases, got)):
        _check(case, g, f"spec-decoding case {i}")


def test_varlen_without_spec_decoding():
    rng = np.random.default_rng(9)
    cu = np.array([0, 2, 2, 5, 6], dtype=np.int32)  # lengths 2, 0, 3, 1
    with_tables = _inputs(rng, 16, 6)
    with_tables.update(cu_seqlens=cu,
                       state_batch_indices=np.array([5, 9, 2, 7], dtype=np.int32),
                       dst_state_batch_indices=np.array([10, 11, 12, 13], dtype=np.int32))
    in_place = _inputs(rng, 4, 6, with_z=False)
    in_place["cu_seqlens"] = cu
    two_d = _inputs(rng, 16, 6)
    two_d.update(cu_seqlens=np.array([0, 3, 3, 4, 6], dtype=np.int32),
                 state_batch_indices=np.array([[1, 14], [3, 15], [6, 0], [8, 2]], dtype=np.int32),
                 dst_state_batch_indices=np.array([[4, 13], [5, 12], [7, 11], [9, 10]],
                                                  dtype=np.int32))
    batch = _inputs(rng, 8, 3)  # the single-token batch mode of today, with a padded entry
    batch["state_batch_indices"] = np.array([3, PAD, 6], dtype=np.int32)
    cases = [with_tables, in_place, two_d, batch]
    got = run(_EAGER, {"cases": cases, "pad": PAD, "guard": GUARD}, timeout=600)["results"]
    assert len(got) == len(cases)
    for i, (case, g) in enumerate(zip(cases, got)):
        _check(case, g, f"varlen case {i}", check_out_rows=[0, 2] if case is batch else None)


def test_graph_replay_reads_metadata_on_device():
    rng = np.random.default_rng(10)
    lens_rounds = [([2, 1, 3], [1, 3, 0]), ([3, 0, 3], [2, 1, 3]), ([1, 3, 2], [3, 0, 2])]
    # Every round has the same shapes (6 tokens, 3 sequences, 3 columns); only the contents of
    # the captured tensors change between replays, the boundaries and accepted counts included.
    rounds = [_spec_case(rng, lens, accepted, 3, True, True) for lens, accepted in lens_rounds]
    got = run(_GRAPH, {"rounds": rounds, "pad": PAD, "guard": GUARD}, timeout=600)["results"]
    assert len(got) == len(rounds)
    for i, (case, g) in enumerate(zip(rounds, got)):
        _check(case, g, f"graph replay {i}")
