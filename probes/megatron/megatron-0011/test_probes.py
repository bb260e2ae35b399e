"""Hidden probes for megatron-0011 (FP32 local gradient accumulation for parameters matched by name).

The judge never imports megatron or torch. Children open a one-rank NCCL group on the CUDA device
(as the official tests do with WORLD_SIZE=1), wrap a small bf16 model (three 64x64 linear layers with
bias and a 7x64 head) in DistributedDataParallel without grad_reduce_in_fp32, and send back, per
parameter, main_grad dtypes and addresses relative to the gradient buffer, the CUDA allocator's
figures and gradient values. The judge decides which parameters are promoted with its own fnmatch,
computes the extra memory as one FP32 tensor per promoted parameter (the allocator rounds each to
512 bytes), and computes the synchronized gradients itself: on one rank the collective is the
identity, so a promoted parameter ends with its FP32 value rounded to bfloat16 (round to nearest
even, computed here on the float32 bits) and the others keep theirs."""

import fnmatch

import numpy as np

from infradev_probe import run

PRELUDE = """
import socket

import numpy as np
import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.transformer import TransformerConfig


def init_one_rank():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    torch.cuda.set_device(0)
    dist.init_process_group(backend="nccl", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
    parallel_state.initialize_model_parallel()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(64, 64, bias=True) for _ in range(3)])
        self.head = torch.nn.Linear(64, 7, bias=False)


def build(patterns, overlap=False, distopt=False):
    torch.manual_seed(0)
    config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=False, use_distributed_optimizer=distopt, overlap_grad_reduce=overlap,
        bucket_size=None, average_in_collective=False,
        param_name_patterns_for_fp32_local_accumulation=tuple(patterns),
    )
    return DistributedDataParallel(
        TransformerConfig(num_attention_heads=1, num_layers=1), ddp_config=config, module=Net().bfloat16()
    )


def describe(ddp):
    buf = ddp.buffers[0]
    gd = buf.grad_data
    lo, size = gd.data_ptr(), gd.element_size()
    hi = lo + gd.numel() * size
    out = {}
    for name, p in ddp.module.named_parameters():
        copy = getattr(p, "main_grad_copy_in_grad_buffer", None)
        out[name] = dict(
            dtype=str(p.main_grad.dtype), shape=list(p.main_grad.shape),
            inside=lo <= p.main_grad.data_ptr() < hi,
            copy=None if copy is None else dict(
                dtype=str(copy.dtype), shape=list(copy.shape),
                at_slot=copy.data_ptr() == lo + buf.param_index_map[p][0] * size),
        )
    names = {p: n for n, p in ddp.module.named_parameters()}
    extra = [dict(dtype=str(t.dtype), ptr=t.data_ptr()) for t in buf.extra_main_grads]
    mg = {n: p.main_grad.data_ptr() for n, p in ddp.module.named_parameters()}
    buckets = [[names[p] for p in b.params_with_extra_main_grads] for b in buf.buckets]
    return dict(params=out, extra=extra, main_grad_ptrs=mg, buckets=buckets)
"""

SHAPES = {f"layers.{i}.{k}": ((64, 64) if k == "weight" else (64,)) for i in range(3) for k in ("weight", "bias")}
SHAPES["head.weight"] = (7, 64)


def promoted(patterns):
    return {n for n in SHAPES if any(p == "all" or fnmatch.fnmatch(n, p) for p in patterns)}


def rounded(nbytes):
    return -(-nbytes // 512) * 512


def bf16(x):
    """float32 -> bfloat16 (round to nearest even) -> float32, on the bits."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


MEMORY_PATTERNS = ["layers.1.*"]


def test_promoted_main_grads_and_memory():
    out = run(PRELUDE + """
init_one_rank()
warm = build([])  # first-construction allocations, if any, land here
torch.cuda.synchronize()
start = torch.cuda.memory_allocated()
plain = build([])
torch.cuda.synchronize()
mid = torch.cuda.memory_allocated()
chosen = build(ARGS["patterns"])
torch.cuda.synchronize()
end = torch.cuda.memory_allocated()
emit(plain_bytes=mid - start, promoted_bytes=end - mid, plain=describe(plain), chosen=describe(chosen))
""", args={"patterns": MEMORY_PATTERNS})
    want = promoted(MEMORY_PATTERNS)
    assert want == {"layers.1.weight", "layers.1.bias"}, "probe setup"
    got = out["chosen"]
    assert set(got["params"]) == set(SHAPES), f"probe setup: parameter names {sorted(got['params'])}"
    for name, info in got["params"].items():
        if name in want:
            assert info["dtype"] == "torch.float32" and info["shape"] == list(SHAPES[name]), \
                f"{name} matches {MEMORY_PATTERNS}: main_grad is {info['dtype']} {info['shape']}, want float32 {SHAPES[name]}"
            assert not info["inside"], f"{name}: the FP32 main_grad lies inside grad_data; it must be its own tensor"
            c = info["copy"]
            assert c is not None and c["dtype"] == "torch.bfloat16" and c["shape"] == list(SHAPES[name]) and c["at_slot"], \
                f"{name}: main_grad_copy_in_grad_buffer must be the parameter's bf16 slot in grad_data, got {c}"
        else:
            assert info["dtype"] == "torch.bfloat16" and info["inside"] and info["copy"] is None, \
                f"{name} matches no pattern: main_grad must stay the bf16 view into grad_data ({info})"
    ptrs = sorted(got["main_grad_ptrs"][n] for n in want)
    assert sorted(e["ptr"] for e in got["extra"]) == ptrs and all(e["dtype"] == "torch.float32" for e in got["extra"]), \
        f"extra_main_grads must be exactly the promoted parameters' FP32 main_grads: {got['extra']}"
    assert sorted(n for b in got["buckets"] for n in b) == sorted(want), \
        f"buckets' params_with_extra_main_grads {got['buckets']}, want {sorted(want)}"
    assert out["plain"]["extra"] == [] and all(v["copy"] is None for v in out["plain"]["params"].values()), \
        "without patterns nothing may be promoted"
    extra = sum(rounded(4 * int(np.prod(SHAPES[n]))) for n in want)
    diff = out["promoted_bytes"] - out["plain_bytes"]
    assert extra <= diff <= extra + 1024, \
        f"promoting {sorted(want)} cost {diff} bytes of GPU memory over the same DDP without patterns; " \
        f"want one FP32 tensor per promoted parameter, {extra} bytes"


SYNC_PATTERNS = ["layers.[02].weight"]
SYNC_MODES = [dict(overlap=False, distopt=False), dict(overlap=True, distopt=False), dict(overlap=False, distopt=True)]


def sync_values():
    rng = np.random.default_rng(5)
    vals = {}
    for name, shape in SHAPES.items():
        v = rng.uniform(-2, 2, size=shape).astype(np.float32)
        if name in promoted(SYNC_PATTERNS):
            v = v + np.float32(2.0 ** -12)  # FP32 detail below bf16 precision
            assert not np.array_equal(bf16(v), v)
        else:
            v = bf16(v)  # what a bf16 main_grad can hold
        vals[name] = v
    return vals


def test_grad_sync_round_trip():
    vals = sync_values()
    out = run(PRELUDE + """
init_one_rank()
results = []
for mode in ARGS["modes"]:
    ddp = build(ARGS["patterns"], **mode)
    params = dict(ddp.module.named_parameters())
    def load():
        for name, p in params.items():
            p.main_grad.copy_(torch.from_numpy(np.asarray(ARGS["values"][name])).to(p.main_grad.device))
    load()
    ddp.finish_grad_sync()
    torch.cuda.synchronize()
    synced = {n: p.main_grad.float().cpu().numpy() for n, p in params.items()}
    dtypes = {n: str(p.main_grad.dtype) for n, p in params.items()}
    ddp.zero_grad_buffer()
    zeroed = {n: float(p.main_grad.float().abs().max().item()) for n, p in params.items()}
    load()
    ddp.scale_gradients(0.5)
    scaled = {n: p.main_grad.float().cpu().numpy() for n, p in params.items()}
    results.append(dict(synced=synced, dtypes=dtypes, zeroed=zeroed, scaled=scaled))
emit(results=results)
""", args={"patterns": SYNC_PATTERNS, "modes": SYNC_MODES, "values": vals})
    want_promoted = promoted(SYNC_PATTERNS)
    for mode, got in zip(SYNC_MODES, out["results"]):
        where = f"overlap_grad_reduce={mode['overlap']}, use_distributed_optimizer={mode['distopt']}"
        for name, v in vals.items():
            if name in want_promoted:
                assert got["dtypes"][name] == "torch.float32", f"{where}: {name} main_grad is {got['dtypes'][name]}"
                want = bf16(v)
                what = "its FP32 value, reduced through the bf16 buffer (rounded to bf16) and copied back"
            else:
                want = v
                what = "its value (a bf16 view of the buffer, reduced in place)"
            diff = np.abs(got["synced"][name] - want)
            assert diff.max() == 0, \
                f"{where}: after finish_grad_sync {name}'s main_grad differs from {what} at {int((diff > 0).sum())} " \
                f"entries (max {diff.max():.3g})"
            assert got["zeroed"][name] == 0, f"{where}: zero_grad_buffer left {name}'s main_grad non-zero"
            assert np.array_equal(got["scaled"][name], v * np.float32(0.5)), \
                f"{where}: scale_gradients(0.5) did not halve {name}'s main_grad"


PATTERN_CASES = [["nothing.*", "layers.?.bias", "head.weight"], ["all"], ["layers.[12].weight"], ["*.bias", "*"]]


def test_pattern_selection_and_config():
    out = run(PRELUDE + """
init_one_rank()
chosen = []
for patterns in ARGS["cases"]:
    d = describe(build(patterns))["params"]
    chosen.append(sorted(n for n, v in d.items() if v["dtype"] == "torch.float32" and v["copy"] is not None))
default = DistributedDataParallelConfig().param_name_patterns_for_fp32_local_accumulation
try:
    DistributedDataParallelConfig(grad_reduce_in_fp32=True, param_name_patterns_for_fp32_local_accumulation=("head.*",))
    refused = "accepted"
except AssertionError:
    refused = "AssertionError"
except Exception as e:
    refused = type(e).__name__
emit(chosen=chosen, default=list(default), default_type=type(default).__name__, refused=refused)
""", args={"cases": PATTERN_CASES})
    for patterns, got in zip(PATTERN_CASES, out["chosen"]):
        assert got == sorted(promoted(patterns)), \
            f"patterns {patterns}: promoted {got}, want {sorted(promoted(patterns))} (any entry may match)"
    assert out["default"] == [] and out["default_type"] == "tuple", \
        f"default param_name_patterns_for_fp32_local_accumulation is {out['default_type']} {out['default']}, want ()"
    assert out["refused"] == "AssertionError", \
        f"patterns together with grad_reduce_in_fp32=True: got {out['refused']}, want AssertionError"
