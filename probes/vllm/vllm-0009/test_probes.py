"""Hidden probes for vllm-0009 (fully sharded LoRA in the fused MoE LoRA path: S-LoRA style
sharding of the shrink and expand weights over tensor-parallel ranks).

The judge never imports vllm or torch. Each probe forks two ranks (one GPU each) that join vLLM's
tensor-parallel group (NCCL, custom all-reduce off) and send back plain data: kernel outputs, the
collectives each call issued on the tensor-parallel group (recorded by wrapping the group's
collective methods and its device communicator's), and the LoRA layer's stacked buffers. The
judge draws every input with numpy (LoRA weights, hidden states and base outputs are multiples of
0.5 small enough that float16 holds every partial and full product exactly), cuts each rank's
shards by the instruction's layout, and computes the expected outputs, collectives and buffer
contents itself. The kernel scenarios run once in one child and are shared by three probes."""

import functools

import numpy as np

from infradev_probe import RANKS_PRELUDE, run

_ENV = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}

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
                log.append({"kind": kind, "numel": int(given[pos].numel())})
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
    for sharded in (True, False):
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
        layer.set_lora(1, lora_a, lora_b, None)
        torch.cuda.synchronize()
        out["sharded" if sharded else "replicated"] = {
            "grown": int(grown),
            "buffers": {n: getattr(layer, n).float().cpu().numpy() for n in names},
        }
    return out


emit(ranks=spawn_ranks(2, layer_buffers, ARGS, 420))
'''

# ---- the judge's inputs and reference ----

M, TOP_K, EXPERTS, MAX_LORAS, RANK, BLOCK = 24, 2, 8, 2, 16, 16
HIDDEN, INTER = 128, 64  # the gate/up input and the down output; the down input is INTER


def _halves(rng, shape, span=1):
    return (rng.integers(-span, span + 1, size=shape) * 0.5).astype(np.float32)


def _routing(rng):
    ids = np.stack([rng.permutation(EXPERTS)[:TOP_K] for _ in range(M)]).astype(np.int32)
    weights = np.full((M, TOP_K), 0.5, dtype=np.float32)
    mapping = rng.integers(0, MAX_LORAS, size=M).astype(np.int32)
    return ids, weights, mapping


def _delta(hidden, a, b, ids, mapping):
    """The LoRA delta per token and expert slot: (hidden @ A[l, e].T) @ B[l, e].T."""
    out = np.zeros((M, TOP_K, b.shape[2]), dtype=np.float64)
    for t in range(M):
        for k in range(TOP_K):
            l, e = mapping[t], ids[t, k]
            out[t, k] = (hidden[t].astype(np.float64) @ a[l, e].T.astype(np.float64)) @ b[l, e].T
    return out


@functools.lru_cache(maxsize=None)
def _kernel_case():
    rng = np.random.default_rng(9)
    ids, weights, mapping = _routing(rng)
    half_r, half_n = RANK // 2, INTER // 2
    # gate_up (column parallel): two slices, input HIDDEN, output INTER each.
    h_col = _halves(rng, (M, HIDDEN))
    a_col = [_halves(rng, (MAX_LORAS, EXPERTS, RANK, HIDDEN)) for _ in range(2)]
    b_col = [_halves(rng, (MAX_LORAS, EXPERTS, INTER, RANK)) for _ in range(2)]
    base_col = [_halves(rng, (M, TOP_K, 2 * half_n), 2) for _ in range(2)]
    # down (row parallel): one slice, input INTER, output HIDDEN.
    h_row = _halves(rng, (M, INTER))
    a_row = _halves(rng, (MAX_LORAS, EXPERTS, RANK, INTER))
    b_row = _halves(rng, (MAX_LORAS, EXPERTS, HIDDEN, RANK))
    base_row = [_halves(rng, (M, TOP_K, HIDDEN), 2) for _ in range(2)]
    base_full = _halves(rng, (M, TOP_K, 2 * INTER), 2)

    col_ranks, row_ranks = [], []
    for r in range(2):
        rs, ns = slice(r * half_r, (r + 1) * half_r), slice(r * half_n, (r + 1) * half_n)
        col_ranks.append({"hidden": h_col, "a": [a[:, :, rs, :] for a in a_col],
                          "b": [b[:, :, ns, :] for b in b_col], "base": base_col[r],
                          "rank_arg": half_r, "offset": 0})
        ks, hs = slice(r * half_n, (r + 1) * half_n), slice(r * HIDDEN // 2, (r + 1) * HIDDEN // 2)
        row_ranks.append({"hidden": h_row[:, ks], "a": [a_row[:, :, :, ks]],
                          "b": [b_row[:, :, hs, :]], "base": base_row[r],
                          "rank_arg": RANK, "offset": r * HIDDEN // 2})
    full = {"hidden": h_col, "a": a_col, "b": b_col, "base": base_full, "rank_arg": RANK,
            "offset": 0}
    args = {
        "max_loras": MAX_LORAS, "experts": EXPERTS, "block": BLOCK,
        "topk_ids": ids, "topk_weights": weights, "mapping": mapping,
        "scenarios": [
            {"name": "column", "sharded": True, "ranks": col_ranks},
            {"name": "row", "sharded": True, "ranks": row_ranks},
            {"name": "replicated", "sharded": False, "ranks": [full, full]},
        ],
    }
    got = run(_KERNEL, args, timeout=600, env=_ENV)["ranks"]
    assert len(got) == 2
    expected = {"column": [], "row": [], "replicated": []}
    d_col = [_delta(h_col, a_col[i], b_col[i], ids, mapping) for i in range(2)]
    d_row = _delta(h_row, a_row, b_row, ids, mapping)
    for r in range(2):
        ns = slice(r * half_n, (r + 1) * half_n)
        expected["column"].append(base_col[r] + np.concatenate([d[:, :, ns] for d in d_col], -1))
        hs = slice(r * HIDDEN // 2, (r + 1) * HIDDEN // 2)
        row = base_row[r].astype(np.float64).copy()
        row[:, :, hs] += d_row[:, :, hs]
        expected["row"].append(row)
        expected["replicated"].append(base_full + np.concatenate(d_col, -1))
    return got, expected


def _assert_outputs(name):
    got, expected = _kernel_case()
    for r in range(2):
        out = got[r][name]["output"]
        assert out.shape == expected[name][r].shape, f"{name}, rank {r}: output shape {out.shape}"
        np.testing.assert_allclose(out, expected[name][r], rtol=0, atol=0.13,
                                   err_msg=f"{name} scenario, rank {r}")


def test_column_sharded_gate_up():
    _assert_outputs("column")
    _assert_outputs("replicated")


def test_row_sharded_down_writes_only_its_columns():
    _assert_outputs("row")


def test_one_collective_per_sharded_call():
    got, _ = _kernel_case()
    want = {
        "column": [{"kind": "all_gather", "numel": 2 * M * TOP_K * (RANK // 2)}],
        "row": [{"kind": "all_reduce", "numel": M * TOP_K * RANK}],
        "replicated": [],
    }
    for r in range(2):
        for name, calls in want.items():
            seen = [{"kind": c["kind"], "numel": int(c["numel"])}
                    for c in got[r][name]["collectives"]]
            assert seen == calls, (
                f"rank {r}, {name} scenario: collectives on the tensor-parallel group were "
                f"{seen}, expected {calls}")


def test_layer_buffers_hold_rank_shards():
    rng = np.random.default_rng(19)
    lora_a = {"w1": _halves(rng, (EXPERTS, RANK, HIDDEN)), "w2": _halves(rng, (EXPERTS, RANK, INTER)),
              "w3": _halves(rng, (EXPERTS, RANK, HIDDEN))}
    lora_b = {"w1": _halves(rng, (EXPERTS, INTER, RANK)), "w2": _halves(rng, (EXPERTS, HIDDEN, RANK)),
              "w3": _halves(rng, (EXPERTS, INTER, RANK))}
    args = {"experts": EXPERTS, "hidden": HIDDEN, "inter": INTER, "rank": RANK,
            "max_loras": MAX_LORAS, "lora_a": lora_a, "lora_b": lora_b}
    got = run(_LAYER, args, timeout=600, env=_ENV)["ranks"]
    assert len(got) == 2
    for r in range(2):
        i_s = slice(r * INTER // 2, (r + 1) * INTER // 2)  # plain TP shard of the intermediate
        r_s = slice(r * RANK // 2, (r + 1) * RANK // 2)
        h_s = slice(r * HIDDEN // 2, (r + 1) * HIDDEN // 2)
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
                shape = (MAX_LORAS,) + w.shape
                assert buf.shape == shape, f"rank {r}, {mode}: {name} has shape {buf.shape}, expected {shape}"
                assert np.all(buf[0] == 0), f"rank {r}, {mode}: {name}[0] must stay zero"
                np.testing.assert_array_equal(buf[1], w, err_msg=f"rank {r}, {mode}: {name}[1]")
                total += int(np.prod(shape)) * 2
            # The six stacked buffers are all that create_lora_weights needs to allocate (the
            # enabled-adapter flags and allocator rounding fit in 16 KiB; one unsharded buffer
            # would be 32 KiB more).
            grown = got[r][mode]["grown"]
            assert grown <= total + (16 << 10), (
                f"rank {r}, {mode}: create_lora_weights allocated {grown} bytes on the GPU, more "
                f"than the {total} bytes of its stacked buffers")
