"""Probes for verl-0007 (rollout importance sampling: IS weights, veto and mismatch metrics).

The judge (this module) never imports verl or torch. Each probe draws training and rollout
log-probabilities, ragged response masks, thresholds and the places of catastrophic tokens
fresh with its own numpy, sends them to a child that calls compute_rollout_importance_weights,
compute_mismatch_metrics or the registered policy losses on the GPU when one is visible (on the
CPU otherwise), and gets back weights, metrics and losses as plain arrays and floats. The judge
recomputes them from the instruction's formulas in float64 (log ratios clamped to [-20, 20]
before exponentiation, sums and means over valid tokens only, truncation or clipping, the veto
over valid tokens, the metric definitions) and compares them with gold's child on the same
inputs too."""

import math

import numpy as np

from infradev_probe import fresh, reference, run

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
    # The metric values go back as the function returned them: a tensor arrives as an array.
    out = dict(metrics=dict(metrics), weights=None)
    if w is not None:
        x = w.batch["rollout_is_weights"]
        out.update(weights=x.detach().float().cpu().numpy(), device=x.device.type)
    return out
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


def metrics_as_floats(got, where):
    """The metrics dict with every value a Python float (what the instruction promises)."""
    bad = {k: type(v).__name__ for k, v in got["metrics"].items() if type(v) is not float}
    assert not bad, f"{where}: metric values that are not Python floats: {bad}"
    return got["metrics"]


def check_against_reference(got, want, where, rtol=1e-5, metrics=()):
    """The weights of gold's child, and the metrics named (every one with metrics="all")."""
    if want["weights"] is None:
        assert got["weights"] is None, f"{where}: weights returned, the reference returns None"
    else:
        close(got["weights"], want["weights"], f"{where}: rollout_is_weights (compared with the reference)", rtol)
        assert got.get("device") == want.get("device"), f"{where}: weights on {got.get('device')}, want {want.get('device')}"
    g, w = got["metrics"], want["metrics"]
    if metrics == "all":
        assert sorted(g) == sorted(w), (
            f"{where}: metric keys differ from the reference's (missing {sorted(set(w) - set(g))}, "
            f"unexpected {sorted(set(g) - set(w))})")
        metrics = list(w)
    for k in metrics:
        assert k in g, f"{where}: metric {k} missing"
        close(float(np.asarray(g[k])), float(np.asarray(w[k])), f"{where}: {k} (compared with the reference)", rtol)


def test_weights_per_level_and_mode():
    rng = fresh()
    rows, width = int(rng.integers(4, 10)), int(rng.integers(6, 17))
    old, rollout = batch(rng, rows, width, float(rng.uniform(0.3, 0.7)))
    mask = ragged_mask(lengths_for(rng, rows, width), width)
    # Padding positions hold wild log ratios: only valid tokens may enter a row's sum or mean.
    pad = mask == 0
    rollout[pad] = old[pad] + (rng.choice([-1.0, 1.0], size=int(pad.sum())) * rng.uniform(6, 12, int(pad.sum()))
                               ).astype(np.float32)
    specs = []
    for level in ("token", "sequence", "geometric"):
        for mode in ("truncate", "clip"):
            upper = round(float(rng.uniform(1.1, 3.0)), 3)
            lower = round(float(rng.uniform(0.2, 0.95)), 3) if rng.random() < 0.6 else None
            specs.append((level, mode, upper, lower))
    # Calls with the feature off (threshold None) go in at drawn places among them.
    for _ in range(int(rng.integers(1, 4))):
        specs.insert(int(rng.integers(len(specs) + 1)), (str(rng.choice(["token", "sequence"])), "truncate", None, None))
    cases = []
    for level, mode, upper, lower in specs:
        kw = dict(rollout_is_level=level, rollout_is_mode=mode, rollout_is_threshold=upper,
                  rollout_is_veto_threshold=None)
        if lower is not None:
            kw["rollout_is_threshold_lower"] = lower
        cases.append(dict(old=old, rollout=rollout, mask=mask, kw=kw))
    code = PRELUDE + """
emit(results=[call(c) for c in ARGS["cases"]], input_device=DEV)
"""
    out, ref = both(code, {"cases": cases})
    assert len(out["results"]) == len(specs), "one result per call"
    for (level, mode, upper, lower), got, want in zip(specs, out["results"], ref["results"]):
        if upper is None:
            assert got["weights"] is None and got["metrics"] == {}, \
                f"{level} level with rollout_is_threshold=None: the result must be (None, {{}})"
            continue
        where = f"{level} level, {mode} mode, upper {upper}, lower {lower if lower is not None else '1/upper'}"
        lower = 1.0 / upper if lower is None else lower
        assert got["weights"] is not None, f"{where}: no rollout_is_weights returned"
        close(got["weights"], expected_weights(old, rollout, mask, level, mode, upper, lower, None),
              f"{where}: rollout_is_weights (valid tokens only in a row's sum or mean, 0 at padding)")
        assert got["device"] == ref["input_device"], f"{where}: weights on {got['device']}, inputs on {ref['input_device']}"
        check_against_reference(got, want, where)


def test_sequence_ratios_are_bounded_in_log_space():
    rng = fresh()
    width = int(rng.integers(60, 121))
    rows = 5
    old = rng.normal(-2.0, 0.3, (rows, width)).astype(np.float32)
    # Row log ratios: far above +20, far below -20, moderate positive and negative, and one row
    # whose every token is itself beyond the bound.
    sums = [float(rng.uniform(60, 150)), -float(rng.uniform(60, 150)), float(rng.uniform(1, 4)),
            -float(rng.uniform(0.1, 1.5))]
    d = np.empty((rows, width))
    for i, s in enumerate(sums):
        x = rng.normal(0.0, 0.05, width)
        d[i] = x - x.mean() + s / width
    d[4] = rng.uniform(25, 40, width)
    order = rng.permutation(rows)
    d = d[order]
    rollout = (old - d).astype(np.float32)
    mask = np.ones_like(old)
    specs = [("sequence", "truncate", round(float(rng.uniform(1.5, 5)), 3), None),
             ("sequence", "clip", round(float(rng.uniform(1.5, 5)), 3), round(float(rng.uniform(0.2, 0.8)), 3)),
             ("geometric", "truncate", round(float(rng.uniform(1.5, 5)), 3), None),
             ("token", "truncate", round(float(rng.uniform(1.5, 5)), 3), None)]
    cases = [dict(old=old, rollout=rollout, mask=mask,
                  kw=dict(rollout_is_level=lv, rollout_is_mode=md, rollout_is_threshold=up,
                          rollout_is_veto_threshold=None, **({} if lo is None else {"rollout_is_threshold_lower": lo})))
             for lv, md, up, lo in specs]
    out, ref = both(PRELUDE + """
emit(results=[call(c) for c in ARGS["cases"]])
""", {"cases": cases})
    S = log_ratio(old, rollout).sum(-1)
    for (level, mode, upper, lower), got, want in zip(specs, out["results"], ref["results"]):
        where = (f"{level} level, {mode} mode, rows whose summed log ratio is "
                 f"{', '.join('%+.1f' % s for s in S)}")
        lower = 1.0 / upper if lower is None else lower
        w = got["weights"]
        assert w is not None and np.all(np.isfinite(w)), f"{where}: weights missing or not finite"
        close(w, expected_weights(old, rollout, mask, level, mode, upper, lower, None),
              f"{where}: weights (log ratios are clamped to [-20, 20] before exp)", rtol=1e-4)
        metrics = metrics_as_floats(got, where)
        if level == "sequence":
            close(metrics["mismatch/rollout_is_max"], math.exp(min(S.max(), BOUND)),
                  f"{where}: rollout_is_max (e^min(max S, 20))", rtol=1e-4)
            want_mean = float(np.mean(np.exp(np.clip(S, -BOUND, BOUND))))
            close(metrics["mismatch/rollout_is_mean"], want_mean,
                  f"{where}: rollout_is_mean (mean of the bounded ratios before truncation)", rtol=1e-4)
        check_against_reference(got, want, where, rtol=1e-4,
                                metrics=["mismatch/rollout_is_max", "mismatch/rollout_is_mean"] if level == "sequence" else ())


def test_veto_looks_at_valid_tokens_only():
    rng = fresh()
    rows, width = int(rng.integers(5, 10)), int(rng.integers(8, 15))
    old, rollout = batch(rng, rows, width, 0.2)
    lengths = lengths_for(rng, rows, width)
    mask = ragged_mask(lengths, width)
    padded = [i for i in range(rows) if lengths[i] < width]
    roles = rng.permutation(rows)
    # A row with a padding-position catastrophe; one to three rows with a valid one; a row
    # just above the default threshold (e^-7 .. e^-8.5 > 1e-4, below 1e-3).
    pad_row = int(rng.choice(padded))
    others = [int(r) for r in roles if r != pad_row]
    veto_rows = others[:int(rng.integers(1, min(4, len(others) - 1) + 1))]
    near_row = others[len(veto_rows)]
    rollout[pad_row, int(rng.integers(lengths[pad_row], width))] += float(rng.uniform(10, 14))
    for r in veto_rows:
        rollout[r, int(rng.integers(lengths[r]))] += float(rng.uniform(10, 14))
    # The near row's token: a log ratio that puts its ratio in (1e-4, 1e-3).
    j = int(rng.integers(lengths[near_row]))
    rollout[near_row, j] = old[near_row, j] + np.float32(rng.uniform(7.0, 8.5))
    upper = round(float(rng.uniform(1.5, 3.0)), 3)
    base = dict(rollout_is_level="token", rollout_is_mode="truncate", rollout_is_threshold=upper)
    big = float(10 ** rng.uniform(-3, -2))
    vetoes = [("veto 1e-4", 1e-4, dict(base, rollout_is_veto_threshold=1e-4)),
              ("default veto (1e-4)", 1e-4, dict(base)),
              ("veto None", None, dict(base, rollout_is_veto_threshold=None)),
              (f"veto {big:.3g}", big, dict(base, rollout_is_veto_threshold=big))]
    order = rng.permutation(len(vetoes))
    vetoes = [vetoes[i] for i in order]
    cases = [dict(old=old, rollout=rollout, mask=mask, kw=kw) for _, _, kw in vetoes]
    out, ref = both(PRELUDE + """
emit(results=[call(c) for c in ARGS["cases"]])
""", {"cases": cases})
    for (name, veto, _), got, want in zip(vetoes, out["results"], ref["results"]):
        rows_v = vetoed_rows(old, rollout, mask, veto)
        close(got["weights"], expected_weights(old, rollout, mask, "token", "truncate", upper, 1.0 / upper, veto),
              f"{name}: weights (a row is vetoed, all of it zero, only for a valid token below the threshold; "
              f"vetoed rows {np.flatnonzero(rows_v).tolist()})")
        m = metrics_as_floats(got, name)
        close(m["mismatch/rollout_is_veto_fraction"], rows_v.mean(), f"{name}: veto fraction")
        cat = (log_ratio(old, rollout) < math.log(veto)) & (mask > 0) if veto else np.zeros(mask.shape, bool)
        close(m["mismatch/rollout_is_catastrophic_token_fraction"], cat.sum() / mask.sum(),
              f"{name}: catastrophic token fraction")
        check_against_reference(got, want, name, metrics=["mismatch/rollout_is_veto_fraction",
                                                          "mismatch/rollout_is_catastrophic_token_fraction"])


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
    rng = fresh()
    rows, width = int(rng.integers(6, 11)), int(rng.integers(10, 19))
    old, rollout = batch(rng, rows, width, float(rng.uniform(0.5, 0.8)))
    lengths = lengths_for(rng, rows, width)
    mask = ragged_mask(lengths, width)
    for r in rng.choice(rows, size=int(rng.integers(1, 3)), replace=False):
        j = int(rng.integers(lengths[r]))
        rollout[r, j] = old[r, j] + np.float32(rng.uniform(10, 13))   # a catastrophic valid token
    specs = [("truncate", round(float(rng.uniform(1.3, 2.2)), 3), round(float(rng.uniform(0.3, 0.6)), 3)),
             ("clip", round(float(rng.uniform(1.2, 1.8)), 3), round(float(rng.uniform(0.5, 0.85)), 3))]
    rng.shuffle(specs)
    cases = [dict(old=old, rollout=rollout, mask=mask,
                  kw=dict(rollout_is_level="token", rollout_is_mode=mode, rollout_is_threshold=upper,
                          rollout_is_threshold_lower=lower, rollout_is_veto_threshold=1e-4))
             for mode, upper, lower in specs]
    out, ref = both(PRELUDE + """
res = [call(c) for c in ARGS["cases"]]
plain = compute_mismatch_metrics(old_log_prob=t(ARGS["cases"][0]["old"]), rollout_log_prob=None,
                                 response_mask=t(ARGS["cases"][0]["mask"]))
emit(results=res, plain=dict(plain))
""", {"cases": cases})
    for case, got, ref_got in zip(cases, out["results"], ref["results"]):
        kw = case["kw"]
        where = f"token level, {kw['rollout_is_mode']} mode, thresholds [{kw['rollout_is_threshold_lower']}, {kw['rollout_is_threshold']}]"
        metrics = metrics_as_floats(got, where)
        want = expected_metrics(old, rollout, mask, kw["rollout_is_mode"], kw["rollout_is_threshold"],
                                kw["rollout_is_threshold_lower"], 1e-4)
        for key, value in want.items():
            name = "mismatch/" + key
            assert name in metrics, f"{where}: metric {name} missing"
            close(metrics[name], value, f"{where}: {name}", rtol=1e-4)
        check_against_reference(got, ref_got, where, rtol=1e-4, metrics="all")
    plain = metrics_as_floats({"metrics": out["plain"]}, "compute_mismatch_metrics without rollout log-probs")
    assert set(plain) == {"mismatch_training_ppl", "mismatch_training_log_ppl"}, \
        f"compute_mismatch_metrics without rollout log-probs returned {sorted(plain)}"
    o = masked_mean(old.astype(np.float64), mask, -1)
    close(plain["mismatch_training_ppl"], np.exp(-o).mean(), "mismatch_training_ppl without rollout log-probs", 1e-4)
    close(plain["mismatch_training_log_ppl"], (-o).mean(), "mismatch_training_log_ppl without rollout log-probs", 1e-4)
    for k in ref["plain"]:
        close(plain[k], ref["plain"][k], f"compute_mismatch_metrics without rollout log-probs: {k} (reference)", 1e-5)


LOSSES = """
import numpy as np
import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config.actor import ActorConfig

DEV = "cuda" if torch.cuda.is_available() else "cpu"
low, high, clip_c = ARGS["clip"]
cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size=2, clip_ratio=low,
                  clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=clip_c)


def t(a):
    return torch.as_tensor(np.array(a), dtype=torch.float32, device=DEV)


common = dict(old_log_prob=t(ARGS["old"]), log_prob=t(ARGS["new"]), advantages=t(ARGS["adv"]),
              response_mask=t(ARGS["mask"]), loss_agg_mode="token-mean", config=cfg)
out = {}
for name in ARGS["modes"]:
    fn = get_policy_loss_fn(name)
    row = {}
    for label, w in (("none", None), ("scaled", t(ARGS["scaled"])), ("weights", t(ARGS["weights"]))):
        torch.manual_seed(ARGS["seed"])
        row[label] = float(fn(rollout_is_weights=w, **common)[0])
    out[name] = row
emit(**out)
"""

MODES = ["vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean"]


def vanilla_reference(old, new, adv, mask, w, clip):
    low, high, clip_c = clip
    nk = np.clip(new.astype(np.float64) - old, -20.0, 20.0)
    ratio = np.exp(nk)
    l1 = -adv * ratio
    l2 = -adv * np.clip(ratio, 1 - low, 1 + high)
    c1 = np.maximum(l1, l2)
    c2 = np.minimum(-adv * clip_c, c1)
    pg = np.where(adv < 0, c2, c1) * w
    return masked_mean(pg, mask)


def test_every_policy_loss_applies_the_weights():
    rng = fresh()
    rows, width = int(rng.integers(4, 9)), int(rng.integers(6, 14))
    shape = (rows, width)
    old = rng.normal(-1.0, 0.3, shape).astype(np.float32)
    new = (old + rng.normal(0.0, 0.3, shape)).astype(np.float32)
    adv = rng.normal(0.0, 1.0, shape).astype(np.float32)
    mask = ragged_mask(lengths_for(rng, rows, width), width)
    scale = round(float(rng.uniform(0.2, 0.9)), 3)
    scaled = np.full(shape, scale, np.float32)
    weights = rng.uniform(0.2, 1.8, shape).astype(np.float32)
    # Clip ratios (low, high) and the dual-clip bound.
    clip = [round(float(rng.uniform(0.1, 0.3)), 3), round(float(rng.uniform(0.15, 0.35)), 3),
            round(float(rng.uniform(1.5, 3.5)), 3)]
    args = dict(old=old, new=new, adv=adv, mask=mask, scaled=scaled, weights=weights, modes=MODES, clip=clip,
                seed=int(rng.integers(1 << 31)))
    out, ref = both(LOSSES, args)
    for name in MODES:
        got, want = out[name], ref[name]
        assert abs(want["none"]) > 1e-6, f"probe setup: {name}'s reference loss is {want['none']}"
        for label in ("none", "weights"):
            close(got[label], want[label], f"{name}: loss with rollout_is_weights={label} (compared with the reference)",
                  rtol=1e-4)
        close(got["scaled"], scale * want["none"],
              f"{name}: loss with rollout_is_weights all {scale}: want {scale} times the reference's unweighted "
              f"loss {want['none']} (the weights scale every token's loss)", rtol=1e-4)
    close(out["vanilla"]["weights"], vanilla_reference(old, new, adv.astype(np.float64), mask, weights, clip),
          "vanilla loss with per-token rollout_is_weights", rtol=1e-4)
    close(out["vanilla"]["none"], vanilla_reference(old, new, adv.astype(np.float64), mask, 1.0, clip),
          "vanilla loss without rollout_is_weights", rtol=1e-4)
