"""Budget probe for megatron-0002: run alone, so the harness's cgroup figures are its own."""

from infradev_probe import run

# A large MoE-like model: 30,000 parameters in a handful of repeated shapes.
SIZES = [4096, 64, 64, 1024, 2048, 64, 192, 4096, 64, 1024]


def test_layer_wise_layout_of_many_parameters():
    out = run("""
        import torch
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

        sizes = ARGS["sizes"]
        params = [torch.nn.Parameter(torch.empty(sizes[i % len(sizes)] + 64 * (i % 7 == 0),
                                                 dtype=torch.bfloat16)) for i in range(ARGS["n"])]
        cfg = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
        full = LayerWiseDistributedOptimizer.compute_full_param_layout(params, 40_000_000, 8, cfg)
        (layout,) = full.layouts.values()
        emit(placed=len(layout.param_index_map), buckets=len(layout.bucket_indices),
             numel=layout.bucket_indices[-1][1])
    """, {"sizes": SIZES, "n": 30000}, timeout=240)
    total = sum(SIZES[i % len(SIZES)] + 64 * (i % 7 == 0) for i in range(30000))
    assert out["placed"] == 30000
    assert total <= out["numel"] < 2 * total, f"buffer of {out['numel']} elements for {total}"
