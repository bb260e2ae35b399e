"""Hidden probes for vllm-0009 (fully sharded LoRA in the fused MoE LoRA path: S-LoRA style
sharding of the shrink and expand weights over tensor-parallel ranks).

The judge never imports vllm or torch. Each probe forks two ranks (one GPU each) that join vLLM's
tensor-parallel group (NCCL, custom all-reduce off) and send back plain data: kernel outputs, the
collectives each call issued on the tensor-parallel group (recorded by wrapping the group's
collective methods and its device communicator's, with the values of the tensor each one was
given), and the LoRA layer's stacked buffers.

Every scenario is drawn fresh (``fresh()``): token count, top-k, experts, adapters, LoRA rank,
hidden and intermediate sizes, slices, routing, adapter mapping, the slot set_lora writes, and
every weight, hidden state and base output. Values are multiples of 0.5 small enough that
float16 holds every shrink product exactly. The judge cuts each rank's shards by the
instruction's layout and computes the expected outputs, the expected collectives (kind, size and
the multiset of the rank's shrink values they carry) and the expected buffer contents itself, in
float64. The kernel scenarios run once in one child and are shared by three probes."""

import functools

import numpy as np

from infradev_probe import RANKS_PRELUDE, fresh, run

_ENV = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
WORLD = 2

_SETUP = RANKS_PRELUDE + r'''
import numpy as np
import torch


def setup(rank, world, port):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    ps.set_custom_all_reduce(False)
    ps.init_distributed_environment(world_size=world, rank=rank,
                                    distributed_init_method=f"tcp://127.0.0.1:{port}",
                                    local_rank=rank, backend="nccl")
    cfg = VllmConfig()
    cfg.parallel_config.tensor_parallel_size = world
    ctx = set_current_vllm_config(cfg)
    ctx.__enter__()
    ps.ensure_model_parallel_initialized(tensor_model_parallel_size=world,
                                         pipeline_model_parallel_size=1)
    dev = torch.device("cuda", rank)
    warm = torch.ones(4, device=dev)
    ps.get_tp_group().all_reduce(warm)
    torch.cuda.synchronize()
    return dev


def f16(a, dev):
    return torch.from_numpy(np.ascontiguousarray(a)).to(device=dev, dtype=torch.float16)
'''

_KERNEL = _SETUP + r'''
def kernel_scenarios(rank, world, port, args):
    dev = setup(rank, world, port)
    from vllm import _custom_ops as ops
    from vllm.distributed.parallel_state import get_tp_group
    from vllm.lora.ops.triton_ops import fused_moe_lora

    tp = get_tp_group()
    log, depth = [], [0]

    def spy(kind, fn, pos=0):
        # pos: the position of the rank's own input tensor among the arguments.
        def wrapped(*a, **kw):
            if depth[0] == 0:
                given = list(a) + list(kw.values())
                x = given[pos] if len(given) > pos else None
                entry = {"kind": kind, "numel": -1, "values": np.zeros(0, dtype=np.float32)}
                if isinstance(x, torch.Tensor):
                    entry["numel"] = int(x.numel())
                    entry["values"] = np.sort(x.detach().float().cpu().numpy().ravel())
                log.append(entry)
            depth[0] += 1
            try:
                return fn(*a, **kw)
            finally:
                depth[0] -= 1
        return wrapped

    for obj in (tp, tp.device_communicator):
        if obj is None:
            continue
        for name in ("all_reduce", "all_gather", "all_gatherv", "reduce_scatter",
                     "reduce_scatterv", "broadcast", "gather"):
            if hasattr(obj, name):
                setattr(obj, name, spy(name, getattr(obj, name)))
    for name, pos in (("all_reduce", 0), ("all_gather", 1), ("all_gather_into_tensor", 1),
                      ("reduce_scatter_tensor", 1), ("broadcast", 0)):
        setattr(torch.distributed, name, spy(name, getattr(torch.distributed, name), pos))

    max_loras, experts, block = args["max_loras"], args["experts"], args["block"]
    topk_ids = torch.from_numpy(args["topk_ids"]).to(dev)
    topk_weights = torch.from_numpy(args["topk_weights"]).to(dev)
    mapping = torch.from_numpy(args["mapping"]).to(dev)
    m, top_k = topk_ids.shape

    def call(output, hidden, a_list, b_list, rank_arg, **kw):
        padded = topk_ids.numel() + experts * (block - 1)
        padded = (padded + block - 1) // block * block
        m_blocks = (padded + block - 1) // block
        sorted_ids = torch.empty(max_loras * padded, dtype=torch.int32, device=dev)
        expert_ids = torch.empty(max_loras * m_blocks, dtype=torch.int32, device=dev)
        post = torch.empty(max_loras, dtype=torch.int32, device=dev)
        enabled = torch.ones(max_loras + 1, dtype=torch.int32, device=dev)
        lora_ids = torch.arange(max_loras + 2, dtype=torch.int32, device=dev)
        ops.moe_lora_align_block_size(topk_ids, mapping, experts, block, max_loras, padded,
                                      m_blocks, sorted_ids, expert_ids, post, enabled, lora_ids)
        cfg = (16, 32, 64, 1, 4, 3, 1)
        fused_moe_lora(output, hidden, a_list, b_list, topk_weights,
                       sorted_ids.view(max_loras, -1), expert_ids.view(max_loras, -1), post,
                       rank_arg, top_k, lora_ids, enabled, *cfg, *cfg, False, **kw)
        torch.cuda.synchronize()

    out = {}
    for sc in args["scenarios"]:
        mine = sc["ranks"][rank]
        hidden = f16(mine["hidden"], dev)
        a_list = [f16(a, dev) for a in mine["a"]]
        b_list = [f16(b, dev) for b in mine["b"]]
        output = f16(mine["base"], dev)
        kw = {}
        if sc["sharded"]:
            kw = {"fully_sharded": True, "offset": mine["offset"]}
        start = len(log)
        call(output, hidden, a_list, b_list, mine["rank_arg"], **kw)
        out[sc["name"]] = {"output": output.float().cpu().numpy(), "collectives": log[start:]}
    return out


emit(ranks=spawn_ranks(2, kernel_scenarios, ARGS, 420))
'''

_LAYER = _SETUP + r'''
def layer_buffers(rank, world, port, args):
    dev = setup(rank, world, port)
    from vllm.config.lora import LoRAConfig
    from vllm.lora.layers.fused_moe import FusedMoEWithLoRA
    from vllm.model_executor.layers.fused_moe import FusedMoE

    from vllm.config import get_current_vllm_config

    e, hidden, inter = args["experts"], args["hidden"], args["inter"]
    # As in a LoRA engine: the MoE layer is built knowing that LoRA is on.
    get_current_vllm_config().lora_config = LoRAConfig(max_lora_rank=args["rank"],
                                                       max_loras=args["max_loras"])
    names = ("w1_lora_a_stacked", "w1_lora_b_stacked", "w2_lora_a_stacked",
             "w2_lora_b_stacked", "w3_lora_a_stacked", "w3_lora_b_stacked")
    out = {}
    for sharded in args["order"]:
        with torch.device(dev):
            base = FusedMoE(num_experts=e, top_k=2, hidden_size=hidden, intermediate_size=inter,
                            params_dtype=torch.float16, prefix=f"probe_moe_{int(sharded)}")
        layer = FusedMoEWithLoRA(base)
        cfg = LoRAConfig(max_lora_rank=args["rank"], max_loras=args["max_loras"],
                         fully_sharded_loras=sharded, lora_dtype=torch.float16)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(dev)
        layer.create_lora_weights(args["max_loras"], cfg)
        torch.cuda.synchronize()
        grown = torch.cuda.memory_allocated(dev) - before
        lora_a, lora_b = [], []
        for x in range(e):
            for k in ("w1", "w2", "w3"):
                lora_a.append(f16(args["lora_a"][k][x], dev))
                lora_b.append(f16(args["lora_b"][k][x], dev))
        layer.set_lora(args["slot"], lora_a, lora_b, None)
        torch.cuda.synchronize()
        out["sharded" if sharded else "replicated"] = {
            "grown": int(grown),
            "buffers": {n: getattr(layer, n).float().cpu().numpy() for n in names},
        }
    return out


emit(ranks=spawn_ranks(2, layer_buffers, ARGS, 420))
'''

# ---- the judge's inputs and reference ----

BLOCK = 16  # the align block size, equal to the kernel configs' BLOCK_SIZE_M


def _halves(rng, shape, span=1):
    """Multiples of 0.5 in [-span/2, span/2]: exact in float16, and so are the shrink sums."""
    return (rng.integers(-span, span + 1, size=shape) * 0.5).astype(np.float16)


def _share(r, n):
    """Share r of a dimension of size n over WORLD ranks."""
    return slice(r * n // WORLD, (r + 1) * n // WORLD)


def _shrink(hidden, a, ids, mapping):
    """Per token and expert slot: hidden[t] @ A[l, e].T (float64)."""
    m, top_k = ids.shape
    out = np.zeros((m, top_k, a.shape[2]), dtype=np.float64)
    h = hidden.astype(np.float64)
    for t in range(m):
        for k in range(top_k):
            out[t, k] = a[mapping[t], ids[t, k]].astype(np.float64) @ h[t]
    return out


def _expand(shrunk, b, ids, mapping):
    """Per token and expert slot: shrunk[t, k] @ B[l, e].T (float64)."""
    m, top_k = ids.shape
    out = np.zeros((m, top_k, b.shape[2]), dtype=np.float64)
    for t in range(m):
        for k in range(top_k):
            out[t, k] = b[mapping[t], ids[t, k]].astype(np.float64) @ shrunk[t, k]
    return out


@functools.lru_cache(maxsize=None)
def _kernel_case():
    rng = fresh()
    m = int(rng.integers(8, 65))
    experts = int(rng.integers(4, 13))
    top_k = int(rng.integers(1, 5))
    max_loras = int(rng.integers(1, 4))
    rank = int(rng.choice([16, 32, 64]))
    hidden = 32 * int(rng.integers(2, 9))      # gate/up input, down output
    inter = 32 * int(rng.integers(1, 5))       # gate/up output per slice, down input
    slices = int(rng.integers(2, 4))           # gate/up slices in one call
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(m)]).astype(np.int32)
    weights = (rng.integers(1, 4, size=(m, top_k)) * 0.25).astype(np.float32)
    mapping = rng.integers(0, max_loras, size=m).astype(np.int32)

    # gate_up (column parallel): `slices` slices, input hidden, output inter each.
    h_col = _halves(rng, (m, hidden))
    a_col = [_halves(rng, (max_loras, experts, rank, hidden)) for _ in range(slices)]
    b_col = [_halves(rng, (max_loras, experts, inter, rank)) for _ in range(slices)]
    base_col = [_halves(rng, (m, top_k, slices * inter // WORLD), 2) for _ in range(WORLD)]
    # down (row parallel): one slice, input inter, output hidden.
    h_row = _halves(rng, (m, inter))
    a_row = _halves(rng, (max_loras, experts, rank, inter))
    b_row = _halves(rng, (max_loras, experts, hidden, rank))
    base_row = [_halves(rng, (m, top_k, hidden), 2) for _ in range(WORLD)]
    base_full = _halves(rng, (m, top_k, slices * inter), 2)

    col_ranks, row_ranks = [], []
    for r in range(WORLD):
        rs, ns = _share(r, rank), _share(r, inter)
        col_ranks.append({"hidden": h_col, "a": [a[:, :, rs, :] for a in a_col],
                          "b": [b[:, :, ns, :] for b in b_col], "base": base_col[r],
                          "rank_arg": rank // WORLD, "offset": 0})
        ks, hs = _share(r, inter), _share(r, hidden)
        row_ranks.append({"hidden": h_row[:, ks], "a": [a_row[:, :, :, ks]],
                          "b": [b_row[:, :, hs, :]], "base": base_row[r],
                          "rank_arg": rank, "offset": r * hidden // WORLD})
    full = {"hidden": h_col, "a": a_col, "b": b_col, "base": base_full, "rank_arg": rank,
            "offset": 0}
    args = {
        "max_loras": max_loras, "experts": experts, "block": BLOCK,
        "topk_ids": ids, "topk_weights": weights, "mapping": mapping,
        "scenarios": [
            {"name": "column", "sharded": True, "ranks": col_ranks},
            {"name": "row", "sharded": True, "ranks": row_ranks},
            {"name": "replicated", "sharded": False, "ranks": [full, full]},
        ],
    }
    got = run(_KERNEL, args, timeout=600, env=_ENV)["ranks"]
    assert isinstance(got, list) and len(got) == WORLD, "the driver must return one value per rank"

    # The judge's own reference, in float64.
    full_col = [_shrink(h_col, a_col[i], ids, mapping) for i in range(slices)]
    d_col = [_expand(full_col[i], b_col[i], ids, mapping) for i in range(slices)]
    row_partial = [_shrink(h_row[:, _share(r, inter)], a_row[:, :, :, _share(r, inter)], ids, mapping)
                   for r in range(WORLD)]
    d_row = _expand(sum(row_partial), b_row, ids, mapping)
    expected = {"column": [], "row": [], "replicated": []}
    collectives = {"column": [], "row": [], "replicated": []}
    for r in range(WORLD):
        ns, hs, rs = _share(r, inter), _share(r, hidden), _share(r, rank)
        expected["column"].append(base_col[r] + np.concatenate([d[:, :, ns] for d in d_col], -1))
        row = base_row[r].astype(np.float64).copy()
        row[:, :, hs] += d_row[:, :, hs]
        expected["row"].append(row)
        expected["replicated"].append(base_full + np.concatenate(d_col, -1))
        # What each rank hands to its one collective: its shrink result, all slices at once.
        mine_col = np.stack([s[:, :, rs] for s in full_col])
        collectives["column"].append([("all_gather", mine_col)])
        collectives["row"].append([("all_reduce", row_partial[r][None])])
        collectives["replicated"].append([])
    return got, expected, collectives, {"m": m, "top_k": top_k, "rank": rank, "slices": slices}


def _assert_outputs(name):
    got, expected, _, shape = _kernel_case()
    for r in range(WORLD):
        out = got[r][name]["output"]
        want = expected[name][r]
        assert isinstance(out, np.ndarray) and out.shape == want.shape, (
            f"{name} scenario ({shape}), rank {r}: output shape {getattr(out, 'shape', None)}, "
            f"expected {want.shape}")
        # Every product is exact; the float16 output rounds once when the delta is added.
        np.testing.assert_allclose(out, want, rtol=2e-3, atol=0.07,
                                   err_msg=f"{name} scenario ({shape}), rank {r}")


def test_column_sharded_gate_up():
    _assert_outputs("column")
    _assert_outputs("replicated")


def test_row_sharded_down_writes_only_its_columns():
    _assert_outputs("row")


def test_one_collective_per_sharded_call():
    got, _, collectives, shape = _kernel_case()
    for r in range(WORLD):
        for name, calls in collectives.items():
            seen = got[r][name]["collectives"]
            kinds = [(c["kind"], int(c["numel"])) for c in seen]
            want = [(kind, int(x.size)) for kind, x in calls[r]]
            assert kinds == want, (
                f"rank {r}, {name} scenario ({shape}): collectives on the tensor-parallel group "
                f"were {kinds} (kind, elements of the rank's input), expected {want}")
            for c, (kind, x) in zip(seen, calls[r]):
                values = c["values"]
                assert isinstance(values, np.ndarray) and values.size == x.size
                np.testing.assert_allclose(
                    values.astype(np.float64), np.sort(x.ravel()), rtol=0, atol=1e-3,
                    err_msg=f"rank {r}, {name} scenario: the {kind} was not given the rank's "
                            f"shrink result")


def test_layer_buffers_hold_rank_shards():
    rng = fresh()
    experts = int(rng.integers(2, 9))
    hidden = 128 * int(rng.integers(1, 4))
    inter = 64 * int(rng.integers(1, 3))
    rank = int(rng.choice([8, 16, 32]))
    max_loras = int(rng.integers(2, 5))
    slot = int(rng.integers(0, max_loras))
    order = [True, False] if rng.integers(2) else [False, True]
    lora_a = {"w1": _halves(rng, (experts, rank, hidden)), "w2": _halves(rng, (experts, rank, inter)),
              "w3": _halves(rng, (experts, rank, hidden))}
    lora_b = {"w1": _halves(rng, (experts, inter, rank)), "w2": _halves(rng, (experts, hidden, rank)),
              "w3": _halves(rng, (experts, inter, rank))}
    args = {"experts": experts, "hidden": hidden, "inter": inter, "rank": rank,
            "max_loras": max_loras, "slot": slot, "order": order,
            "lora_a": lora_a, "lora_b": lora_b}
    shape = {"experts": experts, "hidden": hidden, "inter": inter, "rank": rank,
             "max_loras": max_loras, "slot": slot}
    got = run(_LAYER, args, timeout=600, env=_ENV)["ranks"]
    assert isinstance(got, list) and len(got) == WORLD, "the driver must return one value per rank"
    for r in range(WORLD):
        i_s = _share(r, inter)  # plain TP shard of the intermediate
        r_s = _share(r, rank)
        h_s = _share(r, hidden)
        for mode in ("sharded", "replicated"):
            sharded = mode == "sharded"
            want = {
                "w1_lora_a_stacked": lora_a["w1"][:, r_s, :] if sharded else lora_a["w1"],
                "w3_lora_a_stacked": lora_a["w3"][:, r_s, :] if sharded else lora_a["w3"],
                "w1_lora_b_stacked": lora_b["w1"][:, i_s, :],
                "w3_lora_b_stacked": lora_b["w3"][:, i_s, :],
                "w2_lora_a_stacked": lora_a["w2"][:, :, i_s],
                "w2_lora_b_stacked": lora_b["w2"][:, h_s, :] if sharded else lora_b["w2"],
            }
            bufs = got[r][mode]["buffers"]
            total = 0
            for name, w in want.items():
                buf = bufs[name]
                full = (max_loras,) + w.shape
                assert isinstance(buf, np.ndarray) and buf.shape == full, (
                    f"rank {r}, {mode} ({shape}): {name} has shape {getattr(buf, 'shape', None)}, "
                    f"expected {full}")
                others = [i for i in range(max_loras) if i != slot]
                assert np.all(buf[others] == 0), (
                    f"rank {r}, {mode} ({shape}): {name} slots other than {slot} must stay zero")
                np.testing.assert_array_equal(buf[slot], w.astype(np.float32),
                                              err_msg=f"rank {r}, {mode} ({shape}): {name}[{slot}]")
                total += int(np.prod(full)) * 2
            # The six stacked buffers are all that create_lora_weights needs to allocate (the
            # enabled-adapter flags and allocator rounding fit in 16 KiB).
            grown = got[r][mode]["grown"]
            assert isinstance(grown, int) and grown <= total + (16 << 10), (
                f"rank {r}, {mode} ({shape}): create_lora_weights allocated {grown} bytes on the "
                f"GPU, more than the {total} bytes of its stacked buffers")
