"""Hidden probes for vllm-0005 (asynchronous, layer-by-layer EPLB expert rearrangement).

The judge never imports vllm or torch. Each probe runs one driver in a child process; for the
GPU probes the driver forks one process per GPU (rank), each rank joins a NCCL process group
and rearranges expert weights with transfer_layer and move_from_buffer, and the driver sends
back what the ranks' weights hold afterwards. Everything a probe decides from is drawn fresh
for each attempt: the placements (how many layers, slots per rank, logical experts and
replicas, which layer stays unchanged, the order the layers go in, which transfers use a side
stream, how the four ranks split into two EP groups), the weights' sizes, and the weights
themselves: weight k of logical expert e in layer l holds (column * mult + base[l][e][k]) mod
2**24 - 3, with mult and the base table drawn by the judge, which evaluates the same formula
itself, so every expected value below is the judge's own. The memory probe compares the GPU
memory the judge sees (NVML, sampled from outside the child) with what it sees gold use on the
same inputs. Every probe runs in a child of its own: a scenario that hangs or crashes fails its
probe only."""

import numpy as np

from infradev_probe import RANKS_PRELUDE, fresh, measure, run

_MOD = (1 << 24) - 3  # every value stays an integer that float32 holds exactly

_DRIVER = r'''
import asyncio
import datetime
import os

os.environ.setdefault("USER", "infradev-probe")  # torch's caches name a user; the probe's has none

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


def expert_row(args, layer, logical, k, cols):
    v = (torch.arange(cols, dtype=torch.int64) * args["mult"] + args["base"][layer][logical][k]) % args["mod"]
    return v.to(torch.float32)


def make_weights(args, old, group_rank, local, hidden, dev):
    weights = []
    for layer, row in enumerate(old):
        ws = []
        for k, h in enumerate(hidden):
            slots = [expert_row(args, layer, row[group_rank * local + i], k, h) for i in range(local)]
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
    pairs = [dist.new_group(p) for p in args["pairs"]]
    mine = [i for i, p in enumerate(args["pairs"]) if rank in p][0]
    x = torch.ones(1, device=dev)
    dist.all_reduce(x, group=pairs[mine])  # the subgroup's communicator is up before any P2P
    torch.cuda.synchronize()
    out = []
    for case in args["cases"]:
        if case["group"] == "world":
            ep, maps = dist.group.WORLD, case["maps"][0]
        else:
            ep, maps = pairs[mine], case["maps"][mine]
        gr = ep.rank()
        old = torch.tensor(maps["old"], dtype=torch.long)
        new = torch.tensor(maps["new"], dtype=torch.long)
        weights = make_weights(args, maps["old"], gr, case["local"], case["hidden"], dev)
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
        weights = make_weights(args, maps["old"], rank, local, hidden, dev)
        buf = [torch.full_like(w, args["fill"]) for w in weights[0]]
        host = [torch.full(w.shape, args["fill"], dtype=w.dtype).pin_memory() for w in weights[0]]
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
    # The current stream (the forward pass's) sleeps, then overwrites the layer's weights and
    # the buffer with poison: a transfer that waits for that stream sees the poison.
    torch.cuda._sleep(cycles)
    for w in timed[2][0]:
        w.fill_(args["poison"])
    for b in timed[3]:
        b.fill_(args["poison"])
    go(*timed)
    torch.cuda.synchronize()
    return {"weights": [h.numpy().copy() for h in timed[4]]}


def memory(rank, world, port, args):
    import torch.distributed as dist
    dev, cpu = init(rank, world)
    ep = dist.group.WORLD
    local, hidden, maps = args["local"], args["hidden"], args["maps"]
    old = torch.tensor(maps["old"], dtype=torch.long)
    new = torch.tensor(maps["new"], dtype=torch.long)
    weights = make_weights(args, maps["old"], rank, local, hidden, dev)
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
    # Read back on the host: nothing here allocates GPU memory after the transfers.
    host = [[w.cpu() for w in ws] for ws in weights]
    off, stride = args["offset"], args["stride"]
    sums = [[w.double().sum(dim=1).numpy() for w in ws] for ws in host]
    picks = [[w[:, off::stride].numpy().copy() for w in ws] for ws in host]
    return {"extra": extra, "kept": kept, "sums": sums, "picks": picks}


def config(args):
    import pydantic
    from vllm.config.parallel import EPLBConfig
    fields = ("window_size", "step_interval", "num_redundant_experts", "log_balancedness", "use_async")
    adapter = pydantic.TypeAdapter(EPLBConfig)
    out = []
    for c in args["configs"]:
        if c["how"] == "keyword":
            cfg = EPLBConfig(**c["given"])
        else:
            cfg = adapter.validate_json(c["json"])
        out.append([getattr(cfg, f) for f in fields])
    return out


SCENARIOS = {"placements": placements, "on_stream": on_stream, "memory": memory}

if ARGS["scenario"] == "config":
    emit(config=config(ARGS))
else:
    emit(ranks=spawn_ranks(ARGS["world"], SCENARIOS[ARGS["scenario"]], ARGS, ARGS["timeout"]))
'''


def _args(scenario, world, rng, timeout=240, **args):
    """Driver arguments, with the weights' formula drawn fresh: mult and a base for every
    (layer, logical expert, weight) the scenario can use."""
    layers, logical, weights = args.pop("table")
    args.update(scenario=scenario, world=world, timeout=timeout, mod=_MOD,
                mult=int(rng.integers(1, _MOD)),
                base=rng.integers(0, _MOD, (layers, logical, weights)).tolist())
    return args


def _drive(args):
    return run(RANKS_PRELUDE + _DRIVER, args, timeout=args["timeout"] + 60)


# ---- the judge's own placements and references ----

def _row(rng, size, logical):
    """A placement of one layer: every logical expert at least once, the other slots replicas
    of random experts, in a random order."""
    row = list(range(logical)) + [int(v) for v in rng.integers(0, logical, size - logical)]
    return [int(v) for v in rng.permutation(row)]


def _maps(rng, layers, size, logical, unchanged=None):
    old = [_row(rng, size, logical) for _ in range(layers)]
    new = [_row(rng, size, logical) for _ in range(layers)]
    if unchanged is not None:
        new[unchanged] = list(old[unchanged])
    return {"old": old, "new": new}


def _expert_row(args, layer, logical, k, cols):
    v = (np.arange(cols, dtype=np.int64) * args["mult"] + args["base"][layer][logical][k]) % args["mod"]
    return v.astype(np.float64)


def _expected(args, new_row, group_rank, local, layer, k, cols):
    return np.stack([_expert_row(args, layer, new_row[group_rank * local + i], k, cols)
                     for i in range(local)])


def _same(got, want, what):
    assert isinstance(got, np.ndarray), f"{what}: got {type(got).__name__}, want an array"
    got = got.astype(np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    bad = np.argwhere(got != want)
    if bad.size:
        slot = int(bad[0][0])
        raise AssertionError(
            f"{what}: {len(bad)} wrong values; slot {slot} holds {got[slot][:4].tolist()}..., "
            f"want {want[slot][:4].tolist()}...")


def _placement_cases(rng):
    cases = []
    # The whole world as ep_group: redundant experts, one layer unchanged, layers in a random
    # order, a side stream for some of them.
    layers, local = int(rng.integers(2, 5)), int(rng.integers(2, 5))
    logical = int(rng.integers(max(2, 2 * local), 4 * local))
    cases.append({"group": "world", "local": local, "layers": layers, "logical": logical,
                  "maps": [_maps(rng, layers, 4 * local, logical, int(rng.integers(layers)))]})
    # Two 2-rank EP groups, each with placements of its own.
    layers, local = int(rng.integers(2, 5)), int(rng.integers(2, 4))
    logical = int(rng.integers(local + 1, 2 * local + 1))
    cases.append({"group": "pairs", "local": local, "layers": layers, "logical": logical,
                  "maps": [_maps(rng, layers, 2 * local, logical) for _ in range(2)]})
    # Many slots per rank over the whole world.
    layers, local = int(rng.integers(2, 4)), int(rng.integers(6, 10))
    logical = int(rng.integers(2 * local, 4 * local))
    cases.append({"group": "world", "local": local, "layers": layers, "logical": logical,
                  "maps": [_maps(rng, layers, 4 * local, logical)]})
    for c in cases:
        c["hidden"] = [int(v) for v in rng.integers(8, 65, int(rng.integers(1, 4)))]
        c["order"] = [int(v) for v in rng.permutation(c["layers"])]
        c["side"] = [bool(v) for v in rng.integers(0, 2, c["layers"])]
        c["side"][int(rng.integers(c["layers"]))] = True
    return cases


def test_layerwise_transfer_places_every_expert():
    # World and per-pair EP groups (a random split of the four ranks), redundant experts,
    # layers in any order, the buffer reused across layers, with and without a side stream:
    # after transfer_layer + move_from_buffer, every slot of every rank holds the weights of
    # the expert the new placement puts there.
    rng = fresh()
    cases = _placement_cases(rng)
    split = [int(v) for v in rng.permutation(4)]
    pairs = [sorted(split[:2]), sorted(split[2:])]
    table = (max(c["layers"] for c in cases), max(c["logical"] for c in cases), 3)
    args = _args("placements", 4, rng, cases=cases, pairs=pairs, table=table)
    got = _drive(args)["ranks"]
    assert isinstance(got, list) and len(got) == 4, "the driver sent no result for every rank"
    for rank, results in enumerate(got):
        assert isinstance(results, list) and len(results) == len(cases), f"rank {rank}: a result per case expected"
        mine = 0 if rank in pairs[0] else 1
        for n, (case, r) in enumerate(zip(cases, results)):
            world = case["group"] == "world"
            group_rank = rank if world else pairs[mine].index(rank)
            maps = case["maps"][0] if world else case["maps"][mine]
            assert r["group_rank"] == group_rank, f"case {n}: rank {rank} is group rank {r['group_rank']}"
            assert isinstance(r["layers"], list) and len(r["layers"]) == case["layers"]
            for layer, ws in enumerate(r["layers"]):
                assert isinstance(ws, list) and len(ws) == len(case["hidden"])
                for k, w in enumerate(ws):
                    want = _expected(args, maps["new"][layer], group_rank, case["local"], layer, k,
                                     case["hidden"][k])
                    _same(w, want, f"case {n} ({case['group']} group {pairs if not world else ''}): "
                                   f"rank {rank}, layer {layer}, weight {k}")


def _stream_maps(rng, local, logical):
    """A one-layer placement over two ranks in which every rank keeps one slot, moves an
    expert between two of its own slots and receives one from the other rank."""
    while True:
        m = _maps(rng, 1, 2 * local, logical)
        old, new = m["old"][0], m["new"][0]
        ok = True
        for r in range(2):
            mine = range(r * local, (r + 1) * local)
            held = {old[p] for p in mine}
            kept = any(old[p] == new[p] for p in mine)
            moved = any(old[p] != new[p] and new[p] in held for p in mine)
            received = any(new[p] not in held for p in mine)
            ok = ok and kept and moved and received
        if ok:
            return m


def test_transfer_runs_on_the_given_stream():
    # The current stream is held busy by a long GPU sleep, after which it overwrites the
    # layer's weights and the buffer with poison. transfer_layer(cuda_stream=side) followed by
    # move_from_buffer on that side stream, read back on the side stream, must give the new
    # placement's weights: a transfer that waits for the current stream (or puts any of its
    # copies there) reads or leaves poison or the buffer's fill.
    rng = fresh()
    local = int(rng.integers(3, 6))
    logical = int(rng.integers(local + 1, 2 * local))
    hidden = [int(v) for v in rng.integers(32, 257, 2)]
    warmup, timed = _stream_maps(rng, local, logical), _stream_maps(rng, local, logical)
    args = _args("on_stream", 2, rng, local=local, hidden=hidden, warmup=warmup, timed=timed,
                 busy_ms=int(rng.integers(3000, 5001)), fill=-float(rng.integers(1, 1000)),
                 poison=-float(rng.integers(1000, 100000)), table=(1, logical, 2))
    got = _drive(args)["ranks"]
    assert isinstance(got, list) and len(got) == 2, "the driver sent no result for every rank"
    for rank, r in enumerate(got):
        assert isinstance(r["weights"], list) and len(r["weights"]) == 2
        for k, (w, cols) in enumerate(zip(r["weights"], hidden)):
            _same(w, _expected(args, timed["new"][0], rank, local, 0, k, cols),
                  f"rank {rank}, weight {k}, rearranged on a side stream while the current stream "
                  f"was busy (poison {args['poison']:.0f}, buffer fill {args['fill']:.0f})")


def test_transfer_needs_no_layer_sized_memory():
    # Layers of tens of MiB per rank: the GPU memory NVML shows the child using stays within a
    # quarter of a layer per rank of what it shows gold using on the same inputs (a staging
    # copy of the layer, or memory kept from call to call, shows up as at least that), the
    # child's allocator agrees, and the rearranged weights are right (row sums and sampled
    # columns against the judge's formula).
    rng = fresh()
    local, layers = 4, int(rng.integers(3, 5))
    logical = int(rng.integers(5, 8))
    hidden = [int(v) for v in rng.integers(3 << 19, 5 << 19, 2)]  # 1.5 to 2.5 Mi columns
    maps = _maps(rng, layers, 2 * local, logical)
    stride = int(rng.integers(40000, 90000))
    args = _args("memory", 2, rng, local=local, hidden=hidden, maps=maps, stride=stride,
                 offset=int(rng.integers(0, stride)), table=(layers, logical, 2))
    want, gold = measure(RANKS_PRELUDE + _DRIVER, args, timeout=args["timeout"] + 60, gpu=True,
                         repository="reference")
    got, mine = measure(RANKS_PRELUDE + _DRIVER, args, timeout=args["timeout"] + 60, gpu=True)
    layer_bytes = local * sum(hidden) * 4  # one layer's expert weights on one rank
    assert gold.gpu_peak_bytes is not None and mine.gpu_peak_bytes is not None, \
        "probe setup: NVML gave no GPU memory figures"
    assert mine.gpu_peak_bytes < gold.gpu_peak_bytes + 2 * layer_bytes // 4, (
        f"NVML shows the child using {mine.gpu_peak_bytes / 2**20:.1f} MiB of GPU memory at its "
        f"peak, {(mine.gpu_peak_bytes - gold.gpu_peak_bytes) / 2**20:.1f} MiB more than gold on the "
        f"same two ranks; a layer is {layer_bytes / 2**20:.1f} MiB per rank")
    ranks = got["ranks"]
    assert isinstance(ranks, list) and len(ranks) == 2, "the driver sent no result for every rank"
    off = args["offset"]
    for rank, r in enumerate(ranks):
        for layer, (extra, kept) in enumerate(zip(r["extra"], r["kept"])):
            assert isinstance(extra, int) and extra < layer_bytes // 4, (
                f"rank {rank}, layer {layer}: transfer_layer + move_from_buffer allocated "
                f"{extra / 2**20:.1f} MiB at their peak, a layer is {layer_bytes / 2**20:.1f} MiB")
            assert isinstance(kept, int) and kept <= 1 << 20, (
                f"rank {rank}, layer {layer}: {kept / 2**20:.1f} MiB stayed allocated after the transfer")
        assert len(r["sums"]) == layers and len(r["picks"]) == layers
        for layer, row in enumerate(maps["new"]):
            for k in range(2):
                full = _expected(args, row, rank, local, layer, k, hidden[k])
                _same(np.asarray(r["sums"][layer][k])[:, None], full.sum(axis=1)[:, None],
                      f"rank {rank}, layer {layer}, weight {k} (row sums)")
                _same(r["picks"][layer][k], full[:, off::stride],
                      f"rank {rank}, layer {layer}, weight {k} (sampled columns)")


_FIELDS = ("window_size", "step_interval", "num_redundant_experts", "log_balancedness", "use_async")
_DEFAULTS = {"window_size": 1000, "step_interval": 3000, "num_redundant_experts": 0,
             "log_balancedness": False, "use_async": False}


def test_eplb_config_has_async_switch():
    # EPLBConfig.use_async defaults to False and is set by keyword and by JSON (as
    # --eplb-config): configs with random subsets of the fields, use_async among them or left
    # to its default, built one way or the other, read back field by field.
    import json

    rng = fresh()
    configs, want = [], []
    for i in range(int(rng.integers(6, 11))):
        given = {}
        for f in _FIELDS:
            if rng.integers(3) == 0:
                continue
            if f in ("log_balancedness", "use_async"):
                given[f] = bool(rng.integers(2))
            else:
                given[f] = int(rng.integers(0 if f == "num_redundant_experts" else 1, 5000))
        if i < 2:
            given["use_async"] = bool(i)  # one of each, whatever else is drawn
        how = "keyword" if rng.integers(2) else "json"
        configs.append({"how": how, "given": given, "json": json.dumps(given)})
        want.append([given.get(f, _DEFAULTS[f]) for f in _FIELDS])
    order = rng.permutation(len(configs))
    configs, want = [configs[i] for i in order], [want[i] for i in order]
    got = run(RANKS_PRELUDE + _DRIVER, {"scenario": "config", "configs": configs}, timeout=180)["config"]
    assert isinstance(got, list) and len(got) == len(configs), "a result per config expected"
    for c, g, w in zip(configs, got, want):
        for f, gv, wv in zip(_FIELDS, g, w):
            assert type(gv) is type(wv) and gv == wv, (
                f"EPLBConfig built by {c['how']} from {c['json']}: {f} is {gv!r}, want {wv!r}")
