"""Probes for verl-0009 (a sampling temperature per sample in the FSDP model engine).

The judge (this module) never imports verl or torch. Each probe sends a driver to a child that
builds FSDPEngineWithLMHead around a model whose logits are a lookup table the judge chose
(logits of a token = one row of the table), runs forward_backward_batch on a batch of jagged
sequences the judge chose, with per-sample (or one float) temperatures, and sends back the
engine's log-probs, entropies and, after a backward pass, the table's gradient. The judge computes
the expected values itself with numpy: log_softmax(table[token] / T_i) at the next token of the
same sample, the entropy of softmax(table[token] / T_i), and the gradient of the summed log-probs.

The child forks its ranks (RANKS_PRELUDE) and uses CUDA with NCCL where GPUs are visible, CPU with
gloo elsewhere; the Ulysses probe needs two ranks.
"""

import numpy as np

from infradev_probe import RANKS_PRELUDE, run

V = 13
SEQS = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 0, 1, 2, 3, 4], [5, 6, 7, 8], [11, 12, 11], [3, 9, 12, 0]]
TEMPS = [0.5, 1.0, 2.0, 4.0, 0.25, 1.25]


def _table(seed):
    return np.random.default_rng(seed).normal(scale=2.0, size=(V, V))


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
    table = _table(1)
    cases = [
        {"name": "per-sample", "sp": 1, "rmpad": True, "micro": 2, "train": False, "entropy": True,
         "seqs": SEQS, "temperature": TEMPS},
        {"name": "float", "sp": 1, "rmpad": True, "micro": 3, "train": False, "entropy": True,
         "seqs": SEQS, "temperature": 0.7},
    ]
    out = run(RANKS_PRELUDE + ENGINE, {"world": 1, "table": table, "cases": cases}, timeout=400)
    got = out["ranks"][0]
    _check_log_probs("packed path, per-sample temperatures, micro-batches of 2", got["per-sample"], table,
                     SEQS, TEMPS, entropy=True)
    _check_log_probs("packed path, one float temperature 0.7", got["float"], table, SEQS,
                     [0.7] * len(SEQS), entropy=True)


def test_per_sample_temperature_in_padded_path():
    table = _table(2)
    temps = [3.0, 0.5, 1.0, 0.2, 1.5, 0.8]
    cases = [{"name": "padded", "sp": 1, "rmpad": False, "micro": 2, "train": False, "entropy": True,
              "seqs": SEQS, "temperature": temps}]
    out = run(RANKS_PRELUDE + ENGINE, {"world": 1, "table": table, "cases": cases}, timeout=400)
    _check_log_probs("padded path (use_remove_padding=False), per-sample temperatures", out["ranks"][0]["padded"],
                     table, SEQS, temps, entropy=True)


def test_ulysses_padding_keeps_results_and_gradients_finite():
    table = _table(3)
    # 25 packed tokens over a sequence-parallel group of 2: the group pads one position
    seqs = SEQS[:-1] + [[3, 9, 12]]
    assert sum(len(s) for s in seqs) % 2 == 1
    cases = [{"name": "sp2", "sp": 2, "rmpad": True, "micro": len(seqs), "train": True, "entropy": False,
              "seqs": seqs, "temperature": TEMPS}]
    out = run(RANKS_PRELUDE + ENGINE, {"world": 2, "table": table, "cases": cases}, timeout=400)
    grads = []
    for r, got in enumerate(out["ranks"]):
        _check_log_probs("Ulysses sequence parallel of 2, per-sample temperatures", got["sp2"], table, seqs, TEMPS,
                         rank=r)
        g = np.asarray(got["sp2"]["grad"], dtype=np.float64)
        assert g.shape == table.shape, f"rank {r}: gradient of shape {g.shape}, want {table.shape}"
        bad = int((~np.isfinite(g)).sum())
        assert bad == 0, (
            f"rank {r}: {bad} gradient entries are not finite after a backward pass through the sequence-parallel "
            f"log-probs (the padding added for the group must not poison the computation)")
        grads.append(g)
    total = grads[0] + grads[1]
    want = _grad(table, seqs, TEMPS)
    # the sequence-parallel gather may scale gradients by the group size: accept any positive factor
    scale = float((total * want).sum() / (want * want).sum())
    assert scale > 0 and np.allclose(total, scale * want, atol=1e-3 * max(1.0, scale)), (
        f"the two ranks' gradients add up to something not proportional to the gradient of the summed "
        f"log-probs (best factor {scale:.3f}, largest deviation {np.abs(total - scale * want).max():.4f})")


EXPAND = r"""
import torch

from verl.utils.torch_functional import expand_as_nested
from verl.utils.ulysses import ulysses_pad, ulysses_pad_and_slice_inputs

devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
res = {}
for dev in devices:
    seqs = [torch.arange(n, device=dev) for n in ARGS["lens"]]
    nt = torch.nested.as_nested_tensor(seqs, layout=torch.jagged)
    for name, dtype in (("float", torch.float32), ("long", torch.long)):
        t = torch.tensor(ARGS["vals"], dtype=dtype, device=dev)
        o = expand_as_nested(t, nt)
        res[dev + "-" + name] = {
            "nested": bool(o.is_nested),
            "rows": [r.cpu().numpy() for r in o.unbind()],
            "offsets": o.offsets().cpu().numpy(),
            "dtype": str(o.dtype), "device": o.values().device.type,
        }
    errors = {}
    bad = {"not-nested": (torch.tensor(ARGS["vals"], device=dev), torch.tensor(ARGS["vals"], device=dev)),
           "batch": (torch.tensor(ARGS["vals"] + [1.0], device=dev), nt),
           "ndim": (torch.tensor([ARGS["vals"]], device=dev), nt)}
    for key, (a, b) in bad.items():
        try:
            expand_as_nested(a, b)
            errors[key] = "none"
        except AssertionError:
            errors[key] = "AssertionError"
        except Exception as e:
            errors[key] = type(e).__name__
    res[dev + "-errors"] = errors
res["offsets_in"] = torch.nested.as_nested_tensor([torch.arange(n) for n in ARGS["lens"]], layout=torch.jagged).offsets().numpy()

x = torch.arange(1, 8, dtype=torch.float32).unsqueeze(0)  # (1, 7)
p, _, pad = ulysses_pad(x, position_ids_rmpad=None, sp_size=4, pad_value=1)
p0, _, pad0 = ulysses_pad(x, position_ids_rmpad=None, sp_size=4)
res["pad"] = {"padded": p.numpy(), "size": pad, "default": p0.numpy()}
emit(**res)
"""


def test_expand_as_nested_and_ulysses_pad_value():
    lens, vals = [3, 1, 4, 2], [0.5, 2.0, 7.0, 3.0]
    out = run(EXPAND, {"lens": lens, "vals": vals}, timeout=200)
    devices = ["cpu"] + (["cuda"] if "cuda-float" in out else [])
    for dev in devices:
        for name, dtype in (("float", "torch.float32"), ("long", "torch.int64")):
            got = out[f"{dev}-{name}"]
            assert got["nested"], f"{dev}/{name}: expand_as_nested did not return a nested tensor"
            rows = [np.asarray(r).tolist() for r in got["rows"]]
            want = [[float(v) if name == "float" else int(v)] * n for v, n in zip(vals, lens)]
            assert rows == want, f"{dev}/{name}: expand_as_nested gave rows {rows}; want {want}"
            assert np.asarray(got["offsets"]).tolist() == np.asarray(out["offsets_in"]).tolist(), (
                f"{dev}/{name}: offsets {np.asarray(got['offsets']).tolist()}, want those of the input "
                f"{np.asarray(out['offsets_in']).tolist()}")
            assert got["dtype"] == dtype and got["device"] == dev, (
                f"{dev}/{name}: result has dtype {got['dtype']} on {got['device']}; want {dtype} on {dev}")
        errors = out[f"{dev}-errors"]
        assert errors == {"not-nested": "AssertionError", "batch": "AssertionError", "ndim": "AssertionError"}, (
            f"{dev}: invalid arguments raised {errors}; want AssertionError for each")
    pad = out["pad"]
    assert int(pad["size"]) == 1 and np.asarray(pad["padded"]).tolist() == [[1, 2, 3, 4, 5, 6, 7, 1]], (
        f"ulysses_pad of 7 tokens to a multiple of 4 with pad_value=1 gave {np.asarray(pad['padded']).tolist()} "
        f"(pad size {pad['size']})")
    assert np.asarray(pad["default"]).tolist() == [[1, 2, 3, 4, 5, 6, 7, 0]], (
        f"ulysses_pad without pad_value must still pad with 0: {np.asarray(pad['default']).tolist()}")
