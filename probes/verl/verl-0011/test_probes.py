"""Probes for verl-0011 (FLOPs estimates for Mistral and Gemma3 text models).

The judge (this module) never imports verl or torch. Each probe sends the child a list of model
configs as plain dicts (attributes to set; a key left out is an attribute the config does not
have) and batches of sequence lengths; the child builds a FlopsCounter for each (from a plain
object carrying exactly those attributes, or from a transformers config class for the "hf"
cases), records what the constructor printed, and calls estimate_flops on the GPU. The judge
computes the achieved TFLOPs itself from the counting rules the instruction states (the dense
estimate the repository already uses for Llama, and the layer-by-layer attention sum for Gemma3)
and compares; the device's peak (the second value) is not judged.
"""

import math

from infradev_probe import run

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


# Lengths below, at and above the windows used below, and a step time other than 1 s.
BATCHES = [([100, 300, 301, 2500], 1.0), ([7, 4096], 0.25), ([640] * 5, 3.0)]

GEMMA_BASE = {"model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 2560,
              "intermediate_size": 10240, "num_hidden_layers": 6, "num_attention_heads": 8,
              "num_key_value_heads": 4, "head_dim": 256}


def _gemma(label, batches=BATCHES, hf=None, **over):
    c = dict(GEMMA_BASE)
    for k, v in over.items():
        if v is _DROP:
            c.pop(k, None)
        else:
            c[k] = v
    case = {"label": label, "config": c, "batches": batches}
    if hf:
        case["hf"] = hf
    return case


_DROP = object()


def test_gemma3_follows_each_layers_attention_type():
    S, F = "sliding_attention", "full_attention"
    cases = [
        _gemma("irregular layer_types, window 300",
               layer_types=[S, F, F, S, S, F], sliding_window=300, sliding_window_pattern=6),
        _gemma("all sliding, window 640", layer_types=[S] * 6, sliding_window=640),
        _gemma("all full despite a window", layer_types=[F] * 6, sliding_window=64),
        _gemma("layer_types shorter than the model (the rest is full)",
               layer_types=[S, S, F], sliding_window=300, sliding_window_pattern=2),
        _gemma("sliding layers with no window are full", layer_types=[S, F, S, S, F, S], sliding_window=None),
        _gemma("transformers Gemma3TextConfig, 8 layers", hf="Gemma3TextConfig", num_hidden_layers=8,
               layer_types=[F, S, S, F, S, S, S, F], sliding_window=512, head_dim=96, hidden_size=640,
               num_attention_heads=4, num_key_value_heads=1, intermediate_size=2048, vocab_size=1000),
    ]
    out = run(DRIVER, {"cases": cases}, timeout=300)["out"]
    _check(cases, out)


def test_gemma3_without_layer_types_follows_the_pattern():
    cases = [
        _gemma("pattern 3 over 7 layers (layers 2 and 5 full)", num_hidden_layers=7, layer_types=None,
               sliding_window=300, sliding_window_pattern=3),
        _gemma("pattern 4, no layer_types attribute", num_hidden_layers=9, layer_types=_DROP,
               sliding_window=500, sliding_window_pattern=4),
        _gemma("default pattern (6) over 13 layers", num_hidden_layers=13, layer_types=None,
               sliding_window=300, sliding_window_pattern=_DROP),
        _gemma("default window (1024)", num_hidden_layers=7, layer_types=None, sliding_window=_DROP,
               sliding_window_pattern=2),
        _gemma("no window: every layer full", num_hidden_layers=7, layer_types=None, sliding_window=None,
               sliding_window_pattern=3),
        _gemma("head_dim from hidden_size", num_hidden_layers=5, layer_types=None, sliding_window=256,
               sliding_window_pattern=5, head_dim=_DROP),
    ]
    out = run(DRIVER, {"cases": cases}, timeout=300)["out"]
    _check(cases, out)


def test_mistral_counts_every_layer_as_full_attention():
    S, F = "sliding_attention", "full_attention"  # the Gemma3 case below follows the default pattern
    mistral = {"model_type": "mistral", "vocab_size": 131072, "hidden_size": 5120, "intermediate_size": 14336,
               "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
    cases = [
        {"label": "Mistral-NeMo-like, sliding_window 256", "config": dict(mistral, sliding_window=256),
         "batches": BATCHES},
        {"label": "Mistral-7B-like, no head_dim", "batches": BATCHES,
         "config": {"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "sliding_window": 4096}},
        {"label": "transformers MistralConfig, sliding_window 100", "hf": "MistralConfig", "batches": BATCHES,
         "config": {"model_type": "mistral", "vocab_size": 1000, "hidden_size": 640, "intermediate_size": 2048,
                    "num_hidden_layers": 3, "num_attention_heads": 5, "num_key_value_heads": 1,
                    "head_dim": 64, "sliding_window": 100}},
        _gemma("gemma3_text", layer_types=[S, S, S, S, S, F], sliding_window=300),
    ]
    out = run(DRIVER, {"cases": cases}, timeout=300)["out"]
    for case, got in zip(cases, out):
        assert got["printed"] == "", (
            f"{case['label']}: FlopsCounter printed {got['printed']!r} at construction; a supported model type "
            f"prints nothing")
    _check(cases, out)


def test_other_model_types_keep_their_estimates():
    dense = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
             "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}
    cases = [
        {"label": "llama", "config": dict(dense, model_type="llama", head_dim=96), "batches": BATCHES},
        {"label": "qwen2", "config": dict(dense, model_type="qwen2"), "batches": BATCHES},
        {"label": "qwen3 with a sliding_window attribute", "batches": BATCHES,
         "config": dict(dense, model_type="qwen3", sliding_window=256)},
    ]
    unknown = [
        {"label": f"unsupported type {t}", "batches": BATCHES,
         "config": dict(dense, model_type=t, sliding_window=256, layer_types=None, sliding_window_pattern=6)}
        for t in ("gpt2", "phi3", "starcoder2")
    ]
    out = run(DRIVER, {"cases": cases + unknown}, timeout=300)["out"]
    _check(cases, out[:len(cases)])
    for case, got in zip(unknown, out[len(cases):]):
        assert got["printed"].strip(), (
            f"{case['label']}: FlopsCounter printed nothing at construction; an unsupported type still gets "
            f"its message")
        assert all(v == 0 for v in got["achieved"]), (
            f"{case['label']}: achieved TFLOPs {got['achieved']}, want 0 for an unsupported model type")
