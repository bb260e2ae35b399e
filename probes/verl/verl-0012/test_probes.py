"""Probes for verl-0012 (prepare_dynamic_batch / restore_dynamic_batch and DataProto.split).

The judge (this module) never imports verl or torch. It draws every scenario fresh (attention
masks, token budgets, sample counts, index lists, split sizes, meta_info values) and sends it to
the child, which builds a DataProto on the GPU whose every row
carries its own sample index (in several tensors of different shapes and in two non-tensor
entries, one of them a list of per-sample dicts like multi_modal_inputs), runs the code under
test and sends back which sample every row of every piece holds, and where. The judge checks
that against what it knows: the masks' valid-token counts give the number of micro-batches,
the sample indices give where every row must be, and the instruction's rules give the order;
the grouping itself is compared with gold's on the same masks (reference).
"""

import math

import numpy as np

from infradev_probe import RANKS_PRELUDE, fresh, reference, run

BUILD = r"""
import numpy as np
import torch

from verl import DataProto


def build(mask, device, meta=None):
    mask = torch.as_tensor(np.asarray(mask), dtype=torch.int64)
    n, width = mask.shape
    ids = torch.arange(n)
    tensors = {
        "input_ids": ids[:, None] * 1000 + torch.arange(width)[None, :],
        "attention_mask": mask,
        "row": ids,
        "feat": ids[:, None, None].float() * torch.ones(n, 2, 3),
    }
    tensors = {k: v.to(device) for k, v in tensors.items()}
    non_tensors = {
        "uid": np.array(["u%d" % i for i in range(n)], dtype=object),
        "multi_modal_inputs": np.array([{"pixel_values": torch.full((2,), float(i))} for i in range(n)], dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta or {})


def describe(piece):
    b = piece.batch
    row = b["row"]
    return {
        "type": type(piece).__name__,
        "rows": row.tolist(),
        "devices": sorted({str(v.device.type) for v in b.values()}),
        "input_ids": b["input_ids"].cpu().numpy(),
        "feat_rows": b["feat"][:, 0, 0].long().tolist(),
        "mask": b["attention_mask"].cpu().numpy(),
        "uid": [str(u) for u in piece.non_tensor_batch.get("uid", [])],
        "mm": [int(d["pixel_values"][0].item()) for d in piece.non_tensor_batch.get("multi_modal_inputs", [])],
        "meta": {k: v for k, v in piece.meta_info.items() if isinstance(v, (int, float, str))},
    }
"""

PREPARE = BUILD + r"""
from verl.utils.seqlen_balancing import prepare_dynamic_batch

out = []
for case in ARGS["cases"]:
    data = build(case["mask"], "cuda")
    micro, idx = prepare_dynamic_batch(data, max_token_len=case["max_token_len"])
    out.append({"idx": [list(map(int, x)) for x in idx], "pieces": [describe(m) for m in micro]})
emit(out=out)
"""


def _mask(rng, n, width, lo, hi):
    """Left-padded masks with between lo and hi valid tokens per row."""
    mask = np.zeros((n, width), dtype=np.int64)
    for i in range(n):
        mask[i, width - int(rng.integers(lo, hi + 1)):] = 1
    return mask


def _check_piece(label, k, piece, want_rows, mask):
    assert piece["type"] == "DataProto", f"{label}: piece {k} is a {piece['type']}, want a DataProto"
    assert piece["rows"] == want_rows, f"{label}: piece {k} holds samples {piece['rows']}, want {want_rows}"
    assert piece["devices"] == ["cuda"], f"{label}: piece {k}'s tensors are on {piece['devices']}, want the GPU"
    ids = np.asarray(piece["input_ids"])
    want_ids = np.asarray(want_rows, dtype=np.int64)[:, None] * 1000 + np.arange(mask.shape[1])[None, :]
    assert ids.shape == want_ids.shape and np.array_equal(ids, want_ids) and piece["feat_rows"] == want_rows, (
        f"{label}: piece {k}: the rows of input_ids/feat do not belong to samples {want_rows} "
        f"(feat rows from samples {piece['feat_rows']})")
    np.testing.assert_array_equal(piece["mask"], mask[want_rows], err_msg=f"{label}: piece {k}'s attention_mask rows")
    assert piece["uid"] == [f"u{i}" for i in want_rows], (
        f"{label}: piece {k}'s non-tensor 'uid' entries are {piece['uid']}, want those of samples {want_rows}")
    assert piece["mm"] == want_rows, (
        f"{label}: piece {k}'s multi_modal_inputs belong to samples {piece['mm']}, want {want_rows}")


def test_micro_batches_carry_their_samples_tensors_and_non_tensors():
    rng = fresh()
    cases = []
    for kind in ("several", "tight", "roomy"):
        n, width = int(rng.integers(5, 25)), int(rng.integers(8, 65))
        lo = int(rng.integers(1, width + 1))
        mask = _mask(rng, n, width, lo, width)
        longest, total = int(mask.sum(-1).max()), int(mask.sum())
        if kind == "several":
            budget = int(rng.integers(longest, max(longest, total // 2) + 1))
        elif kind == "tight":
            budget = longest
        else:
            budget = int(rng.integers(total, 2 * total + 1))
        cases.append({"label": f"{n} samples of {lo}-{width} tokens ({total} in all), budget {budget}", "mask": mask,
                      "max_token_len": budget})
    out = run(PREPARE, {"cases": cases}, timeout=300)["out"]
    ref = reference(PREPARE, {"cases": cases}, timeout=300)["out"]
    for case, got, want in zip(cases, out, ref, strict=True):
        label, mask = case["label"], case["mask"]
        n = mask.shape[0]
        want_count = min(n, math.ceil(int(mask.sum()) / case["max_token_len"]))
        idx = got["idx"]
        assert len(idx) == want_count and len(got["pieces"]) == want_count, (
            f"{label}: {len(got['pieces'])} micro-batches with {len(idx)} index lists, want {want_count} "
            f"(min(samples, ceil(valid tokens / max_token_len)))")
        assert sorted(i for part in idx for i in part) == list(range(n)), (
            f"{label}: the index lists {idx} are not a partition of the {n} samples")
        assert idx == want["idx"], (
            f"{label}: index lists {idx}, want rearrange_micro_batches' grouping {want['idx']} (gold's, on the same "
            f"masks)")
        for k, (piece, rows) in enumerate(zip(got["pieces"], idx, strict=True)):
            _check_piece(label, k, piece, rows, mask)


RESTORE = BUILD + r"""
from verl.utils.seqlen_balancing import prepare_dynamic_batch, restore_dynamic_batch

res = {}
data = build(ARGS["mask"], "cuda")
micro, idx = prepare_dynamic_batch(data, max_token_len=ARGS["max_token_len"])
values = torch.cat([m.batch["row"].float()[:, None] * 10 + torch.arange(3, device="cuda") for m in micro])
ids = torch.cat([m.batch["row"] for m in micro])
for name, t in (("values", values), ("ids", ids)):
    r = restore_dynamic_batch(t, idx)
    res[name] = {"data": r.cpu().numpy(), "device": r.device.type, "dtype": str(r.dtype)}
given = [list(map(int, x)) for x in ARGS["given_idx"]]
flat = [i for part in given for i in part]
t = torch.tensor(flat, device="cuda", dtype=torch.int32) * 7
r = restore_dynamic_batch(t, given)
res["given"] = {"data": r.cpu().numpy(), "device": r.device.type, "dtype": str(r.dtype)}
emit(**res)
"""


def test_restore_puts_rows_back_in_sample_order_on_their_device():
    rng = fresh()
    n, width = int(rng.integers(6, 25)), int(rng.integers(8, 49))
    mask = _mask(rng, n, width, 1, width)
    budget = int(rng.integers(width, 3 * width + 1))
    m = int(rng.integers(4, 12))
    perm = [int(i) for i in rng.permutation(m)]
    cuts = sorted(int(c) for c in rng.choice(range(1, m), size=int(rng.integers(1, min(m - 1, 4) + 1)), replace=False))
    given = [perm[a:b] for a, b in zip([0] + cuts, cuts + [m])]
    out = run(RESTORE, {"mask": mask, "max_token_len": budget, "given_idx": given}, timeout=300)
    for name, dtype in (("values", "torch.float32"), ("ids", "torch.int64"), ("given", "torch.int32")):
        got = out[name]
        assert got["device"] == "cuda", (
            f"restore_dynamic_batch returned the {name} rows on {got['device']}; the result stays on the input's "
            f"device (the GPU)")
        assert got["dtype"] == dtype, f"restore_dynamic_batch returned {name} as {got['dtype']}, want {dtype}"
    np.testing.assert_array_equal(out["values"]["data"], np.arange(n)[:, None] * 10.0 + np.arange(3)[None, :],
                                  err_msg="per-sample rows restored from the micro-batches")
    np.testing.assert_array_equal(out["ids"]["data"], np.arange(n), err_msg="sample ids restored from the micro-batches")
    np.testing.assert_array_equal(out["given"]["data"], np.arange(m) * 7,
                                  err_msg=f"rows concatenated in the order of {given}, restored")


RANKS = RANKS_PRELUDE + BUILD + r"""
def rank_fn(rank, world, port, payload):
    import datetime

    import torch.distributed as dist

    from verl.utils.seqlen_balancing import prepare_dynamic_batch

    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=world, device_id=dev,
                            timeout=datetime.timedelta(seconds=120))
    try:
        data = build(payload["masks"][rank], dev)
        micro, idx = prepare_dynamic_batch(data, max_token_len=payload["max_token_len"])
        return {"idx": [list(map(int, x)) for x in idx], "pieces": [describe(m) for m in micro]}
    finally:
        dist.destroy_process_group()


emit(ranks=spawn_ranks(2, rank_fn, ARGS, 240))
"""


def test_ranks_of_a_process_group_get_the_same_number_of_micro_batches():
    rng = fresh()
    width = int(rng.integers(32, 97))
    budget = int(rng.integers(width, 2 * width + 1))
    while True:
        # one rank with a few short samples, the other with many long ones
        masks = [_mask(rng, int(rng.integers(3, 12)), width, 1, max(1, width // 8)),
                 _mask(rng, int(rng.integers(8, 17)), width, width // 2, width)]
        if rng.random() < 0.5:
            masks = masks[::-1]
        alone = [min(m.shape[0], math.ceil(int(m.sum()) / budget)) for m in masks]
        if alone[0] != alone[1]:
            break
    # The ranks are forked from the driver, which imports verl first: the NVML check keeps that
    # import's torch.cuda.is_available() from initializing CUDA before the fork.
    out = run(RANKS, {"masks": masks, "max_token_len": budget}, timeout=300,
              env={"PYTORCH_NVML_BASED_CUDA_CHECK": "1"})["ranks"]
    for rank, (got, mask) in enumerate(zip(out, masks, strict=True)):
        label = f"rank {rank} ({mask.shape[0]} samples, {int(mask.sum())} tokens, budget {budget})"
        assert len(got["idx"]) == max(alone) and len(got["pieces"]) == max(alone), (
            f"{label}: {len(got['pieces'])} micro-batches; under a process group every rank gets the largest count "
            f"any rank needs ({alone} on their own), so {max(alone)}")
        assert sorted(i for part in got["idx"] for i in part) == list(range(mask.shape[0])) and all(got["idx"]), (
            f"{label}: the index lists {got['idx']} are not a partition into non-empty micro-batches")
        for k, (piece, rows) in enumerate(zip(got["pieces"], got["idx"], strict=True)):
            _check_piece(label, k, piece, rows, mask)


SPLIT = BUILD + r"""
out = {}
data = build(ARGS["mask"], "cuda", meta=ARGS["meta"])
for size in ARGS["sizes"]:
    out[str(size)] = [describe(p) for p in data.split(size)]
emit(out=out)
"""


def test_split_cuts_consecutive_pieces_with_meta_info():
    rng = fresh()
    n = int(rng.choice([6, 8, 10, 12, 15, 16, 18, 20, 24]))
    mask = _mask(rng, n, int(rng.integers(4, 33)), 1, 4)
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    sizes = [int(d) for d in rng.permutation(divisors)[:int(rng.integers(2, min(5, len(divisors)) + 1))]]
    meta = {"temperature": float(np.round(rng.uniform(0.1, 2.0), 3)), "tag": "t%x" % int(rng.integers(1 << 32)),
            "step": int(rng.integers(1 << 20))}
    out = run(SPLIT, {"mask": mask, "sizes": sizes, "meta": meta}, timeout=300)["out"]
    for size in sizes:
        pieces = out[str(size)]
        want = [list(range(s, s + size)) for s in range(0, n, size)]
        assert [p["rows"] for p in pieces] == want, (
            f"split({size}) of {n} samples gave pieces holding {[p['rows'] for p in pieces]}, want {want}")
        for k, (piece, rows) in enumerate(zip(pieces, want)):
            _check_piece(f"split({size})", k, piece, rows, mask)
            assert piece["meta"] == meta, (
                f"split({size}): piece {k} carries meta_info {piece['meta']}, want the original's {meta}")
