"""Probes for verl-0008 (rollout importance-sampling weights kept apart from rejection).

The judge (this module) never imports verl or torch. Each probe sends log-probabilities and
response masks it built itself to a child, which calls compute_rollout_importance_weights (or
agg_loss) on the GPU when one is visible, on the CPU otherwise, and sends back the weights, the
returned response mask, the metrics and the loss as plain arrays and floats. The judge recomputes
what the instruction's contract implies with its own numpy: the safety-bounded ratio per token
(token level) or per sequence (sequence level), truncation only in truncate mode, rejection only
through the returned mask, and sequence means over the sequences that keep a valid token."""

import numpy as np

from infradev_probe import run

PRELUDE = """
import numpy as np
import torch

from verl.trainer.ppo.mismatch_helper import compute_rollout_importance_weights

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def t(a):
    return torch.as_tensor(np.asarray(a), dtype=torch.float32, device=DEV)


def call(case):
    kw = dict(old_log_prob=t(case["old"]), rollout_log_prob=t(case["rollout"]), response_mask=t(case["mask"]))
    kw.update(case["kw"])
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
        bad = ((old - rollout) < np.log(veto)) & (mask > 0)
        m = m * (~bad.any(-1, keepdims=True))
    return w * mask, m


def batch(seed, rows, width, spread):
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.5, 0.5, (rows, width)).astype(np.float32)
    rollout = (old - rng.normal(0.0, spread, (rows, width))).astype(np.float32)
    return old, rollout


def close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7, err_msg=what)


def test_mask_mode_keeps_ratios_and_rejects_through_the_mask():
    old, rollout = batch(1, 6, 12, 0.6)
    mask = ragged_mask([12, 9, 4, 12, 7, 1], 12)
    cases = []
    for level, mode, upper, lower in [("token", "mask", 1.6, 0.6), ("sequence", "mask", 1.8, 0.7),
                                      ("geometric", "mask", 1.2, 0.9), ("token", "truncate", 1.4, None),
                                      ("sequence", "truncate", 1.5, None)]:
        kw = dict(rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=upper,
                  rollout_is_veto_threshold=None)
        if lower is not None:
            kw["rollout_is_threshold_lower"] = lower
        cases.append(dict(old=old, rollout=rollout, mask=mask, kw=kw))
    out = run(PRELUDE + """
emit(results=[call(c) for c in ARGS["cases"]])
""", args={"cases": cases})
    for case, got in zip(cases, out["results"]):
        kw = case["kw"]
        level, mode, upper = kw["rollout_is_level"], kw["rollout_is_mode"], kw["rollout_is_threshold"]
        lower = kw.get("rollout_is_threshold_lower", 1.0 / upper)
        want_w, want_m = expected(old, rollout, mask, level, mode, upper, lower, None)
        where = f"{level} level, {mode} mode, thresholds [{lower}, {upper}]"
        assert got["weights"] is not None, f"{where}: no weights returned"
        close(got["weights"], want_w, f"{where}: rollout_is_weights (mask mode keeps the safety-bounded "
                                      f"ratios, truncate mode caps them at the upper threshold; 0 at padding)")
        close(got["mask"], want_m, f"{where}: returned response_mask (mask mode rejects out-of-bounds "
                                   f"ratios through it; truncate mode leaves it as it was)")
    # The contract is exercised where the weights are really out of bounds.
    r = ratios(old, rollout, mask, "token")
    assert ((r > 1.6) & (mask > 0)).any() and ((r < 0.6) & (mask > 0)).any()


def test_veto_rejects_through_the_mask_and_is_off_by_default():
    old, rollout = batch(2, 4, 10, 0.3)
    mask = ragged_mask([10, 10, 6, 8], 10)
    rollout[0, 3] = old[0, 3] + 12.0   # ratio e^-12, far below 1e-4: row 0 is vetoed
    rollout[2, 8] = old[2, 8] + 12.0   # the same ratio at a padding position: row 2 is not
    veto = dict(old=old, rollout=rollout, mask=mask,
                kw=dict(rollout_is_level="token", rollout_is_mode="truncate", rollout_is_threshold=2.0,
                        rollout_is_veto_threshold=1e-4))
    default = dict(old=old, rollout=rollout, mask=mask,
                   kw=dict(rollout_is_level="token", rollout_is_mode="truncate", rollout_is_threshold=2.0))
    out = run(PRELUDE + """
import dataclasses
from verl.trainer.config.algorithm import AlgoConfig
emit(veto=call(ARGS["veto"]), default=call(ARGS["default"]),
     config_default=AlgoConfig().rollout_is_veto_threshold,
     field_default={f.name: f.default for f in dataclasses.fields(AlgoConfig)}.get("rollout_is_veto_threshold", "missing"))
""", args={"veto": veto, "default": default})

    want_w, want_m = expected(old, rollout, mask, "token", "truncate", 2.0, 0.5, 1e-4)
    got = out["veto"]
    close(got["weights"], want_w, "with a veto threshold, rollout_is_weights keep the truncated ratios of a vetoed "
                                  "sequence (the veto does not zero weights)")
    close(got["mask"], want_m, "with a veto threshold, the returned response_mask zeroes exactly the sequences "
                               "with a valid token whose ratio is below it")
    assert got["mask"][0].sum() == 0 and got["mask"][2].sum() == mask[2].sum()

    want_w, want_m = expected(old, rollout, mask, "token", "truncate", 2.0, 0.5, None)
    got = out["default"]
    close(got["weights"], want_w, "without rollout_is_veto_threshold: rollout_is_weights")
    close(got["mask"], want_m, "without rollout_is_veto_threshold no sequence may be vetoed (the default is None)")
    assert out["config_default"] is None, f"AlgoConfig().rollout_is_veto_threshold is {out['config_default']!r}, want None"
    assert out["field_default"] is None, f"AlgoConfig's rollout_is_veto_threshold default is {out['field_default']!r}"


# Calls on the same caller tensors, one after another: the returned mask of each must follow from
# the caller's mask as it was, which the caller must get back unchanged.
CALLS = [["token", "truncate"], ["token", "mask"], ["sequence", "mask"], ["sequence", "truncate"]]


def test_callers_tensors_are_left_untouched():
    old, rollout = batch(3, 5, 8, 0.8)
    mask = ragged_mask([8, 5, 8, 3, 6], 8)
    rollout[1, 2] = old[1, 2] + 12.0
    out = run(PRELUDE + """
old, rollout, mask = t(ARGS["old"]), t(ARGS["rollout"]), t(ARGS["mask"])
keep = [x.clone() for x in (old, rollout, mask)]
returned = []
for level, mode in ARGS["calls"]:
    w, m, _ = compute_rollout_importance_weights(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, rollout_is_level=level,
        rollout_is_mode=mode, rollout_is_threshold=1.5, rollout_is_threshold_lower=0.7,
        rollout_is_veto_threshold=1e-4)
    returned.append(m.detach().float().cpu().numpy())
emit(old=old.cpu().numpy(), rollout=rollout.cpu().numpy(), mask=mask.cpu().numpy(), returned=returned,
     unchanged=[bool(torch.equal(a, b)) for a, b in zip((old, rollout, mask), keep)])
""", args=dict(old=old, rollout=rollout, mask=mask, calls=CALLS))
    np.testing.assert_array_equal(out["mask"], mask, err_msg="the caller's response_mask was modified in place")
    np.testing.assert_array_equal(out["old"], old, err_msg="the caller's old_log_prob was modified")
    np.testing.assert_array_equal(out["rollout"], rollout, err_msg="the caller's rollout_log_prob was modified")
    for (level, mode), got in zip(CALLS, out["returned"]):
        _, want_m = expected(old, rollout, mask, level, mode, 1.5, 0.7, 1e-4)
        close(got, want_m, f"{level} level, {mode} mode with veto, all calls on the same tensors: returned "
                           f"response_mask")
        assert got.sum() < mask.sum(), "the case must reject something"


AGG = """
import numpy as np
import torch
from verl.trainer.ppo.core_algos import agg_loss

DEV = "cuda" if torch.cuda.is_available() else "cpu"
loss = torch.as_tensor(ARGS["loss"], dtype=torch.float32, device=DEV)
out = {}
for name, m in ARGS["masks"].items():
    mask = torch.as_tensor(m, dtype=torch.float32, device=DEV)
    out[name] = {mode: float(agg_loss(loss_mat=loss, loss_mask=mask, loss_agg_mode=mode))
                 for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")}
emit(**out)
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
    rng = np.random.default_rng(4)
    loss = rng.normal(0.5, 1.0, (6, 9)).astype(np.float32)
    masks = {
        "some rows rejected": ragged_mask([9, 0, 5, 0, 9, 2], 9),
        "no row rejected": ragged_mask([9, 3, 5, 7, 9, 2], 9),
        "every row rejected": np.zeros((6, 9), np.float32),
    }
    out = run(AGG, args={"loss": loss, "masks": masks})
    for name, mask in masks.items():
        for mode, got in out[name].items():
            want = reference_agg(loss, mask, mode)
            assert np.isfinite(got), f"{name}: agg_loss({mode}) is {got}"
            assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (
                f"{name}: agg_loss({mode}) = {got}, want {want} (sequence means count only sequences with a "
                f"valid token)")
