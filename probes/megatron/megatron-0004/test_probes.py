"""Hidden probes for megatron-0004 (KV / Mamba-state reshard planners).

The judge never imports megatron. Every probe draws its scenario with `fresh()`: model sizes,
the prefill and decode parallel layouts (TP, PP, explicit uneven windows, replicas and their
scrambled global ranks), the Mamba dimensions. The child builds layouts and plans and sends the
plan back as plain rows; the judge computes the plan the rules give (which pairs overlap, which
replica sends) and also replays the child's plan on numpy arrays built from its own idea of who
owns what, checking every destination is rebuilt exactly and nothing is sent twice."""

import numpy as np

from infradev_probe import fresh, run


def _overlap(a, b):
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def _cuts(rng, total, parts):
    """`parts` contiguous non-empty windows over [0, total), drawn."""
    inner = sorted(int(c) for c in rng.choice(range(1, total), size=parts - 1, replace=False)) if parts > 1 else []
    edges = [0] + inner + [total]
    return [(a, b - a) for a, b in zip(edges, edges[1:])]


def _ranks(rng, count, base):
    return [int(base + r) for r in rng.permutation(count * 3)[:count]]


# ---------------------------------------------------------------------------------------------
# KV
# ---------------------------------------------------------------------------------------------

def _kv_instance(rng, L, H, base, uneven, replicated=True):
    """Layout tuples (global_rank, tp, tp_rank, pp, pp_rank, ep, ep_rank, etp, etp_rank,
    layer_start, num_local_layers) of one instance, with EP/ETP replicas and scrambled ranks."""
    tps = [t for t in (1, 2, 4, 8) if H % t == 0]
    tp = int(rng.choice(tps))
    pps = [p for p in range(1, 5) if p <= L and (uneven or L % p == 0)]
    pp = int(rng.choice(pps))
    windows = _cuts(rng, L, pp) if uneven else [(r * (L // pp), L // pp) for r in range(pp)]
    ep, etp = (int(rng.integers(1, 4)), int(rng.integers(1, 3))) if replicated else (1, 1)
    count = tp * pp * ep * etp
    ranks = iter(_ranks(rng, count, base))
    out = []
    for pr in range(pp):
        for tr in range(tp):
            for er in range(ep):
                for xr in range(etp):
                    start, n = windows[pr] if uneven else (None, None)
                    out.append([next(ranks), tp, tr, pp, pr, ep, er, etp, xr, start, n])
    return [out[int(i)] for i in rng.permutation(len(out))]


def _first_listed_differs(srcs, key):
    """Whether some shard's first-listed replica is not its smallest rank (so a planner that
    keeps the first one listed sends from the wrong replica)."""
    first, smallest = {}, {}
    for t in srcs:
        first.setdefault(key(t), t[0])
        smallest[key(t)] = min(t[0], smallest.get(key(t), t[0]))
    return first != smallest


def _kv_ranges(t, L, H):
    _, tp, tr, pp, pr, _, _, _, _, start, n = t
    if start is not None:
        layers = (start, start + n)
    else:
        layers = (pr * (L // pp), (pr + 1) * (L // pp))
    return layers, (tr * (H // tp), (tr + 1) * (H // tp))


def _kv_plan(srcs, dsts, L, H):
    """The plan the rules give, as rows (src, dst, layer lo, layer hi, head lo, head hi)."""
    rep = {}
    for t in srcs:
        key = (t[2], t[4])
        rep[key] = min(t[0], rep.get(key, t[0]))
    senders = set(rep.values())
    rows = []
    for s in srcs:
        if s[0] not in senders:
            continue
        sl, sh = _kv_ranges(s, L, H)
        for d in dsts:
            dl, dh = _kv_ranges(d, L, H)
            lo, ho = _overlap(sl, dl), _overlap(sh, dh)
            if lo and ho:
                rows.append([s[0], d[0], lo[0], lo[1], ho[0], ho[1]])
    return sorted(rows)


KV_DRIVER = """
from megatron.core.inference.disaggregation.kv_reshard import KVShardLayout, plan_kv_reshard
from megatron.core.inference.disaggregation.utils import transfers_for_dst, transfers_for_src

def mk(t):
    g, tp, tr, pp, pr, ep, er, etp, xr, start, n = t
    kw = {} if start is None else {"layer_start": start, "num_local_layers": n}
    return KVShardLayout(ARGS["L"], ARGS["H"], tp, tr, pp, pr, g, ep_size=ep, ep_rank=er,
                         etp_size=etp, etp_rank=xr, **kw)

srcs = [mk(t) for t in ARGS["srcs"]]
dsts = [mk(t) for t in ARGS["dsts"]]
by_src = {s.global_rank: s for s in srcs}
by_dst = {d.global_rank: d for d in dsts}
plan = plan_kv_reshard(srcs, dsts)

def row(t):
    s, d = by_src[t.src_rank], by_dst[t.dst_rank]
    sl, sh = t.src_layer_slice(s), t.src_head_slice(s)
    dl, dh = t.dst_layer_slice(d), t.dst_head_slice(d)
    return [t.src_rank, t.dst_rank, t.global_layer_lo, t.global_layer_hi, t.global_head_lo,
            t.global_head_hi, sl.start, sl.stop, sh.start, sh.stop, dl.start, dl.stop, dh.start, dh.stop]

emit(plan=[row(t) for t in plan],
     local=[[d.global_rank, d.local_num_layers(), d.local_num_heads(), *d.layer_range(), *d.head_range()]
            for d in dsts],
     for_dst=[[g, [row(t) for t in transfers_for_dst(plan, g)]] for g in ARGS["probe_dsts"]],
     for_src=[[s, [row(t) for t in transfers_for_src(plan, s)]] for s in ARGS["probe_srcs"]])
"""


def test_kv_each_shard_is_sent_once_by_its_smallest_replica():
    rng = fresh()
    L = int(rng.integers(4, 25))
    H = int(rng.choice([4, 8, 16, 24]))
    while True:
        srcs = _kv_instance(rng, L, H, 0, bool(rng.random() < 0.4))
        if _first_listed_differs(srcs, lambda t: (t[2], t[4])):
            break
    dsts = []
    for k in range(int(rng.integers(1, 3))):  # one or two decode instances
        dsts += _kv_instance(rng, L, H, 1000 * (k + 1), bool(rng.random() < 0.4))
    probe_dsts = [int(g) for g in rng.choice([d[0] for d in dsts], size=2, replace=False)]
    probe_srcs = [int(g) for g in rng.choice([s[0] for s in srcs], size=min(3, len(srcs)), replace=False)]
    out = run(KV_DRIVER, {"srcs": srcs, "dsts": dsts, "L": L, "H": H,
                          "probe_dsts": probe_dsts, "probe_srcs": probe_srcs})
    what = f"L={L}, H={H}, {len(srcs)} sources, {len(dsts)} destinations"
    src_info = {t[0]: t for t in srcs}
    dst_info = {t[0]: t for t in dsts}
    want_plan = _kv_plan(srcs, dsts, L, H)
    got_plan = sorted(r[:6] for r in out["plan"])
    assert got_plan == want_plan, f"{what}: plan (src, dst, layers, heads) {got_plan}, want {want_plan}"

    glob = (np.arange(L)[:, None] * 1000 + np.arange(H)[None, :]).astype(np.int64)
    bufs, want = {}, {}
    for g, t in dst_info.items():
        (l0, l1), (h0, h1) = _kv_ranges(t, L, H)
        bufs[g] = np.full((l1 - l0, h1 - h0), -1, np.int64)
        want[g] = glob[l0:l1, h0:h1]
    for g, nl, nh, l0, l1, h0, h1 in out["local"]:
        (wl0, wl1), (wh0, wh1) = _kv_ranges(dst_info[g], L, H)
        assert (nl, nh, l0, l1, h0, h1) == (wl1 - wl0, wh1 - wh0, wl0, wl1, wh0, wh1), \
            f"{what}: dst {g}: local sizes and ranges {(nl, nh, l0, l1, h0, h1)}"
    written = 0
    for row in out["plan"]:
        s, d, llo, lhi, hlo, hhi = row[:6]
        (sl0, _), (sh0, _) = _kv_ranges(src_info[s], L, H)
        (dl0, _), (dh0, _) = _kv_ranges(dst_info[d], L, H)
        assert row[6:10] == [llo - sl0, lhi - sl0, hlo - sh0, hhi - sh0], f"{what}: source slices of {row}"
        assert row[10:] == [llo - dl0, lhi - dl0, hlo - dh0, hhi - dh0], f"{what}: destination slices of {row}"
        bufs[d][row[10]:row[11], row[12]:row[13]] = glob[llo:lhi, hlo:hhi]
        written += (lhi - llo) * (hhi - hlo)
    for g in bufs:
        np.testing.assert_array_equal(bufs[g], want[g], err_msg=f"{what}: destination rank {g}")
    assert written == sum(w.size for w in want.values()), f"{what}: some KV entries were sent more than once"
    for g, rows in out["for_dst"]:
        want_rows = [r for r in out["plan"] if r[1] == g]
        assert sorted(r[:6] for r in rows) == [r for r in want_plan if r[1] == g] and rows == want_rows, \
            f"{what}: transfers_for_dst(plan, {g}) {rows}"
    for g, rows in out["for_src"]:
        assert sorted(r[:6] for r in rows) == [r for r in want_plan if r[0] == g] \
            and rows == [r for r in out["plan"] if r[0] == g], f"{what}: transfers_for_src(plan, {g}) {rows}"


# ---------------------------------------------------------------------------------------------
# Mamba
# ---------------------------------------------------------------------------------------------

BANDS = ("x", "B", "C", "ssm")


def _mamba_draw(rng, replicated=True):
    tp_s, tp_d = int(rng.choice([1, 2, 4])), int(rng.choice([1, 2, 4]))
    m = max(tp_s, tp_d)
    dims = {"nheads": m * int(rng.integers(1, 4)), "headdim": int(rng.integers(1, 4)),
            "d_state": int(rng.integers(1, 4)), "ngroups": m * int(rng.integers(1, 3)),
            "d_conv": int(rng.integers(2, 5))}
    layers = int(rng.integers(3, 9))

    def instance(tp, base, replicas):
        windows = _cuts(rng, layers, int(rng.integers(1, min(3, layers) + 1)))
        count = len(windows) * tp * replicas
        ranks = iter(_ranks(rng, count, base))
        out = [[next(ranks), tp, tr, start, n] for start, n in windows for tr in range(tp)
               for _ in range(replicas)]
        return [out[int(i)] for i in rng.permutation(len(out))]

    srcs = instance(tp_s, 0, int(rng.integers(1, 4)) if replicated else 1)
    dsts = instance(tp_d, 500, int(rng.integers(1, 3)))
    return dims, layers, srcs, dsts


def _bands(dims, tp, tr):
    """{band: (global lo, global hi, local offset)} of TP rank tr."""
    di, gb, nh = dims["nheads"] * dims["headdim"] // tp, dims["ngroups"] * dims["d_state"] // tp, dims["nheads"] // tp
    return {"x": (tr * di, (tr + 1) * di, 0), "B": (tr * gb, (tr + 1) * gb, di),
            "C": (tr * gb, (tr + 1) * gb, di + gb), "ssm": (tr * nh, (tr + 1) * nh, 0)}


def _mamba_plan(dims, srcs, dsts):
    rep = {}
    for g, _, tr, start, _ in srcs:
        rep[(tr, start)] = min(g, rep.get((tr, start), g))
    rows = []
    for g, tp, tr, start, n in srcs:
        if rep[(tr, start)] != g:
            continue
        sb = _bands(dims, tp, tr)
        for dg, dtp, dtr, dstart, dn in dsts:
            lo = _overlap((start, start + n), (dstart, dstart + dn))
            if not lo:
                continue
            db = _bands(dims, dtp, dtr)
            for band in BANDS:
                c = _overlap(sb[band][:2], db[band][:2])
                if not c:
                    continue
                for layer in range(*lo):
                    rows.append([g, dg, band, layer, layer - start, layer - dstart,
                                 sb[band][2] + c[0] - sb[band][0], sb[band][2] + c[1] - sb[band][0],
                                 db[band][2] + c[0] - db[band][0], db[band][2] + c[1] - db[band][0],
                                 band != "ssm"])
    return sorted(rows)


def _mamba_shard(dims, conv_g, ssm_g, tp, tr, start, n):
    b = _bands(dims, tp, tr)
    d_inner = dims["nheads"] * dims["headdim"]
    gband = dims["ngroups"] * dims["d_state"]
    x = conv_g[start:start + n, b["x"][0]:b["x"][1]]
    bb = conv_g[start:start + n, d_inner + b["B"][0]:d_inner + b["B"][1]]
    cc = conv_g[start:start + n, d_inner + gband + b["C"][0]:d_inner + gband + b["C"][1]]
    return np.concatenate([x, bb, cc], axis=1), ssm_g[start:start + n, b["ssm"][0]:b["ssm"][1]]


MAMBA_DRIVER = """
from megatron.core.inference.disaggregation.mamba_reshard import (
    MambaShardLayout, MambaStateDims, plan_mamba_reshard)

dims = MambaStateDims(**ARGS["dims"])

def mk(t):
    g, tp, tr, start, n = t
    return MambaShardLayout(global_rank=g, tp_size=tp, tp_rank=tr, layer_start=start,
                            num_layers=n, dims=dims)

dsts = [mk(t) for t in ARGS["dsts"]]
plan = plan_mamba_reshard([mk(t) for t in ARGS["srcs"]], dsts)
emit(plan=[[t.src_rank, t.dst_rank, t.band, t.global_layer, t.src_layer, t.dst_layer,
            t.src_lo, t.src_hi, t.dst_lo, t.dst_hi, bool(t.is_conv)] for t in plan],
     local=[[d.global_rank, d.conv_dim_local, d.nheads_local, d.d_inner_local, d.ngroups_local,
             d.d_inner, *d.layer_range()] for d in dsts])
"""


def test_mamba_each_shard_is_sent_once_by_its_smallest_replica():
    rng = fresh()
    while True:
        dims, layers, srcs, dsts = _mamba_draw(rng)
        if _first_listed_differs(srcs, lambda t: (t[2], t[3])):
            break
    out = run(MAMBA_DRIVER, {"dims": dims, "srcs": srcs, "dsts": dsts})
    what = f"dims={dims}, {layers} layers, {len(srcs)} sources, {len(dsts)} destinations"
    want_plan = _mamba_plan(dims, srcs, dsts)
    got_plan = sorted(out["plan"])
    assert got_plan == want_plan, f"{what}: plan {got_plan}, want {want_plan}"

    d_inner = dims["nheads"] * dims["headdim"]
    conv = d_inner + 2 * dims["ngroups"] * dims["d_state"]
    conv_g = np.arange(layers * conv * dims["d_conv"], dtype=np.int64).reshape(layers, conv, dims["d_conv"])
    ssm_g = np.arange(layers * dims["nheads"] * dims["headdim"] * dims["d_state"], dtype=np.int64).reshape(
        layers, dims["nheads"], dims["headdim"], dims["d_state"]) + 10 ** 7
    src_state = {g: _mamba_shard(dims, conv_g, ssm_g, tp, tr, s, n) for g, tp, tr, s, n in srcs}
    want = {g: _mamba_shard(dims, conv_g, ssm_g, tp, tr, s, n) for g, tp, tr, s, n in dsts}
    got = {g: (np.full_like(c, -1), np.full_like(m, -1)) for g, (c, m) in want.items()}
    dst_info = {t[0]: t for t in dsts}
    for g, conv_dim, nh, di, ng, d_inner_got, l0, l1 in out["local"]:
        _, tp, _, start, n = dst_info[g]
        assert [conv_dim, nh, di, ng, d_inner_got, l0, l1] == [
            want[g][0].shape[1], want[g][1].shape[1], d_inner // tp, dims["ngroups"] // tp, d_inner,
            start, start + n], f"{what}: dst {g} local dims"
    written = 0
    for s, d, band, layer, sl, dl, slo, shi, dlo, dhi, is_conv in out["plan"]:
        idx = 0 if is_conv else 1
        block = src_state[s][idx][sl, slo:shi]
        got[d][idx][dl, dlo:dhi] = block
        written += block.size
    for g in want:
        np.testing.assert_array_equal(got[g][0], want[g][0], err_msg=f"{what}: conv state of dst {g}")
        np.testing.assert_array_equal(got[g][1], want[g][1], err_msg=f"{what}: ssm state of dst {g}")
    assert written == sum(c.size + m.size for c, m in want.values()), f"{what}: state sent more than once"


# ---------------------------------------------------------------------------------------------
# Contracts: mismatched models, empty sides, divisibility, plain values.
# ---------------------------------------------------------------------------------------------

MISMATCH_DRIVER = """
from megatron.core.inference.disaggregation.kv_reshard import KVShardLayout, plan_kv_reshard

def mk(L, H, t):
    g, tp, tr, pp, pr = t
    return KVShardLayout(L, H, tp, tr, pp, pr, g)

def outcome(case):
    srcs = [mk(case["src_model"][0], case["src_model"][1], t) for t in case["srcs"]]
    dsts = [mk(case["dst_model"][0], case["dst_model"][1], t) for t in case["dsts"]]
    try:
        plan = plan_kv_reshard(srcs, dsts)
    except Exception as e:
        return [type(e).__name__, [c.__name__ for c in type(e).__mro__]]
    return ["ok", sorted([t.src_rank, t.dst_rank, t.global_layer_lo, t.global_layer_hi,
                          t.global_head_lo, t.global_head_hi] for t in plan)]

emit(outcomes=[outcome(c) for c in ARGS["cases"]])
"""


def _plain_instance(rng, L, H, base):
    tp = int(rng.choice([t for t in (1, 2, 4) if H % t == 0]))
    pp = int(rng.choice([p for p in (1, 2, 3) if L % p == 0]))
    ranks = iter(_ranks(rng, tp * pp, base))
    return [[next(ranks), tp, tr, pp, pr] for pr in range(pp) for tr in range(tp)]


def test_kv_plan_rejects_layouts_of_different_models():
    rng = fresh()
    kinds = ["heads", "layers", "both", "same", "no_dsts", "no_srcs"]
    drawn = [str(k) for k in rng.choice(kinds, size=int(rng.integers(3, 6)))]
    kinds = [str(k) for k in rng.permutation(["heads", "layers", "same"] + drawn)]
    cases = []
    for kind in kinds:
        L, H = 6 * int(rng.integers(1, 4)), 4 * int(rng.integers(1, 4))
        L2 = L + 6 * int(rng.integers(1, 3)) if kind in ("layers", "both") else L
        H2 = H + 4 * int(rng.integers(1, 3)) if kind in ("heads", "both") else H
        srcs = [] if kind == "no_srcs" else _plain_instance(rng, L, H, 0)
        dsts = [] if kind == "no_dsts" else _plain_instance(rng, L2, H2, 100)
        cases.append({"kind": kind, "src_model": [L, H], "dst_model": [L2, H2], "srcs": srcs, "dsts": dsts})
    out = run(MISMATCH_DRIVER, {"cases": cases})
    assert len(out["outcomes"]) == len(cases), f"{len(out['outcomes'])} outcomes for {len(cases)} cases"
    for case, got in zip(cases, out["outcomes"]):
        what = f"sources of a {case['src_model']} model, destinations of a {case['dst_model']} model ({case['kind']})"
        if case["kind"] in ("heads", "layers", "both"):
            assert got[0] != "ok", f"{what}: planning did not raise"
            assert "ValueError" in got[1], f"{what}: raised {got[0]}, not a ValueError"
        else:
            L, H = case["src_model"]
            srcs = [[g, tp, tr, pp, pr, 1, 0, 1, 0, None, None] for g, tp, tr, pp, pr in case["srcs"]]
            dsts = [[g, tp, tr, pp, pr, 1, 0, 1, 0, None, None] for g, tp, tr, pp, pr in case["dsts"]]
            want = ["ok", _kv_plan(srcs, dsts, L, H)]
            assert got == want, f"{what}: {got}, want {want}"


DIVISIBILITY_DRIVER = """
from megatron.core.inference.disaggregation.kv_reshard import KVShardLayout
from megatron.core.inference.disaggregation.mamba_reshard import MambaShardLayout, MambaStateDims

def kv(c):
    kw = {} if c["window"] is None else {k: v for k, v in zip(("layer_start", "num_local_layers"), c["window"]) if v is not None}
    layout = KVShardLayout(c["L"], c["H"], c["tp"], c["tp_rank"], c["pp"], c["pp_rank"], 0, **kw)
    return [*layout.layer_range(), *layout.head_range(), layout.local_num_layers(), layout.local_num_heads()]

def mamba(c):
    dims = MambaStateDims(nheads=c["nheads"], headdim=c["headdim"], d_state=c["d_state"],
                          ngroups=c["ngroups"], d_conv=2)
    layout = MambaShardLayout(global_rank=0, tp_size=c["tp"], tp_rank=c["tp_rank"], layer_start=0,
                              num_layers=1, dims=dims)
    return [layout.nheads_local, layout.ngroups_local, layout.d_inner_local, layout.conv_dim_local]

def outcome(c):
    try:
        return ["ok", kv(c) if c["what"] == "kv" else mamba(c)]
    except Exception as e:
        return ["ValueError" if isinstance(e, ValueError) else type(e).__name__, []]

emit(outcomes=[outcome(c) for c in ARGS["cases"]])
"""


def _kv_case(rng, kind):
    tp = int(rng.choice([2, 3, 4]))
    pp = int(rng.choice([2, 3, 4]))
    H = tp * int(rng.integers(1, 5)) + (int(rng.integers(1, tp)) if kind == "kv_heads" else 0)
    L = pp * int(rng.integers(1, 5)) + (int(rng.integers(1, pp)) if kind in ("kv_layers", "kv_window") else 0)
    window = None
    if kind == "kv_window":
        start = int(rng.integers(0, L))
        window = [start, int(rng.integers(1, L - start + 1))]
    elif kind == "kv_half":
        window = [int(rng.integers(0, L)), None] if rng.random() < 0.5 else [None, int(rng.integers(1, L + 1))]
    return {"what": "kv", "kind": kind, "L": L, "H": H, "tp": tp, "tp_rank": int(rng.integers(0, tp)),
            "pp": pp, "pp_rank": int(rng.integers(0, pp)), "window": window}


def _mamba_case(rng, kind):
    tp = int(rng.choice([2, 3, 4]))
    nheads = tp * int(rng.integers(1, 4)) + (int(rng.integers(1, tp)) if kind == "mamba_heads" else 0)
    ngroups = tp * int(rng.integers(1, 3)) + (int(rng.integers(1, tp)) if kind == "mamba_groups" else 0)
    return {"what": "mamba", "kind": kind, "tp": tp, "tp_rank": int(rng.integers(0, tp)), "nheads": nheads,
            "ngroups": ngroups, "headdim": int(rng.integers(1, 5)), "d_state": int(rng.integers(1, 5))}


def _divisibility_want(c):
    if c["kind"] in ("kv_heads", "kv_layers", "kv_half", "mamba_heads", "mamba_groups"):
        return ["ValueError", []]
    if c["what"] == "kv":
        if c["window"] is not None:
            layers = (c["window"][0], c["window"][0] + c["window"][1])
        else:
            n = c["L"] // c["pp"]
            layers = (c["pp_rank"] * n, (c["pp_rank"] + 1) * n)
        h = c["H"] // c["tp"]
        return ["ok", [layers[0], layers[1], c["tp_rank"] * h, (c["tp_rank"] + 1) * h, layers[1] - layers[0], h]]
    nh, ng = c["nheads"] // c["tp"], c["ngroups"] // c["tp"]
    di = nh * c["headdim"]
    return ["ok", [nh, ng, di, di + 2 * ng * c["d_state"]]]


def test_layouts_reject_indivisible_shapes():
    rng = fresh()
    kinds = ["kv_heads", "kv_layers", "kv_window", "kv_half", "kv_ok", "mamba_heads", "mamba_groups", "mamba_ok"]
    kinds = [str(k) for k in rng.permutation(kinds + [str(k) for k in rng.choice(kinds, size=int(rng.integers(2, 6)))])]
    cases = [_kv_case(rng, k) if k.startswith("kv") else _mamba_case(rng, k) for k in kinds]
    out = run(DIVISIBILITY_DRIVER, {"cases": cases})
    assert len(out["outcomes"]) == len(cases), f"{len(out['outcomes'])} outcomes for {len(cases)} cases"
    for c, got in zip(cases, out["outcomes"]):
        want = _divisibility_want(c)
        assert got == want, f"{c}: {got}, want {want}"


PLAIN_DRIVER = """
import dataclasses
from megatron.core.inference.disaggregation.kv_reshard import KVShardLayout, plan_kv_reshard
from megatron.core.inference.disaggregation.mamba_reshard import (
    MambaShardLayout, MambaStateDims, plan_mamba_reshard)

def try_set(obj, field, value):
    try:
        setattr(obj, field, value)
    except (dataclasses.FrozenInstanceError, AttributeError):
        pass

def kv_layout(t):
    g, tp, tr, pp, pr, ep, er, etp, xr, start, n = t
    return KVShardLayout(ARGS["L"], ARGS["H"], tp, tr, pp, pr, g, ep_size=ep, ep_rank=er,
                         etp_size=etp, etp_rank=xr)

def m_layout(t, dims):
    g, tp, tr, start, n = t
    return MambaShardLayout(global_rank=g, tp_size=tp, tp_rank=tr, layer_start=start, num_layers=n, dims=dims)

KV_FIELDS = ("src_rank", "dst_rank", "global_layer_lo", "global_layer_hi", "global_head_lo", "global_head_hi")
M_FIELDS = ("src_rank", "dst_rank", "band", "global_layer", "src_layer", "dst_layer", "src_lo", "src_hi", "dst_lo", "dst_hi")

srcs = [kv_layout(t) for t in ARGS["kv_srcs"]]
dsts = [kv_layout(t) for t in ARGS["kv_dsts"]]
kv1 = plan_kv_reshard(srcs, dsts)
kv2 = plan_kv_reshard([srcs[i] for i in ARGS["kv_order"]], list(dsts))
dims = MambaStateDims(**ARGS["dims"])
ms = [m_layout(t, dims) for t in ARGS["m_srcs"]]
md = [m_layout(t, ARGS["dims"]) for t in ARGS["m_dsts"]]   # dims as a plain dict
m1 = plan_mamba_reshard(ms, md)
m2 = plan_mamba_reshard([ms[i] for i in ARGS["m_order"]], list(md))

def keyed(plan, other):
    try:
        index = {t: i for i, t in enumerate(plan)}
        return [len(index), len(set(plan) | set(other)), sorted(index[t] for t in other if t in index)]
    except TypeError:
        return None

res = {"kv_keyed": keyed(kv1, kv2), "m_keyed": keyed(m1, m2)}
try:
    res["layouts_distinct"] = len(set(srcs + [kv_layout(t) for t in ARGS["kv_srcs"]] + ms + md + [dims]))
except TypeError:
    res["layouts_distinct"] = -1
res["roundtrip"] = [[MambaShardLayout(**dataclasses.asdict(l)) == l, dataclasses.asdict(MambaShardLayout(**dataclasses.asdict(l)))]
                    for l in md]
# Try to overwrite a drawn field of every value with a drawn number, then report the values.
for t in kv1:
    try_set(t, KV_FIELDS[ARGS["kv_field"]], ARGS["junk"])
for t in m1:
    try_set(t, M_FIELDS[ARGS["m_field"]], ARGS["junk"])
try_set(srcs[0], "tp_rank", ARGS["junk"])
try_set(ms[0], "tp_rank", ARGS["junk"])
try_set(dims, "nheads", ARGS["junk"])
res["kv"] = sorted([getattr(t, f) for f in KV_FIELDS] for t in kv1)
res["m"] = sorted([getattr(t, f) for f in M_FIELDS] + [bool(t.is_conv)] for t in m1)
res["after"] = [srcs[0].tp_rank, ms[0].tp_rank, dims.nheads, ms[0].nheads]
emit(**res)
"""


def test_layouts_and_transfers_are_plain_values():
    rng = fresh()
    L, H = int(rng.choice([4, 6, 8, 12])), int(rng.choice([4, 8]))
    # Sources without replicas: which replica sends is the other probes' concern.
    kv_srcs = _kv_instance(rng, L, H, 0, False, replicated=False)
    kv_dsts = _kv_instance(rng, L, H, 1000, False)
    dims, _, m_srcs, m_dsts = _mamba_draw(rng, replicated=False)
    junk = int(rng.integers(10 ** 6, 10 ** 7))
    args = {"L": L, "H": H, "kv_srcs": kv_srcs, "kv_dsts": kv_dsts,
            "kv_order": [int(i) for i in rng.permutation(len(kv_srcs))],
            "dims": dims, "m_srcs": m_srcs, "m_dsts": m_dsts,
            "m_order": [int(i) for i in rng.permutation(len(m_srcs))],
            "kv_field": int(rng.integers(0, 6)), "m_field": int(rng.choice([0, 1, 3, 4, 5, 6, 7, 8, 9])),
            "junk": junk}
    out = run(PLAIN_DRIVER, args)
    kv_plan = _kv_plan(kv_srcs, kv_dsts, L, H)
    m_plan = _mamba_plan(dims, m_srcs, m_dsts)
    for name, plan in (("KV", kv_plan), ("Mamba", m_plan)):
        key = "kv_keyed" if name == "KV" else "m_keyed"
        assert out[key] is not None, f"{name} transfers cannot be dictionary keys (unhashable)"
        want = [len(plan), len(plan), list(range(len(plan)))]
        assert out[key] == want, (
            f"{name} plans as dictionary keys and sets: {out[key]}, want {want} (the same plan computed "
            f"from reordered sources must hold equal, equally hashing transfers)")
    assert out["kv"] == kv_plan, \
        f"KV transfers after an attempt to overwrite a field: {out['kv']}, want the plan {kv_plan} (frozen)"
    assert out["m"] == m_plan, \
        f"Mamba transfers after an attempt to overwrite a field: {out['m']}, want the plan {m_plan} (frozen)"
    n_layouts = len(kv_srcs) + len(m_srcs) + len(m_dsts) + 1
    assert out["layouts_distinct"] == n_layouts, \
        f"{out['layouts_distinct']} distinct layouts in a set, want {n_layouts} (hashable, compared by value)"
    want_rt = [[True, {"global_rank": g, "tp_size": tp, "tp_rank": tr, "layer_start": start, "num_layers": n,
                       "dims": dims}] for g, tp, tr, start, n in m_dsts]
    assert out["roundtrip"] == want_rt, \
        f"MambaShardLayout(**asdict(layout)) == layout, and its fields: {out['roundtrip']}, want {want_rt}"
    want_after = [kv_srcs[0][2], m_srcs[0][2], dims["nheads"], dims["nheads"]]
    assert out["after"] == want_after, \
        f"layout and dims fields after an attempt to overwrite them: {out['after']}, want {want_after} (frozen)"
