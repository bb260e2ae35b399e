"""Probes for verl-0008 (rollout importance-sampling weights kept apart from rejection).

The judge (this module) never imports verl or torch. Each probe draws log-probabilities,
ragged response masks, thresholds and the places of catastrophic tokens fresh with its own
numpy and sends them to a child, which calls compute_rollout_importance_weights (or agg_loss) on
the GPU when one is visible, on the CPU otherwise, and sends back the weights, the returned
response mask, the metrics and the loss as plain arrays and floats. The judge recomputes what
the instruction's contract implies with its own numpy (the safety-bounded ratio per token or per
sequence, truncation only in truncate mode, rejection only through the returned mask, sequence
means over the sequences that keep a valid token) and compares with gold's child on the same
inputs too."""

import numpy as np

from infradev_probe import fresh, reference, run

PRELUDE = """
import numpy as np
import torch

from verl.trainer.ppo.mismatch_helper import compute_rollout_importance_weights

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def t(a):
    return torch.as_tensor(np.asarray(a), dtype=torch.float32, device=DEV)


def call(case, **extra):
    kw = dict(old_log_prob=t(case["old"]), rollout_log_prob=t(case["rollout"]), response_mask=t(case["mask"]))
    kw.update(case["kw"])
    kw.update(extra)
    out = compute_rollout_importance_weights(**kw)
    assert isinstance(out, tuple) and len(out) == 3, "expected (weights, response_mask, metrics)"
    w, m, metrics = out
    return dict(
        weights=None if w is None else w.batch["rollout_is_weights"].detach().float().cpu().numpy(),
        weights_device=None if w is None else str(w.batch["rollout_is_weights"].device.type),
        mask=m.detach().float().cpu().numpy(),
        mask_device=str(m.device.type),
        metrics={k: float(v) for k, v in metrics.items()},
    )
"""

BOUND = 20.0


def ragged_mask(lengths, width):
    return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def lengths_for(rng, rows, width):
    """Random valid lengths, at least one full row and one short one."""
    lengths = rng.integers(1, width + 1, size=rows)
    full, short = rng.choice(rows, size=2, replace=False)
    lengths[full] = width
    lengths[short] = int(rng.integers(1, max(2, width // 2)))
    return [int(x) for x in lengths]


def ratios(old, rollout, mask, level):
    """The safety-bounded ratio the weights start from, broadcast over each row."""
    lr = (old - rollout).astype(np.float64)
    if level == "token":
        return np.exp(np.clip(lr, -BOUND, BOUND))
    s = (lr * mask).sum(-1, keepdims=True)
    if level == "geometric":
        s = s / (mask.sum(-1, keepdims=True) + 1e-8)
    return np.broadcast_to(np.exp(np.clip(s, -BOUND, BOUND)), lr.shape)


def expected(old, rollout, mask, level, mode, upper, lower, veto):
    r = ratios(old, rollout, mask, level)
    if mode == "truncate":
        w = np.minimum(r, upper)
        m = mask.copy()
    else:
        w = r.copy()
        m = mask * ((r >= lower) & (r <= upper))
    if veto is not None:
        bad = ((old.astype(np.float64) - rollout) < np.log(veto)) & (mask > 0)
        m = m * (~bad.any(-1, keepdims=True))
    return w * mask, m


def batch(rng, rows, width, spread):
    old = rng.normal(-1.5, 0.5, (rows, width)).astype(np.float32)
    rollout = (old - rng.normal(0.0, spread, (rows, width))).astype(np.float32)
    return old, rollout


def close(got, want, what, rtol=2e-5):
    assert got is not None, f"{what}: nothing returned"
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=1e-7, err_msg=what)


def both(code, args):
    """What the submission's child and gold's child send for the same drawn args."""
    return run(code, args=args), reference(code, args=args)


def check_against_reference(got, want, where):
    for key in ("weights", "mask"):
        if want[key] is None:
            assert got[key] is None, f"{where}: {key} returned, the reference returns None"
        else:
            close(got[key], want[key], f"{where}: {key} (compared with the reference)", rtol=1e-5)
    for key in ("weights_device", "mask_device"):
        assert got[key] == want[key], f"{where}: {key} {got[key]}, want {want[key]}"
    assert sorted(got["metrics"]) == sorted(want["metrics"]), (
        f"{where}: metric keys differ from the reference's (missing {sorted(set(want['metrics']) - set(got['metrics']))}, "
        f"unexpected {sorted(set(got['metrics']) - set(want['metrics']))})")
    for k, v in want["metrics"].items():
        close(got["metrics"][k], v, f"{where}: {k} (compared with the reference)", rtol=1e-5)


def thresholds(rng, lower_too):
    upper = round(float(rng.uniform(1.15, 1.9)), 3)
    lower = round(float(rng.uniform(0.55, 0.9)), 3) if lower_too else None
    return upper, lower


def test_mask_mode_keeps_ratios_and_rejects_through_the_mask():
    rng = fresh()
    rows, width = int(rng.integers(5, 10)), int(rng.integers(8, 16))
    old, rollout = batch(rng, rows, width, float(rng.uniform(0.5, 0.8)))
    mask = ragged_mask(lengths_for(rng, rows, width), width)
    specs = []
    for level, mode in [("token", "mask"), ("sequence", "mask"), ("geometric", "mask"), ("token", "truncate"),
                        (str(rng.choice(["sequence", "geometric"])), "truncate")]:
        specs.append((level, mode) + thresholds(rng, mode == "mask" or rng.random() < 0.3))
    rng.shuffle(specs)
    # Calls with the feature off (threshold None) go in at drawn places among them.
    for _ in range(int(rng.integers(1, 3))):
        specs.insert(int(rng.integers(len(specs) + 1)), (str(rng.choice(["token", "sequence"])), "mask", None, None))
    cases = []
    for level, mode, upper, lower in specs:
        kw = dict(rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=upper,
                  rollout_is_veto_threshold=None)
        if lower is not None:
            kw["rollout_is_threshold_lower"] = lower
        cases.append(dict(old=old, rollout=rollout, mask=mask, kw=kw))
    out, ref = both(PRELUDE + """
emit(results=[call(c) for c in ARGS["cases"]])
""", {"cases": cases})
    assert len(out["results"]) == len(specs), "one result per call"
    for (level, mode, upper, lower), got, want in zip(specs, out["results"], ref["results"]):
        if upper is None:
            assert got["weights"] is None and got["metrics"] == {}, (
                f"{level} level with rollout_is_threshold=None: want no weights and no metrics")
            close(got["mask"], mask, f"{level} level with rollout_is_threshold=None: the returned mask is the one passed in")
            continue
        lower = 1.0 / upper if lower is None else lower
        want_w, want_m = expected(old, rollout, mask, level, mode, upper, lower, None)
        where = f"{level} level, {mode} mode, thresholds [{lower}, {upper}]"
        assert got["weights"] is not None, f"{where}: no weights returned"
        close(got["weights"], want_w, f"{where}: rollout_is_weights (mask mode keeps the safety-bounded "
                                      f"ratios, truncate mode caps them at the upper threshold; 0 at padding)")
        close(got["mask"], want_m, f"{where}: returned response_mask (mask mode rejects out-of-bounds "
                                   f"ratios through it; truncate mode leaves it as it was)")
        check_against_reference(got, want, where)


def test_veto_rejects_through_the_mask_and_is_off_by_default():
    rng = fresh()
    rows, width = int(rng.integers(5, 10)), int(rng.integers(8, 14))
    old, rollout = batch(rng, rows, width, 0.3)
    lengths = lengths_for(rng, rows, width)
    mask = ragged_mask(lengths, width)
    padded = [i for i in range(rows) if lengths[i] < width]
    pad_row = int(rng.choice(padded))
    others = [int(r) for r in rng.permutation(rows) if r != pad_row]
    veto_rows = others[:int(rng.integers(1, len(others)))]
    # Ratios around e^-12 .. e^-15, far below any veto threshold drawn here: at a valid token of
    # each vetoed row, and at a padding position of another row (which vetoes nothing).
    rollout[pad_row, int(rng.integers(lengths[pad_row], width))] += np.float32(rng.uniform(12, 15))
    for r in veto_rows:
        j = int(rng.integers(lengths[r]))
        rollout[r, j] = old[r, j] + np.float32(rng.uniform(12, 15))
    veto = float(10 ** rng.uniform(-5, -3))
    upper = round(float(rng.uniform(1.5, 3.0)), 3)
    modes = [(str(rng.choice(["token", "sequence"])), m) for m in ("truncate", "mask")]
    specs = [(lv, md, veto) for lv, md in modes] + [(lv, md, "default") for lv, md in modes[:1]] + \
        [(str(rng.choice(["token", "sequence"])), str(rng.choice(["truncate", "mask"])), "config")]
    rng.shuffle(specs)
    cases = []
    for level, mode, v in specs:
        kw = dict(rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=upper)
        if isinstance(v, float):
            kw["rollout_is_veto_threshold"] = v
        cases.append(dict(old=old, rollout=rollout, mask=mask, kw=kw, veto=v))
    out, ref = both(PRELUDE + """
import dataclasses
from verl.trainer.config.algorithm import AlgoConfig

fields = {f.name: f.default for f in dataclasses.fields(AlgoConfig)}
res = []
for c in ARGS["cases"]:
    if c["veto"] == "config":
        # The trainer's way: the threshold as AlgoConfig gives it by default, and as its
        # dataclass field declares it.
        res.append([call(c, rollout_is_veto_threshold=AlgoConfig().rollout_is_veto_threshold),
                    call(c, rollout_is_veto_threshold=fields["rollout_is_veto_threshold"])])
    else:
        res.append([call(c)])
emit(results=res)
""", {"cases": cases})
    for (level, mode, v), got, want in zip(specs, out["results"], ref["results"]):
        applied = v if isinstance(v, float) else None
        want_w, want_m = expected(old, rollout, mask, level, mode, upper, 1.0 / upper, applied)
        what = {"default": "rollout_is_veto_threshold left out (default None)",
                "config": "rollout_is_veto_threshold from AlgoConfig's default (None)"}.get(v) or f"veto {v:.3g}"
        where = f"{level} level, {mode} mode, {what}; rows with a valid catastrophic token {sorted(veto_rows)}"
        assert len(got) == len(want), f"{where}: one result per call"
        for g, w in zip(got, want):
            close(g["weights"], want_w, f"{where}: rollout_is_weights (the veto does not touch the weights)")
            close(g["mask"], want_m, f"{where}: the returned response_mask (the veto zeroes exactly the rows "
                                     f"with a valid token below its threshold; no veto unless asked for)")
            check_against_reference(g, w, where)


def test_callers_tensors_are_left_untouched():
    rng = fresh()
    rows, width = int(rng.integers(4, 9)), int(rng.integers(6, 12))
    old, rollout = batch(rng, rows, width, float(rng.uniform(0.5, 0.9)))
    lengths = lengths_for(rng, rows, width)
    mask = ragged_mask(lengths, width)
    for r in rng.choice(rows, size=int(rng.integers(1, 3)), replace=False):
        j = int(rng.integers(lengths[r]))
        rollout[r, j] = old[r, j] + np.float32(rng.uniform(11, 14))
    # Calls on the same caller tensors, one after another: the returned mask of each must
    # follow from the caller's mask as it was, which the caller must get back unchanged.
    calls = [["token", "truncate"], [str(rng.choice(["token", "sequence"])), "mask"]] + [
        [str(rng.choice(["token", "sequence", "geometric"])), str(rng.choice(["truncate", "mask"]))]
        for _ in range(int(rng.integers(2, 5)))]
    rng.shuffle(calls)
    upper, lower = thresholds(rng, True)
    veto = float(10 ** rng.uniform(-4.5, -3))
    args = dict(old=old, rollout=rollout, mask=mask, calls=calls, upper=upper, lower=lower, veto=veto)
    out, ref = both(PRELUDE + """
old, rollout, mask = t(ARGS["old"]), t(ARGS["rollout"]), t(ARGS["mask"])
returned = []
for level, mode in ARGS["calls"]:
    w, m, _ = compute_rollout_importance_weights(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, rollout_is_level=level,
        rollout_is_mode=mode, rollout_is_threshold=ARGS["upper"], rollout_is_threshold_lower=ARGS["lower"],
        rollout_is_veto_threshold=ARGS["veto"])
    returned.append(m.detach().float().cpu().numpy())
emit(old=old.cpu().numpy(), rollout=rollout.cpu().numpy(), mask=mask.cpu().numpy(), returned=returned)
""", args)
    np.testing.assert_array_equal(out["mask"], mask, err_msg="the caller's response_mask was modified")
    np.testing.assert_array_equal(out["old"], old, err_msg="the caller's old_log_prob was modified")
    np.testing.assert_array_equal(out["rollout"], rollout, err_msg="the caller's rollout_log_prob was modified")
    assert len(out["returned"]) == len(calls), "one returned mask per call"
    for i, ((level, mode), got, want) in enumerate(zip(calls, out["returned"], ref["returned"])):
        _, want_m = expected(old, rollout, mask, level, mode, upper, lower, veto)
        assert want_m.sum() < mask.sum(), "probe setup: the case must reject something"
        where = (f"call {i + 1} of {len(calls)} ({level} level, {mode} mode, veto {veto:.3g}) on the same tensors: "
                 f"returned response_mask")
        close(got, want_m, where)
        close(got, want, where + " (compared with the reference)")


AGG = """
import numpy as np
import torch
from verl.trainer.ppo.core_algos import agg_loss

DEV = "cuda" if torch.cuda.is_available() else "cpu"
loss = torch.as_tensor(ARGS["loss"], dtype=torch.float32, device=DEV)
out = []
for m in ARGS["masks"]:
    mask = torch.as_tensor(m, dtype=torch.float32, device=DEV)
    out.append({mode: float(agg_loss(loss_mat=loss, loss_mask=mask, loss_agg_mode=mode))
                for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")})
emit(results=out)
"""


def reference_agg(loss, mask, mode):
    loss, mask = loss.astype(np.float64), mask.astype(np.float64)
    if mode == "token-mean":
        return (loss * mask).sum() / (mask.sum() + 1e-8)
    count = mask.sum(-1)
    seq = (loss * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        seq = seq / (count + 1e-8)
    keep = count > 0
    return seq[keep].sum() / (keep.sum() + 1e-8)


def test_sequence_means_leave_out_fully_rejected_sequences():
    rng = fresh()
    rows, width = int(rng.integers(4, 10)), int(rng.integers(5, 13))
    loss = rng.normal(float(rng.uniform(0.2, 1.0)), 1.0, (rows, width)).astype(np.float32)
    some = np.array(lengths_for(rng, rows, width))
    some[rng.choice(rows, size=int(rng.integers(1, rows)), replace=False)] = 0
    scattered = (rng.random((rows, width)) < 0.6).astype(np.float32)
    scattered[rng.choice(rows, size=int(rng.integers(1, rows)), replace=False)] = 0
    masks = [("some rows rejected", ragged_mask(some, width)),
             ("no row rejected", ragged_mask(lengths_for(rng, rows, width), width)),
             ("scattered tokens, some rows rejected", scattered),
             ("every row rejected", np.zeros((rows, width), np.float32))]
    order = rng.permutation(len(masks))
    masks = [masks[i] for i in order]
    out, ref = both(AGG, {"loss": loss, "masks": [m for _, m in masks]})
    assert len(out["results"]) == len(masks), "one result per mask"
    for (name, mask), got, want in zip(masks, out["results"], ref["results"]):
        for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
            expect = reference_agg(loss, mask, mode)
            what = (f"{name} (rows kept {int((mask.sum(-1) > 0).sum())} of {rows}): agg_loss({mode}) "
                    f"(sequence means count only sequences with a valid token)")
            assert abs(got[mode] - expect) <= 1e-5 * max(1.0, abs(expect)), f"{what}: {got[mode]}, want {expect}"
            assert abs(got[mode] - want[mode]) <= 1e-6 * max(1.0, abs(want[mode])), (
                f"{what}: {got[mode]}, the reference gives {want[mode]}")
