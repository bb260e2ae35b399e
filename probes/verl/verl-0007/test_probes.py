"""Probes for verl-0007 (rollout importance sampling: IS weights, veto and mismatch metrics).

The judge (this module) never imports verl or torch. Each probe builds training and rollout
log-probabilities and response masks with its own numpy, sends them to a child that calls
compute_rollout_importance_weights, compute_mismatch_metrics or the registered policy losses on
the GPU when one is visible (on the CPU otherwise), and gets back weights, metrics and losses as
plain arrays and floats. The judge recomputes them from the instruction's formulas in float64:
log ratios clamped to [-20, 20] before exponentiation, sums and means over valid tokens only,
truncation or clipping, the veto over valid tokens, and the metric definitions."""

import math

import numpy as np

from infradev_probe import run

PRELUDE = """
import numpy as np
import torch

from verl.trainer.ppo.mismatch_helper import compute_mismatch_metrics, compute_rollout_importance_weights

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def t(a):
    return torch.as_tensor(np.array(a), dtype=torch.float32, device=DEV)


def call(case):
    kw = dict(old_log_prob=t(case["old"]), rollout_log_prob=t(case["rollout"]), response_mask=t(case["mask"]))
    kw.update(case["kw"])
    w, metrics = compute_rollout_importance_weights(**kw)
    out = dict(metrics={k: float(v) for k, v in metrics.items()},
               metric_types=sorted({type(v).__name__ for v in metrics.values()}))
    if w is not None:
        x = w.batch["rollout_is_weights"]
        out.update(weights=x.detach().float().cpu().numpy(), device=x.device.type)
    return out
"""

BOUND = 20.0


def ragged_mask(lengths, width):
    return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def log_ratio(old, rollout):
    return old.astype(np.float64) - rollout.astype(np.float64)


def raw_ratio(old, rollout, mask, level):
    """Safety-bounded ratio per position (token level) or per row, broadcast (other levels)."""
    d = log_ratio(old, rollout)
    if level == "token":
        return np.exp(np.clip(d, -BOUND, BOUND))
    s = (d * mask).sum(-1, keepdims=True)
    if level == "geometric":
        s = s / (mask.sum(-1, keepdims=True) + 1e-8)
    return np.broadcast_to(np.exp(np.clip(s, -BOUND, BOUND)), d.shape).copy()


def vetoed_rows(old, rollout, mask, veto):
    if veto is None:
        return np.zeros(mask.shape[0], bool)
    return ((log_ratio(old, rollout) < math.log(veto)) & (mask > 0)).any(-1)


def expected_weights(old, rollout, mask, level, mode, upper, lower, veto):
    r = raw_ratio(old, rollout, mask, level)
    if mode == "truncate":
        w = np.minimum(r, upper)
    else:
        w = r * ((r >= lower) & (r <= upper))
    w = w * (~vetoed_rows(old, rollout, mask, veto))[:, None]
    return w * mask


def batch(seed, rows, width, spread):
    rng = np.random.default_rng(seed)
    old = rng.normal(-1.5, 0.5, (rows, width)).astype(np.float32)
    rollout = (old - rng.normal(0.0, spread, (rows, width))).astype(np.float32)
    return old, rollout


def close(got, want, what, rtol=2e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=1e-7, err_msg=what)


def test_weights_per_level_and_mode():
    old, rollout = batch(11, 6, 12, 0.6)
    lengths = [12, 9, 4, 12, 7, 1]
    mask = ragged_mask(lengths, 12)
    # Padding positions hold wild log ratios: only valid tokens may enter a row's sum or mean.
    pad = mask == 0
    rollout[pad] = old[pad] + np.where(np.arange(pad.sum()) % 2 == 0, 9.0, -9.0).astype(np.float32)
    specs = [("token", "truncate", 1.5, None), ("token", "clip", 1.6, 0.6), ("sequence", "truncate", 2.0, None),
             ("sequence", "clip", 2.5, 0.3), ("geometric", "truncate", 1.2, None), ("geometric", "clip", 1.3, 0.8)]
    cases = []
    for level, mode, upper, lower in specs:
        kw = dict(rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=upper,
                  rollout_is_veto_threshold=None)
        if lower is not None:
            kw["rollout_is_threshold_lower"] = lower
        cases.append(dict(old=old, rollout=rollout, mask=mask, kw=kw))
    out = run(PRELUDE + """
res = [call(c) for c in ARGS["cases"]]
off = call(dict(ARGS["cases"][0], kw=dict(rollout_is_threshold=None)))
emit(results=res, off_has_weights="weights" in off, off_metrics=len(off["metrics"]),
     input_device=DEV)
""", args={"cases": cases})
    for (level, mode, upper, lower), got in zip(specs, out["results"]):
        where = f"{level} level, {mode} mode, upper {upper}, lower {lower if lower is not None else '1/upper'}"
        lower = 1.0 / upper if lower is None else lower
        assert got.get("weights") is not None, f"{where}: no rollout_is_weights returned"
        assert got["device"] == out["input_device"], f"{where}: weights on {got['device']}, inputs on {out['input_device']}"
        close(got["weights"], expected_weights(old, rollout, mask, level, mode, upper, lower, None),
              f"{where}: rollout_is_weights (valid tokens only in a row's sum or mean, 0 at padding)")
    assert not out["off_has_weights"] and out["off_metrics"] == 0, \
        "with rollout_is_threshold=None the result must be (None, {})"


def test_sequence_ratios_are_bounded_in_log_space():
    width = 100
    old = np.full((5, width), -2.0, np.float32)
    rollout = old.copy()
    rollout[0] -= 1.0      # row log ratio +100: the bound caps it at e^20
    rollout[1] += 1.0      # row log ratio -100: the bound lifts it to e^-20
    rollout[2] -= 0.05     # row log ratio +5
    rollout[3] += 0.004    # row log ratio -0.4
    rollout[4] -= 30.0     # every token e^30: capped per token and per row
    mask = np.ones_like(old)
    specs = [("sequence", "truncate", 3.0, None), ("sequence", "clip", 3.0, 0.5),
             ("geometric", "truncate", 3.0, None), ("token", "truncate", 3.0, None)]
    cases = [dict(old=old, rollout=rollout, mask=mask,
                  kw=dict(rollout_is_level=lv, rollout_is_mode=md, rollout_is_threshold=up,
                          rollout_is_veto_threshold=None, **({} if lo is None else {"rollout_is_threshold_lower": lo})))
             for lv, md, up, lo in specs]
    out = run(PRELUDE + """
emit(results=[call(c) for c in ARGS["cases"]])
""", args={"cases": cases})
    for (level, mode, upper, lower), got in zip(specs, out["results"]):
        where = f"{level} level, {mode} mode, rows whose summed log ratio is +100, -100, +5, -0.4, +3000"
        lower = 1.0 / upper if lower is None else lower
        w = got["weights"]
        assert np.all(np.isfinite(w)), f"{where}: non-finite weights {w[~np.isfinite(w)][:4]}"
        close(w, expected_weights(old, rollout, mask, level, mode, upper, lower, None),
              f"{where}: weights (log ratios are clamped to [-20, 20] before exp)", rtol=1e-4)
        bad = {k: v for k, v in got["metrics"].items() if not math.isfinite(v)}
        assert not bad, f"{where}: non-finite metrics {bad}"
        if level == "sequence":
            assert abs(got["metrics"]["mismatch/rollout_is_max"] - math.exp(BOUND)) <= 1e-4 * math.exp(BOUND), \
                f"{where}: rollout_is_max {got['metrics']['mismatch/rollout_is_max']}, want e^20"
            want_mean = float(np.mean(np.exp(np.clip(log_ratio(old, rollout).sum(-1), -BOUND, BOUND))))
            close(got["metrics"]["mismatch/rollout_is_mean"], want_mean,
                  f"{where}: rollout_is_mean (mean of the bounded ratios before truncation)", rtol=1e-4)


def test_veto_looks_at_valid_tokens_only():
    old, rollout = batch(12, 4, 10, 0.2)
    mask = ragged_mask([10, 10, 6, 8], 10)
    rollout[0, 3] = old[0, 3] + 12.0   # ratio e^-12 < 1e-4 at a valid token: row 0 is vetoed
    rollout[2, 8] = old[2, 8] + 12.0   # the same at a padding position: row 2 is not
    rollout[3, 1] = old[3, 1] + 8.0    # ratio e^-8 ~ 3.4e-4: above the veto threshold
    base = dict(rollout_is_level="token", rollout_is_mode="truncate", rollout_is_threshold=2.0)
    cases = [dict(old=old, rollout=rollout, mask=mask, kw=dict(base, rollout_is_veto_threshold=1e-4)),
             dict(old=old, rollout=rollout, mask=mask, kw=dict(base)),
             dict(old=old, rollout=rollout, mask=mask, kw=dict(base, rollout_is_veto_threshold=None)),
             dict(old=old, rollout=rollout, mask=mask, kw=dict(base, rollout_is_veto_threshold=1e-3))]
    out = run(PRELUDE + """
emit(results=[call(c) for c in ARGS["cases"]])
""", args={"cases": cases})
    for (name, veto), got in zip([("veto 1e-4", 1e-4), ("default veto (1e-4)", 1e-4), ("veto None", None),
                                  ("veto 1e-3", 1e-3)], out["results"]):
        rows = vetoed_rows(old, rollout, mask, veto)
        close(got["weights"], expected_weights(old, rollout, mask, "token", "truncate", 2.0, 0.5, veto),
              f"{name}: weights (a row is vetoed, all of it zero, only for a valid token below the threshold)")
        m = got["metrics"]
        assert abs(m["mismatch/rollout_is_veto_fraction"] - rows.mean()) < 1e-6, \
            f"{name}: veto fraction {m['mismatch/rollout_is_veto_fraction']}, want {rows.mean()}"
        cat = (log_ratio(old, rollout) < math.log(veto)) & (mask > 0) if veto else np.zeros(mask.shape, bool)
        want = cat.sum() / mask.sum()
        assert abs(m["mismatch/rollout_is_catastrophic_token_fraction"] - want) < 1e-6, \
            f"{name}: catastrophic token fraction {m['mismatch/rollout_is_catastrophic_token_fraction']}, want {want}"


def masked_mean(x, m, axis=None):
    return (x * m).sum(axis=axis) / (m.sum(axis=axis) + 1e-8)


def expected_metrics(old, rollout, mask, mode, upper, lower, veto):
    d = log_ratio(old, rollout)
    m = mask.astype(np.float64)
    r = np.exp(np.clip(d, -BOUND, BOUND))
    valid = m > 0
    c = np.clip(r, lower, upper)
    mc = masked_mean(c, m)
    cat = (d < math.log(veto)) & valid
    out = {
        "rollout_is_mean": masked_mean(r, m),
        "rollout_is_max": r[valid].max(),
        "rollout_is_min": r[valid].min(),
        "rollout_is_ratio_fraction_high": masked_mean((r > upper).astype(float), m),
        "rollout_is_ratio_fraction_low": masked_mean((r < lower).astype(float), m),
        "rollout_is_std": math.sqrt(max(0.0, masked_mean(c * c, m) - mc * mc)),
        "rollout_is_eff_sample_size": 1.0 / masked_mean((c / (mc + 1e-8)) ** 2, m),
        "rollout_is_veto_fraction": cat.any(-1).mean(),
        "rollout_is_catastrophic_token_fraction": masked_mean(cat.astype(float), m),
    }
    if mode == "clip":
        out_of = 1.0 - ((r >= lower) & (r <= upper))
        out["rollout_is_clipped_fraction"] = masked_mean(out_of, m)
        out["rollout_is_seq_clipped_fraction"] = ((out_of * m).sum(-1) > 0).mean()
    o, ro = masked_mean(old, m, -1), masked_mean(rollout.astype(np.float64), m, -1)
    diff = ro - o
    out.update({
        "mismatch_training_ppl": np.exp(-o).mean(),
        "mismatch_training_log_ppl": (-o).mean(),
        "mismatch_kl": masked_mean(-d, m),
        "mismatch_k3_kl": masked_mean(np.exp(d) - d - 1.0, m),
        "mismatch_rollout_ppl": np.exp(-ro).mean(),
        "mismatch_rollout_log_ppl": (-ro).mean(),
        "mismatch_log_ppl_diff": diff.mean(),
        "mismatch_log_ppl_abs_diff": np.abs(diff).mean(),
        "mismatch_log_ppl_diff_max": diff.max(),
        "mismatch_log_ppl_diff_min": diff.min(),
        "mismatch_ppl_ratio": np.exp(diff).mean(),
    })
    return out


def test_token_level_metrics():
    old, rollout = batch(13, 8, 16, 0.7)
    mask = ragged_mask([16, 11, 16, 5, 14, 16, 2, 9], 16)
    rollout[4, 6] = old[4, 6] + 11.0   # one catastrophic valid token
    cases = [dict(old=old, rollout=rollout, mask=mask,
                  kw=dict(rollout_is_level="token", rollout_is_mode=mode, rollout_is_threshold=upper,
                          rollout_is_threshold_lower=lower, rollout_is_veto_threshold=1e-4))
             for mode, upper, lower in [("truncate", 1.8, 0.4), ("clip", 1.5, 0.7)]]
    out = run(PRELUDE + """
res = [call(c) for c in ARGS["cases"]]
plain = compute_mismatch_metrics(old_log_prob=t(ARGS["cases"][0]["old"]), rollout_log_prob=None,
                                 response_mask=t(ARGS["cases"][0]["mask"]))
emit(results=res, plain={k: float(v) for k, v in plain.items()},
     plain_types=sorted({type(v).__name__ for v in plain.values()}))
""", args={"cases": cases})
    for case, got in zip(cases, out["results"]):
        kw = case["kw"]
        where = f"token level, {kw['rollout_is_mode']} mode, thresholds [{kw['rollout_is_threshold_lower']}, {kw['rollout_is_threshold']}]"
        assert got["metric_types"] == ["float"], f"{where}: metric values of types {got['metric_types']}, want float"
        want = expected_metrics(old, rollout, mask, kw["rollout_is_mode"], kw["rollout_is_threshold"],
                                kw["rollout_is_threshold_lower"], 1e-4)
        for key, value in want.items():
            name = "mismatch/" + key
            assert name in got["metrics"], f"{where}: metric {name} missing"
            close(got["metrics"][name], value, f"{where}: {name}", rtol=1e-4)
    plain = out["plain"]
    assert out["plain_types"] == ["float"], f"compute_mismatch_metrics returned values of types {out['plain_types']}"
    assert set(plain) == {"mismatch_training_ppl", "mismatch_training_log_ppl"}, \
        f"compute_mismatch_metrics without rollout log-probs returned {sorted(plain)}"
    o = masked_mean(old.astype(np.float64), mask, -1)
    close(plain["mismatch_training_ppl"], np.exp(-o).mean(), "mismatch_training_ppl without rollout log-probs", 1e-4)


LOSSES = """
import numpy as np
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config.actor import ActorConfig

DEV = "cuda" if torch.cuda.is_available() else "cpu"
cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size=2, clip_ratio=0.2)


def t(a):
    return torch.as_tensor(np.array(a), dtype=torch.float32, device=DEV)


common = dict(old_log_prob=t(ARGS["old"]), log_prob=t(ARGS["new"]), advantages=t(ARGS["adv"]),
              response_mask=t(ARGS["mask"]), loss_agg_mode="token-mean", config=cfg)
out = {}
for name in ARGS["modes"]:
    fn = get_policy_loss_fn(name)
    row = {}
    for label, w in (("none", None), ("half", t(ARGS["half"])), ("weights", t(ARGS["weights"]))):
        torch.manual_seed(0)
        row[label] = float(fn(rollout_is_weights=w, **common)[0])
    out[name] = row
emit(**out)
"""

MODES = ["vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean"]


def vanilla_reference(old, new, adv, mask, w, clip=0.2, clip_c=3.0):
    nk = np.clip(new.astype(np.float64) - old, -20.0, 20.0)
    ratio = np.exp(nk)
    l1 = -adv * ratio
    l2 = -adv * np.clip(ratio, 1 - clip, 1 + clip)
    c1 = np.maximum(l1, l2)
    c2 = np.minimum(-adv * clip_c, c1)
    pg = np.where(adv < 0, c2, c1) * w
    return masked_mean(pg, mask)


def test_every_policy_loss_applies_the_weights():
    rng = np.random.default_rng(14)
    shape = (6, 10)
    old = rng.normal(-1.0, 0.3, shape).astype(np.float32)
    new = (old + rng.normal(0.0, 0.3, shape)).astype(np.float32)
    adv = rng.normal(0.0, 1.0, shape).astype(np.float32)
    mask = ragged_mask([10, 8, 10, 6, 9, 10], 10)
    half = np.full(shape, 0.5, np.float32)
    weights = rng.uniform(0.2, 1.8, shape).astype(np.float32)
    out = run(LOSSES, args=dict(old=old, new=new, adv=adv, mask=mask, half=half, weights=weights, modes=MODES))
    for name in MODES:
        got = out[name]
        assert math.isfinite(got["none"]) and abs(got["none"]) > 1e-6, f"{name}: unweighted loss {got['none']}"
        assert abs(got["half"] - 0.5 * got["none"]) <= 1e-4 * abs(got["none"]) + 1e-7, (
            f"{name}: loss with rollout_is_weights all 0.5 is {got['half']}, want half the unweighted "
            f"{got['none']} (the weights scale every token's loss)")
    want = vanilla_reference(old, new, adv.astype(np.float64), mask, weights)
    close(out["vanilla"]["weights"], want, "vanilla loss with per-token rollout_is_weights", rtol=1e-4)
    want = vanilla_reference(old, new, adv.astype(np.float64), mask, 1.0)
    close(out["vanilla"]["none"], want, "vanilla loss without rollout_is_weights", rtol=1e-4)
