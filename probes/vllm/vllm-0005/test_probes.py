"""Hidden probes for vllm-0005 (asynchronous, layer-by-layer EPLB expert rearrangement).

The judge never imports vllm or torch. Each probe runs one driver in a child process; for the
GPU probes the driver forks one process per GPU (rank), each rank joins a NCCL process group
and rearranges expert weights with transfer_layer and move_from_buffer, and the driver sends
back what the ranks' weights hold afterwards (plus memory and stream figures). Every expert's
weights follow a formula of (layer, logical expert, weight, column) that the judge evaluates
itself, and the judge makes the placements, so every expected value below is the judge's own.
Every probe runs in a child of its own: a scenario that hangs or crashes fails its probe only."""

import functools
import random

import numpy as np

from infradev_probe import RANKS_PRELUDE, run

_DRIVER = r'''
import asyncio
import datetime
import os
import time

import torch


def init(rank, world):
    import torch.distributed as dist
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=world,
                            device_id=dev, timeout=datetime.timedelta(seconds=180))
    cpu = dist.new_group(backend="gloo")
    x = torch.ones(1, device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    return dev, cpu


def expert_row(layer, logical, k, cols):
    return (torch.arange(cols, dtype=torch.int64) % 97
            + logical * 1000 + k * 100 + layer * 100000).to(torch.float32)


def make_weights(old, group_rank, local, hidden, dev):
    weights = []
    for layer, row in enumerate(old):
        ws = []
        for k, h in enumerate(hidden):
            slots = [expert_row(layer, row[group_rank * local + i], k, h) for i in range(local)]
            ws.append(torch.stack(slots).to(dev))
        weights.append(ws)
    return weights


def transfer(old, new, weights, buf, ep, layer, stream):
    from vllm.distributed.eplb.rebalance_execute import transfer_layer
    return asyncio.run(transfer_layer(
        old_global_expert_indices=old, new_global_expert_indices=new,
        expert_weights=weights, expert_weights_buffer=buf, ep_group=ep,
        layer=layer, cuda_stream=stream))


def apply(plan, new, weights, buf, ep, layer):
    from vllm.distributed.eplb.rebalance_execute import move_from_buffer
    is_unchanged, is_received_locally, experts_recv_loc = plan
    move_from_buffer(
        expert_weights=weights[layer], expert_weights_buffer=buf,
        is_unchanged=is_unchanged, is_received_locally=is_received_locally,
        experts_recv_loc=experts_recv_loc, new_indices=new[layer].tolist(), ep_group=ep)


# ---- scenarios ----

def placements(rank, world, port, args):
    import torch.distributed as dist
    dev, cpu = init(rank, world)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])] if world == 4 else None
    out = []
    for case in args["cases"]:
        if case["group"] == "world":
            ep, maps = dist.group.WORLD, case["maps"][0]
        else:
            ep, maps = pairs[rank // 2], case["maps"][rank // 2]
        gr = ep.rank()
        old = torch.tensor(maps["old"], dtype=torch.long)
        new = torch.tensor(maps["new"], dtype=torch.long)
        weights = make_weights(maps["old"], gr, case["local"], case["hidden"], dev)
        buf = [torch.empty_like(w) for w in weights[0]]
        side = torch.cuda.Stream(device=dev)
        for layer, use_side in zip(case["order"], case["side"]):
            stream = side if use_side else None
            plan = transfer(old, new, weights, buf, ep, layer, stream)
            if stream is not None:
                stream.synchronize()
            apply(plan, new, weights, buf, ep, layer)
            # The buffer is reused by the next layer only once this layer has been applied.
            torch.cuda.synchronize()
        out.append({"group_rank": gr,
                    "layers": [[w.cpu().numpy() for w in ws] for ws in weights]})
        dist.barrier(group=cpu)
    return out


def on_stream(rank, world, port, args):
    import torch.distributed as dist
    dev, cpu = init(rank, world)
    ep = dist.group.WORLD
    local, hidden = args["local"], args["hidden"]
    side = torch.cuda.Stream(device=dev)

    def prepare(maps):
        old = torch.tensor(maps["old"], dtype=torch.long)
        new = torch.tensor(maps["new"], dtype=torch.long)
        weights = make_weights(maps["old"], rank, local, hidden, dev)
        buf = [torch.full_like(w, -7.0) for w in weights[0]]
        host = [torch.full(w.shape, -9.0, dtype=w.dtype).pin_memory() for w in weights[0]]
        torch.cuda.synchronize()
        return old, new, weights, buf, host

    def go(old, new, weights, buf, host):
        plan = transfer(old, new, weights, buf, ep, 0, side)
        side.synchronize()
        with torch.cuda.stream(side):
            apply(plan, new, weights, buf, ep, 0)
            for h, w in zip(host, weights[0]):
                h.copy_(w, non_blocking=True)
        side.synchronize()

    # Warm up every kernel, copy and transfer used below (first launches may load modules).
    go(*prepare(args["warmup"]))
    torch.cuda.synchronize()
    # Calibrate the GPU's sleep so that the current stream stays busy for several seconds.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    cycles = int(20_000_000 / max(start.elapsed_time(end), 1e-3) * args["busy_ms"])

    timed = prepare(args["timed"])
    dist.barrier(group=cpu)
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    go(*timed)
    waited = time.perf_counter() - t0
    busy_after = not torch.cuda.current_stream(dev).query()
    torch.cuda.synchronize()
    return {"weights": [h.numpy().copy() for h in timed[4]], "busy_after": busy_after,
            "waited": waited}


def memory(rank, world, port, args):
    import torch.distributed as dist
    dev, cpu = init(rank, world)
    ep = dist.group.WORLD
    local, hidden, maps = args["local"], args["hidden"], args["maps"]
    old = torch.tensor(maps["old"], dtype=torch.long)
    new = torch.tensor(maps["new"], dtype=torch.long)
    weights = make_weights(maps["old"], rank, local, hidden, dev)
    buf = [torch.empty_like(w) for w in weights[0]]
    side = torch.cuda.Stream(device=dev)
    extra, kept = [], []
    for layer in range(len(maps["old"])):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        plan = transfer(old, new, weights, buf, ep, layer, side)
        side.synchronize()
        apply(plan, new, weights, buf, ep, layer)
        torch.cuda.synchronize()
        extra.append(int(torch.cuda.max_memory_allocated(dev) - base))
        kept.append(int(torch.cuda.memory_allocated(dev) - base))
    stride = args["stride"]
    sums = [[w.double().sum(dim=1).cpu().numpy() for w in ws] for ws in weights]
    picks = [[w[:, ::stride].cpu().numpy() for w in ws] for ws in weights]
    return {"extra": extra, "kept": kept, "sums": sums, "picks": picks}


def config(args):
    import pydantic
    from vllm.config.parallel import EPLBConfig
    plain = EPLBConfig()
    keyword = EPLBConfig(use_async=True)
    parsed = pydantic.TypeAdapter(EPLBConfig).validate_json('{"use_async": true}')
    return {"plain": plain.use_async, "keyword": keyword.use_async, "parsed": parsed.use_async}


SCENARIOS = {"placements": placements, "on_stream": on_stream, "memory": memory}

if ARGS["scenario"] == "config":
    emit(config=config(ARGS))
else:
    emit(ranks=spawn_ranks(ARGS["world"], SCENARIOS[ARGS["scenario"]], ARGS, ARGS["timeout"]))
'''


def _drive(scenario, world, timeout=240, **args):
    args.update(scenario=scenario, world=world, timeout=timeout)
    return run(RANKS_PRELUDE + _DRIVER, args, timeout=timeout + 60)


# ---- the judge's own placements and references ----

def _placement(seed, layers, size, local, logical):
    rng = random.Random(seed)
    rows = []
    for _ in range(layers):
        row = list(range(logical)) + [rng.randrange(logical) for _ in range(size * local - logical)]
        rng.shuffle(row)
        rows.append(row)
    return rows


def _cases():
    world_old = _placement(11, 3, 4, 3, 7)
    world_new = _placement(12, 3, 4, 3, 7)
    world_new[1] = list(world_old[1])  # one layer keeps its placement
    pair_maps = [{"old": _placement(21 + p, 3, 2, 2, 3), "new": _placement(31 + p, 3, 2, 2, 3)}
                 for p in range(2)]
    return [
        {"group": "world", "local": 3, "hidden": [24, 40], "order": [2, 0, 1],
         "side": [True, False, True], "maps": [{"old": world_old, "new": world_new}]},
        {"group": "pairs", "local": 2, "hidden": [16, 8], "order": [0, 1, 2],
         "side": [True, True, False], "maps": pair_maps},
        {"group": "world", "local": 8, "hidden": [32], "order": [1, 0], "side": [False, True],
         "maps": [{"old": _placement(41, 2, 4, 8, 16), "new": _placement(42, 2, 4, 8, 16)}]},
    ]


_CASES = _cases()

# Two ranks, four slots each, five logical experts. Both placements make every rank move an
# expert between its own slots, receive one from the other rank, and keep one in place.
_OLD = [0, 1, 2, 3, 4, 0, 1, 2]
_WARMUP = {"old": [_OLD], "new": [[4, 1, 0, 3, 3, 2, 1, 0]]}
_TIMED = {"old": [_OLD], "new": [[1, 0, 4, 3, 2, 3, 4, 0]]}
_MEMORY = {"old": [_OLD] * 3,
           "new": [[1, 0, 4, 3, 2, 3, 4, 0], [4, 1, 0, 3, 3, 2, 1, 0], [2, 3, 4, 0, 1, 4, 0, 3]]}
_BIG = 1 << 20
_STRIDE = 65537


def _expert_row(layer, logical, k, cols):
    return (np.arange(cols, dtype=np.int64) % 97 + logical * 1000 + k * 100 + layer * 100000).astype(np.float64)


def _expected(new_row, group_rank, local, layer, k, cols):
    return np.stack([_expert_row(layer, new_row[group_rank * local + i], k, cols) for i in range(local)])


def _same(got, want, what):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    bad = np.argwhere(got != want)
    if bad.size:
        at = tuple(int(i) for i in bad[0])
        slot = at[0]
        raise AssertionError(
            f"{what}: {len(bad)} wrong values; slot {slot} holds {got[slot][:4].tolist()}..., "
            f"want {want[slot][:4].tolist()}...")


@functools.lru_cache(maxsize=None)
def _scenario(name):
    if name == "placements":
        return _drive("placements", 4, cases=_CASES)["ranks"]
    if name == "on_stream":
        return _drive("on_stream", 2, local=4, hidden=[64, 128], warmup=_WARMUP, timed=_TIMED,
                      busy_ms=4000)["ranks"]
    if name == "memory":
        return _drive("memory", 2, local=4, hidden=[_BIG, _BIG], maps=_MEMORY, stride=_STRIDE)["ranks"]
    return _drive("config", 1, timeout=120)["config"]


def test_layerwise_transfer_places_every_expert():
    # World and per-pair EP groups, redundant experts, layers in any order, the buffer reused
    # across layers, with and without a side stream: after transfer_layer + move_from_buffer,
    # every slot of every rank holds the weights of the expert the new placement puts there.
    for rank, got in enumerate(_scenario("placements")):
        for n, (case, r) in enumerate(zip(_CASES, got)):
            group_rank = rank if case["group"] == "world" else rank % 2
            maps = case["maps"][0] if case["group"] == "world" else case["maps"][rank // 2]
            assert r["group_rank"] == group_rank, f"case {n}: rank {rank} reports group rank {r['group_rank']}"
            for layer, ws in enumerate(r["layers"]):
                for k, w in enumerate(ws):
                    want = _expected(maps["new"][layer], group_rank, case["local"], layer, k, case["hidden"][k])
                    _same(w, want, f"case {n} ({case['group']} group): rank {rank}, layer {layer}, weight {k}")


def test_transfer_runs_on_the_given_stream():
    # With the current stream held busy by a long GPU sleep, transfer_layer(cuda_stream=side)
    # followed by move_from_buffer on that side stream rearranges the layer without waiting:
    # read back on the side stream, the weights are right while the current stream is busy.
    for rank, r in enumerate(_scenario("on_stream")):
        for k, (w, cols) in enumerate(zip(r["weights"], [64, 128])):
            _same(w, _expected(_TIMED["new"][0], rank, 4, 0, k, cols),
                  f"rank {rank}, weight {k}, rearranged on a side stream")
        assert r["busy_after"], (
            f"rank {rank}: the side stream's transfer finished only after the busy current stream "
            f"did ({r['waited']:.2f}s): it waited for work queued on another stream")


def test_transfer_needs_no_layer_sized_memory():
    # Each layer of 4 slots x 2 weights x 2^20 float32 (32 MiB): besides the caller's buffer,
    # a transfer allocates less than a quarter of a layer at its peak and keeps nothing.
    layer_bytes = 4 * 2 * _BIG * 4
    cols = np.arange(0, _BIG, _STRIDE)
    base_sum = float((np.arange(_BIG, dtype=np.int64) % 97).sum())
    for rank, r in enumerate(_scenario("memory")):
        for layer, (extra, kept) in enumerate(zip(r["extra"], r["kept"])):
            assert extra < layer_bytes // 4, (
                f"rank {rank}, layer {layer}: transfer_layer + move_from_buffer allocated "
                f"{extra / 2**20:.1f} MiB at their peak, a layer is {layer_bytes / 2**20:.0f} MiB")
            assert kept <= 1 << 20, (
                f"rank {rank}, layer {layer}: {kept / 2**20:.1f} MiB stayed allocated after the transfer")
        for layer, row in enumerate(_MEMORY["new"]):
            for k in range(2):
                logical = [row[rank * 4 + i] for i in range(4)]
                want_sums = np.array([base_sum + _BIG * (e * 1000 + k * 100 + layer * 100000) for e in logical])
                _same(np.asarray(r["sums"][layer][k])[:, None], want_sums[:, None],
                      f"rank {rank}, layer {layer}, weight {k} (row sums)")
                want_picks = np.stack([_expert_row(layer, e, k, _BIG)[cols] for e in logical])
                _same(r["picks"][layer][k], want_picks, f"rank {rank}, layer {layer}, weight {k} (sampled columns)")


def test_eplb_config_has_async_switch():
    # EPLBConfig.use_async defaults to False and is set by keyword and by JSON (as --eplb-config).
    c = _scenario("config")
    assert c["plain"] is False, f"EPLBConfig().use_async is {c['plain']!r}, want False"
    assert c["keyword"] is True, f"EPLBConfig(use_async=True).use_async is {c['keyword']!r}, want True"
    assert c["parsed"] is True, f"EPLBConfig from JSON {{\"use_async\": true}} has use_async {c['parsed']!r}"
