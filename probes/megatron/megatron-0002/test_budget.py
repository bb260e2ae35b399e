"""Budget probe for megatron-0002: run alone, so the harness's cgroup figures are its own.

A large MoE-like model: about 30,000 parameters in a handful of repeated shapes, all drawn with
`fresh()` (the shapes, how they repeat, which are widened, the count, the data-parallel size)."""

from infradev_probe import fresh, run


def test_layer_wise_layout_of_many_parameters():
    rng = fresh()
    sizes = [int(x) for x in rng.integers(1, 65, size=10) * 64]
    n = int(rng.integers(27000, 33000))
    wide = int(rng.integers(5, 10))
    dp = int(rng.choice([4, 8]))
    out = run("""
        import torch
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

        sizes, wide = ARGS["sizes"], ARGS["wide"]
        params = [torch.nn.Parameter(torch.empty(sizes[i % len(sizes)] + 64 * (i % wide == 0),
                                                 dtype=torch.bfloat16)) for i in range(ARGS["n"])]
        cfg = DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True)
        full = LayerWiseDistributedOptimizer.compute_full_param_layout(params, 40_000_000, ARGS["dp"], cfg)
        (layout,) = full.layouts.values()
        index = {id(p): i for i, p in enumerate(params)}
        emit(placed=sorted(index.get(id(p), -1) for p in layout.param_index_map),
             spans=sum(e - s for s, e, _ in layout.param_index_map.values()),
             numel=layout.bucket_indices[-1][1])
    """, {"sizes": sizes, "n": n, "wide": wide, "dp": dp}, timeout=240)
    total = sum(sizes[i % len(sizes)] + 64 * (i % wide == 0) for i in range(n))
    assert out["placed"] == list(range(n)), f"{len(out['placed'])} parameters placed, want all {n}"
    assert out["spans"] == total, f"the layout spans {out['spans']} parameter elements, the parameters hold {total}"
    assert total <= out["numel"] < 2 * total, f"buffer of {out['numel']} elements for {total}"
