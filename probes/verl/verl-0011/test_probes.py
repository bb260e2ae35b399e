"""Probes for verl-0011 (FLOPs estimates for Mistral and Gemma3 text models).

The judge (this module) never imports verl or torch. Each probe draws model configs fresh (sizes,
layer counts, heads, head_dim present or not, sliding windows, layer_types lists, patterns, and
which attributes a config lacks) and batches of sequence lengths and step times around the
windows, and sends them to the child as plain dicts (attributes to set; a key left out is an
attribute the config does not have). The child builds a FlopsCounter for each (from a plain object
carrying exactly those attributes, or from a transformers config class for the "hf" cases),
records what the constructor printed, and calls estimate_flops on the GPU. The judge computes
the achieved TFLOPs itself from the counting rules the instruction states (the dense estimate the
repository already uses for Llama, and the layer-by-layer attention sum for Gemma3) and compares;
the device's peak (the second value) is not judged.
"""

import math

from infradev_probe import fresh, run

DRIVER = r"""
import contextlib
import io

import transformers

from verl.utils.flops_counter import FlopsCounter


class Cfg:
    def __init__(self, values):
        for k, v in values.items():
            setattr(self, k, v)


out = []
for case in ARGS["cases"]:
    values = dict(case["config"])
    if case.get("hf"):
        cls = getattr(transformers, case["hf"])
        values.pop("model_type")
        config = cls(**values)
    else:
        config = Cfg(values)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        counter = FlopsCounter(config)
    results = []
    for seqlens, dt in case["batches"]:
        achieved, promised = counter.estimate_flops(list(seqlens), dt)
        results.append(float(achieved))
    out.append({"printed": buf.getvalue(), "achieved": results})
emit(out=out)
"""


def _head_dim(c):
    return c["head_dim"] if "head_dim" in c else c["hidden_size"] // c["num_attention_heads"]


def _dense_params(c):
    h, d = c["hidden_size"], _head_dim(c)
    q = c["num_attention_heads"] * d
    kv = c["num_key_value_heads"] * d
    mlp = h * c["intermediate_size"] * 3
    attn = h * (q + kv + kv + q)
    return (mlp + attn) * c["num_hidden_layers"] + c["vocab_size"] * h * 2


def _layer_kinds(c):
    """True for a sliding-window layer, per the instruction's rules for Gemma3."""
    n = c["num_hidden_layers"]
    window = c.get("sliding_window", 1024)
    types = c.get("layer_types")
    if types is None:
        if window is None:
            return [False] * n
        pattern = c.get("sliding_window_pattern", 6)
        return [(l + 1) % pattern != 0 for l in range(n)]
    return [l < len(types) and types[l] == "sliding_attention" for l in range(n)]


def expected(c, seqlens, dt):
    d, heads = _head_dim(c), c["num_attention_heads"]
    dense = 6 * _dense_params(c) * sum(seqlens)
    if c["model_type"] == "gemma3_text":
        window = c.get("sliding_window", 1024)
        square = 0
        for sliding in _layer_kinds(c):
            for s in seqlens:
                square += s * min(s, window) if (sliding and window) else s * s
    elif c["model_type"] in ("llama", "qwen2", "qwen3", "mistral"):
        square = c["num_hidden_layers"] * sum(s * s for s in seqlens)
    else:
        return 0.0
    return (dense + 12 * square * d * heads) / dt / 1e12


def _check(cases, out):
    assert len(out) == len(cases)
    for case, got in zip(cases, out):
        c = case["config"]
        label = case["label"]
        for (seqlens, dt), value in zip(case["batches"], got["achieved"], strict=True):
            want = expected(c, seqlens, dt)
            assert math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12), (
                f"{label}: estimate_flops({seqlens}, {dt}) gave {value} achieved TFLOPs, want {want}")


S, F = "sliding_attention", "full_attention"
_DROP = object()


def _dims(rng, hf=False):
    heads = int(rng.integers(1, 9))
    c = {"vocab_size": int(rng.integers(500, 300000)), "hidden_size": heads * int(rng.integers(8, 161)),
         "intermediate_size": int(rng.integers(64, 20000)), "num_hidden_layers": int(rng.integers(2, 13)),
         "num_attention_heads": heads, "num_key_value_heads": int(rng.choice([d for d in range(1, heads + 1)
                                                                                if heads % d == 0]))}
    if hf or rng.random() < 0.6:
        c["head_dim"] = int(rng.integers(8, 257))
    return c


def _batches(rng, windows):
    """2-3 batches of lengths below, at and above the given windows, with step times other than 1 s."""
    out = []
    for _ in range(int(rng.integers(2, 4))):
        lens = []
        for _ in range(int(rng.integers(1, 6))):
            w = int(rng.choice(windows))
            lens.append(int(rng.choice([int(rng.integers(1, w + 1)), w, int(rng.integers(w + 1, 3 * w + 2))])))
        out.append([lens, float(round(rng.uniform(0.05, 5.0), 3))])
    return out


def _case(label, config, batches, hf=None):
    c = {k: v for k, v in config.items() if v is not _DROP}
    case = {"label": label, "config": c, "batches": batches}
    if hf:
        case["hf"] = hf
    return case


def _gemma(rng, label, hf=None, **over):
    c = dict(_dims(rng, hf=bool(hf)), model_type="gemma3_text")
    c.update(over)
    c = {k: v for k, v in c.items() if v is not _DROP}
    windows = [w for w in (c.get("sliding_window", 1024),) if w] or [int(rng.integers(16, 2000))]
    return _case(label, c, _batches(rng, windows), hf=hf)


def _kinds(rng, n):
    return [S if rng.random() < 0.6 else F for _ in range(n)]


def test_gemma3_follows_each_layers_attention_type():
    rng = fresh()
    cases = []
    for kind in rng.permutation(["mixed", "all-sliding", "all-full", "short", "no-window", "zero-window", "hf"]):
        n = int(rng.integers(2, 13))
        w = int(rng.integers(16, 2000))
        if kind == "mixed":
            cases.append(_gemma(rng, "layer_types mixed", num_hidden_layers=n, layer_types=_kinds(rng, n),
                                sliding_window=w, sliding_window_pattern=int(rng.integers(2, 8))))
        elif kind == "all-sliding":
            cases.append(_gemma(rng, "all sliding", num_hidden_layers=n, layer_types=[S] * n, sliding_window=w))
        elif kind == "all-full":
            cases.append(_gemma(rng, "all full despite a window", num_hidden_layers=n, layer_types=[F] * n,
                                sliding_window=w))
        elif kind == "short":
            cases.append(_gemma(rng, "layer_types shorter than the model (the rest is full)", num_hidden_layers=n,
                                layer_types=_kinds(rng, int(rng.integers(1, n))), sliding_window=w,
                                sliding_window_pattern=int(rng.integers(2, 8))))
        elif kind in ("no-window", "zero-window"):
            cases.append(_gemma(rng, f"sliding layers with window {None if kind == 'no-window' else 0} are full",
                                num_hidden_layers=n, layer_types=[S] + _kinds(rng, n - 1),
                                sliding_window=None if kind == "no-window" else 0))
        else:
            cases.append(_gemma(rng, "transformers Gemma3TextConfig", hf="Gemma3TextConfig", num_hidden_layers=n,
                                layer_types=[S] + _kinds(rng, n - 1), sliding_window=w))
    out = run(DRIVER, {"cases": cases}, timeout=300)["out"]
    _check(cases, out)


def test_gemma3_without_layer_types_follows_the_pattern():
    rng = fresh()
    cases = []
    for kind in rng.permutation(["pattern", "no-attribute", "default-pattern", "default-window", "no-window",
                                 "no-head-dim"]):
        n = int(rng.integers(2, 16))
        w = int(rng.integers(16, 1500))
        lt = None if rng.random() < 0.5 else _DROP
        if kind == "pattern":
            cases.append(_gemma(rng, "layer_types None, a pattern", num_hidden_layers=n, layer_types=None,
                                sliding_window=w, sliding_window_pattern=int(rng.integers(2, 8))))
        elif kind == "no-attribute":
            cases.append(_gemma(rng, "no layer_types attribute, a pattern", num_hidden_layers=n, layer_types=_DROP,
                                sliding_window=w, sliding_window_pattern=int(rng.integers(2, 8))))
        elif kind == "default-pattern":
            cases.append(_gemma(rng, "default pattern (6)", num_hidden_layers=int(rng.integers(7, 20)),
                                layer_types=lt, sliding_window=w, sliding_window_pattern=_DROP))
        elif kind == "default-window":
            cases.append(_gemma(rng, "default window (1024)", num_hidden_layers=n, layer_types=lt,
                                sliding_window=_DROP, sliding_window_pattern=int(rng.integers(2, 8))))
        elif kind == "no-window":
            cases.append(_gemma(rng, "no window: every layer full", num_hidden_layers=n, layer_types=lt,
                                sliding_window=None, sliding_window_pattern=int(rng.integers(2, 8))))
        else:
            cases.append(_gemma(rng, "head_dim from hidden_size", num_hidden_layers=n, layer_types=lt,
                                sliding_window=w, sliding_window_pattern=int(rng.integers(2, 8)), head_dim=_DROP))
    out = run(DRIVER, {"cases": cases}, timeout=300)["out"]
    _check(cases, out)


def test_mistral_counts_every_layer_as_full_attention():
    rng = fresh()
    cases = []
    for kind in rng.permutation(["head-dim", "no-head-dim", "hf", "gemma"]):
        w = int(rng.integers(16, 2000))
        if kind == "gemma":
            n = int(rng.integers(2, 13))
            cases.append(_gemma(rng, "gemma3_text", num_hidden_layers=n, layer_types=_kinds(rng, n), sliding_window=w))
            continue
        c = dict(_dims(rng, hf=kind == "hf"), model_type="mistral", sliding_window=w)
        if kind == "head-dim":
            c["head_dim"] = int(rng.integers(8, 257))
        elif kind == "no-head-dim":
            c.pop("head_dim", None)
        cases.append(_case(f"Mistral ({kind}), sliding_window {w}", c, _batches(rng, [w]),
                           hf="MistralConfig" if kind == "hf" else None))
    out = run(DRIVER, {"cases": cases}, timeout=300)["out"]
    assert len(out) == len(cases), f"{len(out)} results for {len(cases)} configs"
    for case, got in zip(cases, out):
        assert got["printed"] == "", (
            f"{case['label']}: FlopsCounter printed {got['printed']!r} at construction; a supported model type "
            f"prints nothing")
    _check(cases, out)


def test_other_model_types_keep_their_estimates():
    rng = fresh()
    known, unknown = [], []
    for t in ("llama", "qwen2", "qwen3"):
        c = dict(_dims(rng), model_type=t)
        if rng.random() < 0.5:
            c["sliding_window"] = int(rng.integers(16, 2000))
        known.append(_case(t, c, _batches(rng, [c.get("sliding_window", 512)])))
    names = [str(x) for x in rng.choice(["gpt2", "phi3", "starcoder2", "gemma2", "mixtral", "falcon"],
                                        size=int(rng.integers(1, 4)), replace=False)]
    names.append("probe_%x" % int(rng.integers(1 << 32)))
    for t in names:
        c = dict(_dims(rng), model_type=t, sliding_window=int(rng.integers(16, 2000)), layer_types=None,
                 sliding_window_pattern=int(rng.integers(2, 8)))
        unknown.append(_case(f"unsupported type {t}", c, _batches(rng, [c["sliding_window"]])))
    cases = known + unknown
    order = [int(i) for i in rng.permutation(len(cases))]
    cases = [cases[i] for i in order]
    out = run(DRIVER, {"cases": cases}, timeout=300)["out"]
    assert len(out) == len(cases), f"{len(out)} results for {len(cases)} configs"
    _check([c for c in cases if c in known], [g for c, g in zip(cases, out) if c in known])
    for case, got in zip(cases, out):
        if case in known:
            continue
        assert got["printed"].strip(), (
            f"{case['label']}: FlopsCounter printed nothing at construction; an unsupported type still gets "
            f"its message")
        assert len(got["achieved"]) == len(case["batches"]) and all(v == 0 for v in got["achieved"]), (
            f"{case['label']}: achieved TFLOPs {got['achieved']}, want 0 for each of its "
            f"{len(case['batches'])} batches")
