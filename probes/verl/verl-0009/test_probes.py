"""Probes for verl-0009 (a sampling temperature per sample in the FSDP model engine).

The judge (this module) never imports verl or torch. Each probe sends a driver to a child that
builds FSDPEngineWithLMHead around a model whose logits are a lookup table (logits of a token =
one row of the table), runs forward_backward_batch on a batch of jagged sequences with
per-sample (or one float) temperatures, and sends back the engine's log-probs, entropies and,
after a backward pass, the table's gradient. Everything is drawn fresh for every attempt: the
table, the vocabulary size, the sequences (their number, lengths and tokens), the temperatures
and the micro-batch size. The judge computes the expected values itself with numpy:
log_softmax(table[token] / T_i) at the next token of the same sample, the entropy of
softmax(table[token] / T_i), and the gradient of the summed log-probs.

The child forks its ranks (RANKS_PRELUDE) and uses CUDA with NCCL where GPUs are visible, CPU with
gloo elsewhere; the Ulysses probe needs two ranks.
"""

import numpy as np

from infradev_probe import RANKS_PRELUDE, fresh, run


def _scenario(rng, micro, groups, lo=2, hi=9):
    """A lookup table and micro * groups sequences whose lengths are no palindrome within any
    micro-batch (so that rows of one micro-batch cannot be mistaken for each other), with
    distinct temperatures."""
    vocab = int(rng.integers(8, 25))
    table = rng.normal(scale=2.0, size=(vocab, vocab))
    lens = []
    for _ in range(groups):
        while True:
            chunk = rng.integers(lo, hi + 1, size=micro).tolist()
            if micro == 1 or chunk != chunk[::-1]:
                break
        lens += chunk
    seqs = [rng.integers(0, vocab, size=n).tolist() for n in lens]
    temps = [float(t) for t in rng.permutation(np.round(rng.uniform(0.2, 3.0, size=len(seqs)), 3))]
    while len(set(temps)) < len(temps):
        temps = [float(t) for t in np.round(rng.uniform(0.2, 3.0, size=len(seqs)), 3)]
    return table, seqs, temps


ENGINE = r"""
import types

import numpy as np
import torch
import torch.distributed as dist


def _rank(rank, world, port, payload):
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            init_method="tcp://127.0.0.1:%d" % port)
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import FSDPEngineConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    table = torch.tensor(np.array(payload["table"]), dtype=torch.float32)

    class TableLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = types.SimpleNamespace(model_type="table")
            self.emb = torch.nn.Embedding(table.shape[0], table.shape[1])
            with torch.no_grad():
                self.emb.weight.copy_(table)

        def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
            return types.SimpleNamespace(logits=self.emb(input_ids))

    out = {}
    for case in payload["cases"]:
        engine_config = FSDPEngineConfig(strategy="fsdp", use_torch_compile=False,
                                         ulysses_sequence_parallel_size=case["sp"])
        model_config = types.SimpleNamespace(use_remove_padding=case["rmpad"], lora_rank=0)
        engine = FSDPEngineWithLMHead(model_config, engine_config, None, None)
        engine.module = TableLM().to(dev)
        engine.optimizer = torch.optim.SGD(engine.module.parameters(), lr=0.0)

        def nested(ts):
            return torch.nested.as_nested_tensor(ts, layout=torch.jagged)

        seqs = [torch.tensor(s, dtype=torch.long) for s in case["seqs"]]
        tensors = {
            "input_ids": nested(seqs),
            "position_ids": nested([torch.arange(len(s)) for s in seqs]),
            "loss_mask": nested([torch.ones(len(s), dtype=torch.long) for s in seqs]),
        }
        non_tensor = {"use_remove_padding": case["rmpad"], "use_dynamic_bsz": False,
                      "micro_batch_size_per_gpu": case["micro"], "calculate_entropy": case["entropy"]}
        if isinstance(case["temperature"], list):
            tensors["temperature"] = torch.tensor(case["temperature"], dtype=torch.float32)
        else:
            non_tensor["temperature"] = case["temperature"]
        data = tu.get_tensordict(tensors, non_tensor)

        grad = np.zeros(0)
        if case["train"]:
            def loss_fn(model_output, data, dp_group=None):
                return model_output["log_probs"].values().sum(), {}

            with engine.train_mode(disable_auto_offload=True):
                res = engine.forward_backward_batch(data, loss_function=loss_fn, forward_only=False)
                grad = engine.module.emb.weight.grad.detach().float().cpu().numpy().copy()
        else:
            with engine.eval_mode(disable_auto_offload=True):
                res = engine.forward_backward_batch(data, loss_function=None, forward_only=True)
        mo = res["model_output"]
        got = {"log_probs": [t.detach().float().cpu().numpy() for t in mo["log_probs"].unbind()], "grad": grad}
        if case["entropy"]:
            got["entropy"] = [t.detach().float().cpu().numpy() for t in mo["entropy"].unbind()]
        out[case["name"]] = got
    dist.destroy_process_group()
    return out


emit(ranks=spawn_ranks(ARGS["world"], _rank, ARGS, 240, cuda=False))
"""


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _expected(table, seqs, temps):
    """Per sample: log-probs of each token's next token (the last token of a sample has none and
    is not judged), entropies, and the gradient of the summed judged log-probs w.r.t. the table."""
    lps, ents = [], []
    for s, t in zip(seqs, temps):
        ls = _log_softmax(table[s] / t)
        lps.append(np.array([ls[i, s[i + 1]] for i in range(len(s) - 1)]))
        p = np.exp(ls)
        ents.append(-(p * ls).sum(-1))
    return lps, ents


def _grad(table, seqs, temps):
    """Gradient of the sum of all log-probs the engine returns for one micro-batch holding every
    sample: packed tokens labelled by the next packed token (the last wraps to the first)."""
    ids = np.concatenate([np.array(s) for s in seqs])
    labels = np.roll(ids, -1)
    T = np.concatenate([[t] * len(s) for s, t in zip(seqs, temps)])
    p = np.exp(_log_softmax(table[ids] / T[:, None]))
    g = np.zeros_like(table)
    for i in range(len(ids)):
        onehot = np.zeros(table.shape[1])
        onehot[labels[i]] = 1.0
        g[ids[i]] += (onehot - p[i]) / T[i]
    return g


def _check_log_probs(name, got, table, seqs, temps, entropy=False, rank=0):
    want_lp, want_ent = _expected(table, seqs, temps)
    assert len(got["log_probs"]) == len(seqs), f"{name}: {len(got['log_probs'])} rows of log_probs for {len(seqs)} samples"
    for i, (g, w, s) in enumerate(zip(got["log_probs"], want_lp, seqs)):
        g = np.asarray(g, dtype=np.float64).reshape(-1)
        assert g.shape[0] == len(s), f"{name}, rank {rank}: sample {i} has {g.shape[0]} log-probs for {len(s)} tokens"
        assert np.allclose(g[:-1], w, atol=2e-4, rtol=1e-4), (
            f"{name}, rank {rank}: log-probs of sample {i} (temperature {temps[i]}) are {np.round(g[:-1], 4)}; "
            f"want {np.round(w, 4)} (logits divided by that sample's temperature)")
    if entropy:
        for i, (g, w) in enumerate(zip(got["entropy"], want_ent)):
            g = np.asarray(g, dtype=np.float64).reshape(-1)
            assert np.allclose(g, w, atol=2e-4, rtol=1e-4), (
                f"{name}, rank {rank}: entropies of sample {i} (temperature {temps[i]}) are {np.round(g, 4)}; "
                f"want {np.round(w, 4)}")


def test_per_sample_temperature_with_padding_removed():
    rng = fresh()
    micro = int(rng.integers(2, 4))
    table, seqs, temps = _scenario(rng, micro, int(rng.integers(2, 4)))
    t_float = float(np.round(rng.uniform(0.2, 3.0), 3))
    cases = [
        {"name": "per-sample", "sp": 1, "rmpad": True, "micro": micro, "train": False, "entropy": True,
         "seqs": seqs, "temperature": temps},
        {"name": "float", "sp": 1, "rmpad": True, "micro": int(rng.choice([d for d in range(1, 5) if len(seqs) % d == 0])),
         "train": False, "entropy": True,
         "seqs": seqs, "temperature": t_float},
    ]
    out = run(RANKS_PRELUDE + ENGINE, {"world": 1, "table": table, "cases": cases}, timeout=400)
    got = out["ranks"][0]
    _check_log_probs(f"packed path, per-sample temperatures, micro-batches of {micro}", got["per-sample"], table,
                     seqs, temps, entropy=True)
    _check_log_probs(f"packed path, one float temperature {t_float}", got["float"], table, seqs,
                     [t_float] * len(seqs), entropy=True)


def test_per_sample_temperature_in_padded_path():
    rng = fresh()
    micro = int(rng.integers(2, 4))
    table, seqs, temps = _scenario(rng, micro, int(rng.integers(2, 4)))
    cases = [{"name": "padded", "sp": 1, "rmpad": False, "micro": micro, "train": False, "entropy": True,
              "seqs": seqs, "temperature": temps}]
    out = run(RANKS_PRELUDE + ENGINE, {"world": 1, "table": table, "cases": cases}, timeout=400)
    _check_log_probs(f"padded path (use_remove_padding=False), per-sample temperatures, micro-batches of {micro}",
                     out["ranks"][0]["padded"], table, seqs, temps, entropy=True)


def test_ulysses_padding_keeps_results_and_gradients_finite():
    rng = fresh()
    # an odd number of packed tokens over a sequence-parallel group of 2: the group pads one position
    while True:
        table, seqs, temps = _scenario(rng, int(rng.integers(3, 7)), 1)
        if sum(len(s) for s in seqs) % 2 == 1:
            break
    cases = [{"name": "sp2", "sp": 2, "rmpad": True, "micro": len(seqs), "train": True, "entropy": False,
              "seqs": seqs, "temperature": temps}]
    out = run(RANKS_PRELUDE + ENGINE, {"world": 2, "table": table, "cases": cases}, timeout=400)
    grads = []
    assert len(out["ranks"]) == 2, f"{len(out['ranks'])} ranks answered, want 2"
    for r, got in enumerate(out["ranks"]):
        _check_log_probs("Ulysses sequence parallel of 2, per-sample temperatures", got["sp2"], table, seqs, temps,
                         rank=r)
        g = np.asarray(got["sp2"]["grad"], dtype=np.float64)
        assert g.shape == table.shape, f"rank {r}: gradient of shape {g.shape}, want {table.shape}"
        bad = int((~np.isfinite(g)).sum())
        assert bad == 0, (
            f"rank {r}: {bad} gradient entries are not finite after a backward pass through the sequence-parallel "
            f"log-probs (the padding added for the group must not poison the computation)")
        grads.append(g)
    total = grads[0] + grads[1]
    want = _grad(table, seqs, temps)
    # the sequence-parallel gather may scale gradients by the group size: accept any positive factor
    scale = float((total * want).sum() / (want * want).sum())
    assert scale > 0 and np.allclose(total, scale * want, atol=1e-3 * max(1.0, scale)), (
        f"the two ranks' gradients add up to something not proportional to the gradient of the summed "
        f"log-probs (best factor {scale:.3f}, largest deviation {np.abs(total - scale * want).max():.4f})")


EXPAND = r"""
import torch

from verl.utils.torch_functional import expand_as_nested
from verl.utils.ulysses import ulysses_pad

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
res = {"devices": devices}
for dev in devices:
    out = []
    for call in ARGS["calls"]:
        nt = torch.nested.as_nested_tensor([torch.arange(n, device=dev) for n in call["lens"]], layout=torch.jagged)
        dtype = {"float": torch.float32, "long": torch.long}[call["dtype"]]
        t = torch.tensor(call["vals"], dtype=dtype, device=dev)
        if call["bad"] == "not-nested":
            nt = torch.tensor(call["vals"], device=dev)
        elif call["bad"] == "ndim":
            t = t.unsqueeze(0)
        elif call["bad"] == "nested-3d":
            nt = torch.nested.as_nested_tensor([torch.zeros(n, 2, device=dev) for n in call["lens"]],
                                               layout=torch.jagged)
        try:
            o = expand_as_nested(t, nt)
            out.append({"nested": bool(o.is_nested), "rows": [r.cpu().numpy() for r in o.unbind()],
                        "offsets": o.offsets().cpu().numpy(), "dtype": str(o.dtype),
                        "device": o.values().device.type})
        except AssertionError:
            out.append({"error": "AssertionError"})
        except Exception as e:
            out.append({"error": type(e).__name__})
    res[dev] = out

pads = []
for p in ARGS["pads"]:
    x = torch.tensor(p["x"], dtype=torch.float32).unsqueeze(0)
    kw = {} if p["value"] is None else {"pad_value": p["value"]}
    padded, _, size = ulysses_pad(x, position_ids_rmpad=None, sp_size=p["sp"], **kw)
    pads.append({"padded": padded.numpy(), "size": int(size)})
res["pads"] = pads
emit(**res)
"""


def test_expand_as_nested_and_ulysses_pad_value():
    rng = fresh()
    kinds = ["ok", "not-nested", "batch", "ndim"]
    kinds += [str(k) for k in rng.choice(["ok", "ok", "not-nested", "batch", "ndim", "nested-3d"],
                                         size=int(rng.integers(1, 4)))]
    kinds = [kinds[i] for i in rng.permutation(len(kinds))]
    calls = []
    for kind in kinds:
        n = int(rng.integers(2, 7))
        while True:
            lens = rng.integers(1, 7, size=n).tolist()
            if lens != lens[::-1]:
                break
        dtype = str(rng.choice(["float", "long"]))
        vals = rng.integers(-1000, 1000, size=n).tolist() if dtype == "long" else \
            np.round(rng.normal(size=n), 4).tolist()
        if kind == "batch":
            vals = vals + vals[:int(rng.integers(1, 3))]
        calls.append({"lens": lens, "vals": vals, "dtype": dtype, "bad": None if kind == "ok" else kind})
    pads = []
    for value in (float(rng.integers(1, 100)), None, float(np.round(rng.uniform(-5, 5), 2))):
        sp = int(rng.integers(2, 6))
        length = sp * int(rng.integers(1, 4)) + int(rng.integers(1, sp))  # never a multiple: padding is added
        pads.append({"x": np.round(rng.uniform(1, 50, size=length), 2).tolist(), "sp": sp, "value": value})
    out = run(EXPAND, {"calls": calls, "pads": pads}, timeout=200)
    assert out["devices"][:1] == ["cpu"], f"devices {out['devices']}"
    for dev in out["devices"]:
        assert len(out[dev]) == len(calls), f"{dev}: {len(out[dev])} results for {len(calls)} calls"
        for i, (call, got) in enumerate(zip(calls, out[dev])):
            label = f"{dev}, call {i + 1} (lengths {call['lens']}, {call['dtype']} values {call['vals']})"
            if call["bad"] is not None:
                assert got == {"error": "AssertionError"}, (
                    f"{label}, invalid ({call['bad']}): expand_as_nested gave {got}; want an AssertionError")
                continue
            assert "error" not in got, f"{label}: expand_as_nested raised {got['error']}"
            assert got["nested"], f"{label}: expand_as_nested did not return a nested tensor"
            rows = [np.asarray(r).tolist() for r in got["rows"]]
            cast = float if call["dtype"] == "float" else int
            want = [[cast(np.float32(v)) if cast is float else v] * n for v, n in zip(call["vals"], call["lens"])]
            assert rows == want, f"{label}: expand_as_nested gave rows {rows}; want {want}"
            offsets = np.concatenate([[0], np.cumsum(call["lens"])]).tolist()
            assert np.asarray(got["offsets"]).tolist() == offsets, (
                f"{label}: offsets {np.asarray(got['offsets']).tolist()}, want those of the input {offsets}")
            dtype = "torch.float32" if call["dtype"] == "float" else "torch.int64"
            assert got["dtype"] == dtype and got["device"] == dev, (
                f"{label}: result has dtype {got['dtype']} on {got['device']}; want {dtype} on {dev}")
    assert len(out["pads"]) == len(pads), f"{len(out['pads'])} ulysses_pad results for {len(pads)} calls"
    for p, got in zip(pads, out["pads"]):
        size = (p["sp"] - len(p["x"]) % p["sp"]) % p["sp"]
        fill = 0.0 if p["value"] is None else float(np.float32(p["value"]))
        want = [[float(np.float32(v)) for v in p["x"]] + [fill] * size]
        assert int(got["size"]) == size and np.asarray(got["padded"]).tolist() == want, (
            f"ulysses_pad of {len(p['x'])} values to a multiple of {p['sp']} with "
            f"{'no pad_value (0)' if p['value'] is None else 'pad_value=%s' % p['value']} gave "
            f"{np.asarray(got['padded']).tolist()} (pad size {got['size']}); want {want} (pad size {size})")
