"""Hidden probes for megatron-0004 (KV / Mamba-state reshard planners).

The judge never imports megatron: each probe builds layouts and plans in a child process, gets
the plan back as plain tuples, and replays it here on numpy arrays built from the judge's own
idea of who owns what."""

import numpy as np

from infradev_probe import run

# ---------------------------------------------------------------------------------------------
# KV: a source instance whose replicas are listed largest-rank first, and in scrambled order.
# ---------------------------------------------------------------------------------------------

KV_LAYERS, KV_HEADS = 12, 8


def _kv_sources():
    """(global_rank, tp, tp_rank, pp, pp_rank, ep, ep_rank) for a TP2 x PP2 x EP2 prefill
    instance. Within each attention shard the first-listed replica has the larger rank."""
    out = []
    ranks = iter([7, 3, 6, 0, 5, 2, 4, 1])
    for pp_rank in range(2):
        for tp_rank in range(2):
            for ep_rank in range(2):
                out.append((next(ranks), 2, tp_rank, 2, pp_rank, 2, ep_rank))
    order = [5, 0, 3, 6, 1, 7, 2, 4]
    return [out[i] for i in order]


def _kv_dests():
    """A TP4 x PP3 decode instance whose ranks carry an EP2 replica each (24 ranks from 100)."""
    out = []
    rank = 100
    for pp_rank in range(3):
        for tp_rank in range(4):
            for ep_rank in range(2):
                out.append((rank, 4, tp_rank, 3, pp_rank, 2, ep_rank))
                rank += 1
    return out


def _kv_ranges(tp, tp_rank, pp, pp_rank):
    lp, hp = KV_LAYERS // pp, KV_HEADS // tp
    return (pp_rank * lp, (pp_rank + 1) * lp), (tp_rank * hp, (tp_rank + 1) * hp)


def test_kv_each_shard_is_sent_once_by_its_smallest_replica():
    srcs, dsts = _kv_sources(), _kv_dests()
    out = run("""
        from megatron.core.inference.disaggregation.kv_reshard import KVShardLayout, plan_kv_reshard

        def mk(t):
            g, tp, tr, pp, pr, ep, er = t
            return KVShardLayout(ARGS["L"], ARGS["H"], tp, tr, pp, pr, g, ep_size=ep, ep_rank=er)

        srcs = [mk(t) for t in ARGS["srcs"]]
        dsts = [mk(t) for t in ARGS["dsts"]]
        by_src = {s.global_rank: s for s in srcs}
        by_dst = {d.global_rank: d for d in dsts}
        plan = plan_kv_reshard(srcs, dsts)
        rows = []
        for t in plan:
            s, d = by_src[t.src_rank], by_dst[t.dst_rank]
            sl, sh = t.src_layer_slice(s), t.src_head_slice(s)
            dl, dh = t.dst_layer_slice(d), t.dst_head_slice(d)
            rows.append([t.src_rank, t.dst_rank, t.global_layer_lo, t.global_layer_hi,
                         t.global_head_lo, t.global_head_hi,
                         sl.start, sl.stop, sh.start, sh.stop, dl.start, dl.stop, dh.start, dh.stop])
        emit(plan=rows, local=[[d.global_rank, d.local_num_layers(), d.local_num_heads()] for d in dsts])
    """, {"srcs": srcs, "dsts": dsts, "L": KV_LAYERS, "H": KV_HEADS})

    src_info = {t[0]: t for t in srcs}
    smallest = {}
    for g, tp, tr, pp, pr, _, _ in srcs:
        smallest[(tr, pr)] = min(g, smallest.get((tr, pr), g))
    glob = (np.arange(KV_LAYERS)[:, None] * 1000 + np.arange(KV_HEADS)[None, :]).astype(np.int64)

    bufs, want = {}, {}
    for g, tp, tr, pp, pr, _, _ in dsts:
        (l0, l1), (h0, h1) = _kv_ranges(tp, tr, pp, pr)
        bufs[g] = np.full((l1 - l0, h1 - h0), -1, np.int64)
        want[g] = glob[l0:l1, h0:h1]
    for g, nl, nh in out["local"]:
        assert (nl, nh) == want[g].shape, f"dst {g}: local shape {(nl, nh)}, want {want[g].shape}"

    pairs = set()
    written = 0
    for row in out["plan"]:
        s, d, llo, lhi, hlo, hhi = row[:6]
        sl = row[6:10]
        assert s in src_info, f"transfer from unknown source rank {s}"
        _, tp, tr, pp, pr, _, _ = src_info[s]
        assert s == smallest[(tr, pr)], (
            f"shard (tp_rank={tr}, pp_rank={pr}) is sent by rank {s}, not by its smallest replica "
            f"{smallest[(tr, pr)]}")
        assert (s, d) not in pairs, f"two transfers for the pair ({s}, {d})"
        pairs.add((s, d))
        (sl0, sl1), (sh0, sh1) = _kv_ranges(tp, tr, pp, pr)
        assert sl0 <= llo < lhi <= sl1 and sh0 <= hlo < hhi <= sh1, f"transfer {row} outside its source"
        assert sl == [llo - sl0, lhi - sl0, hlo - sh0, hhi - sh0], f"source slices of {row}"
        _, dtp, dtr, dpp, dpr, _, _ = next(t for t in dsts if t[0] == d)
        (dl0, _), (dh0, _) = _kv_ranges(dtp, dtr, dpp, dpr)
        dst_sl = [llo - dl0, lhi - dl0, hlo - dh0, hhi - dh0]
        assert row[10:] == dst_sl, f"destination slices of {row}"
        src_block = glob[sl0:sl1, sh0:sh1][llo - sl0:lhi - sl0, hlo - sh0:hhi - sh0]
        bufs[d][dst_sl[0]:dst_sl[1], dst_sl[2]:dst_sl[3]] = src_block
        written += src_block.size
    for g in bufs:
        np.testing.assert_array_equal(bufs[g], want[g], err_msg=f"destination rank {g}")
    assert written == sum(w.size for w in want.values()), "some KV entries were sent more than once"


# ---------------------------------------------------------------------------------------------
# Mamba: uneven layer windows, TP 4 -> 2 with several groups per rank, scrambled replicas.
# ---------------------------------------------------------------------------------------------

NH, HD, DS, NG, DC, ML = 8, 2, 3, 4, 2, 5  # nheads, headdim, d_state, ngroups, d_conv, layers
D_INNER = NH * HD
GBAND = NG * DS
CONV = D_INNER + 2 * GBAND


def _mamba_sources():
    """(global_rank, tp, tp_rank, layer_start, num_layers): TP4, windows [0,3) and [3,5),
    every shard held by two replicas listed largest-rank first, then shuffled."""
    out = []
    rank = 0
    for start, n in ((0, 3), (3, 2)):
        for tr in range(4):
            out.append((rank + 1, 4, tr, start, n))
            out.append((rank, 4, tr, start, n))
            rank += 2
    order = [9, 2, 14, 0, 7, 11, 4, 1, 15, 6, 12, 3, 10, 5, 13, 8]
    return [out[i] for i in order]


def _mamba_dests():
    """TP2, windows [0,1) and [1,5)."""
    return [(40, 2, 0, 0, 1), (41, 2, 1, 0, 1), (42, 2, 0, 1, 4), (43, 2, 1, 1, 4)]


def _mamba_shard(conv_g, ssm_g, tp, tr, start, n):
    di, gb, nh = D_INNER // tp, GBAND // tp, NH // tp
    x = conv_g[start:start + n, tr * di:(tr + 1) * di]
    b = conv_g[start:start + n, D_INNER + tr * gb:D_INNER + (tr + 1) * gb]
    c = conv_g[start:start + n, D_INNER + GBAND + tr * gb:D_INNER + GBAND + (tr + 1) * gb]
    return np.concatenate([x, b, c], axis=1), ssm_g[start:start + n, tr * nh:(tr + 1) * nh]


def test_mamba_each_shard_is_sent_once_by_its_smallest_replica():
    srcs, dsts = _mamba_sources(), _mamba_dests()
    out = run("""
        from megatron.core.inference.disaggregation.mamba_reshard import (
            MambaShardLayout, MambaStateDims, plan_mamba_reshard)

        dims = MambaStateDims(nheads=ARGS["dims"][0], headdim=ARGS["dims"][1], d_state=ARGS["dims"][2],
                              ngroups=ARGS["dims"][3], d_conv=ARGS["dims"][4])

        def mk(t):
            g, tp, tr, start, n = t
            return MambaShardLayout(global_rank=g, tp_size=tp, tp_rank=tr, layer_start=start,
                                    num_layers=n, dims=dims)

        dsts = [mk(t) for t in ARGS["dsts"]]
        plan = plan_mamba_reshard([mk(t) for t in ARGS["srcs"]], dsts)
        emit(plan=[[t.src_rank, t.dst_rank, t.band, t.global_layer, t.src_layer, t.dst_layer,
                    t.src_lo, t.src_hi, t.dst_lo, t.dst_hi, bool(t.is_conv)] for t in plan],
             local=[[d.global_rank, d.conv_dim_local, d.nheads_local] for d in dsts])
    """, {"srcs": srcs, "dsts": dsts, "dims": [NH, HD, DS, NG, DC]})

    conv_g = np.arange(ML * CONV * DC, dtype=np.int64).reshape(ML, CONV, DC)
    ssm_g = np.arange(ML * NH * HD * DS, dtype=np.int64).reshape(ML, NH, HD, DS) + 10 ** 6
    src_info = {t[0]: t for t in srcs}
    smallest = {}
    for g, _, tr, start, _ in srcs:
        smallest[(tr, start)] = min(g, smallest.get((tr, start), g))
    src_state = {g: _mamba_shard(conv_g, ssm_g, tp, tr, s, n) for g, tp, tr, s, n in srcs}
    want = {g: _mamba_shard(conv_g, ssm_g, tp, tr, s, n) for g, tp, tr, s, n in dsts}
    got = {g: (np.full_like(c, -1), np.full_like(m, -1)) for g, (c, m) in want.items()}
    for g, conv_dim, nh in out["local"]:
        assert (conv_dim, nh) == (want[g][0].shape[1], want[g][1].shape[1]), f"dst {g} local dims"

    seen = set()
    written = 0
    for row in out["plan"]:
        s, d, band, layer, sl, dl, slo, shi, dlo, dhi, is_conv = row
        _, _, tr, start, _ = src_info[s]
        assert s == smallest[(tr, start)], (
            f"shard (tp_rank={tr}, layer_start={start}) is sent by rank {s}, not by its smallest "
            f"replica {smallest[(tr, start)]}")
        assert is_conv == (band != "ssm"), f"is_conv of a {band} transfer"
        key = (s, d, band, layer)
        assert key not in seen, f"duplicate transfer {key}"
        seen.add(key)
        idx = 0 if is_conv else 1
        block = src_state[s][idx][sl, slo:shi]
        got[d][idx][dl, dlo:dhi] = block
        written += block.size
    for g in want:
        np.testing.assert_array_equal(got[g][0], want[g][0], err_msg=f"conv state of dst {g}")
        np.testing.assert_array_equal(got[g][1], want[g][1], err_msg=f"ssm state of dst {g}")
    assert written == sum(c.size + m.size for c, m in want.values()), "state sent more than once"


# ---------------------------------------------------------------------------------------------
# Contracts: mismatched models, empty sides, divisibility, plain values.
# ---------------------------------------------------------------------------------------------

def test_kv_plan_rejects_layouts_of_different_models():
    out = run("""
        from megatron.core.inference.disaggregation.kv_reshard import KVShardLayout, plan_kv_reshard

        def outcome(srcs, dsts):
            try:
                return ["ok", len(plan_kv_reshard(srcs, dsts))]
            except Exception as e:
                return [type(e).__name__, [c.__name__ for c in type(e).__mro__]]

        src = [KVShardLayout(12, 8, 2, r, 1, 0, r) for r in range(2)]
        emit(heads=outcome(src, [KVShardLayout(12, 4, 1, 0, 1, 0, 9)]),
             layers=outcome(src, [KVShardLayout(6, 8, 1, 0, 1, 0, 9)]),
             no_dsts=outcome(src, []),
             no_srcs=outcome([], [KVShardLayout(12, 8, 1, 0, 1, 0, 9)]))
    """)
    for case in ("heads", "layers"):
        kind, detail = out[case]
        assert kind != "ok", f"planning between models with different {case} did not raise"
        assert "ValueError" in detail, f"different {case}: raised {kind}, not a ValueError"
    assert out["no_dsts"] == ["ok", 0], f"empty destinations: {out['no_dsts']}"
    assert out["no_srcs"] == ["ok", 0], f"empty sources: {out['no_srcs']}"


def test_layouts_reject_indivisible_shapes():
    out = run("""
        from megatron.core.inference.disaggregation.kv_reshard import KVShardLayout
        from megatron.core.inference.disaggregation.mamba_reshard import MambaShardLayout, MambaStateDims

        def outcome(fn):
            try:
                fn()
                return "ok"
            except Exception as e:
                return "ValueError" if isinstance(e, ValueError) else type(e).__name__

        def mamba(nheads, ngroups, tp):
            dims = MambaStateDims(nheads=nheads, headdim=2, d_state=2, ngroups=ngroups, d_conv=2)
            return MambaShardLayout(global_rank=0, tp_size=tp, tp_rank=0, layer_start=0,
                                    num_layers=1, dims=dims)

        emit(
            kv_heads=outcome(lambda: KVShardLayout(12, 6, 4, 0, 1, 0, 0)),
            kv_layers=outcome(lambda: KVShardLayout(10, 8, 1, 0, 4, 0, 0)),
            kv_window=outcome(lambda: KVShardLayout(10, 8, 1, 0, 4, 3, 0, layer_start=9, num_local_layers=1)),
            kv_ok=outcome(lambda: KVShardLayout(12, 8, 4, 3, 3, 2, 0)),
            mamba_heads=outcome(lambda: mamba(6, 4, 4)),
            mamba_groups=outcome(lambda: mamba(8, 2, 4)),
            mamba_ok=outcome(lambda: mamba(8, 4, 4)),
        )
    """)
    assert out["kv_heads"] == "ValueError", f"KV heads 6 over TP 4: {out['kv_heads']}"
    assert out["kv_layers"] == "ValueError", f"KV layers 10 over PP 4 without a window: {out['kv_layers']}"
    assert out["kv_window"] == "ok", f"explicit uneven window: {out['kv_window']}"
    assert out["kv_ok"] == "ok", f"a valid KV layout: {out['kv_ok']}"
    assert out["mamba_heads"] == "ValueError", f"Mamba nheads 6 over TP 4: {out['mamba_heads']}"
    assert out["mamba_groups"] == "ValueError", f"Mamba ngroups 2 over TP 4: {out['mamba_groups']}"
    assert out["mamba_ok"] == "ok", f"a valid Mamba layout: {out['mamba_ok']}"


def test_layouts_and_transfers_are_plain_values():
    out = run("""
        import dataclasses
        from megatron.core.inference.disaggregation.kv_reshard import KVShardLayout, plan_kv_reshard
        from megatron.core.inference.disaggregation.mamba_reshard import (
            MambaShardLayout, MambaStateDims, plan_mamba_reshard)

        def frozen(obj, field):
            try:
                setattr(obj, field, 99)
                return False
            except (dataclasses.FrozenInstanceError, AttributeError):
                return True

        def hashes(values):
            try:
                return len({v: i for i, v in enumerate(values)})
            except TypeError:
                return -1

        srcs = [KVShardLayout(8, 4, 2, r, 1, 0, r) for r in range(2)]
        dsts = [KVShardLayout(8, 4, 1, 0, 2, p, 10 + p) for p in range(2)]
        kv1, kv2 = plan_kv_reshard(srcs, dsts), plan_kv_reshard(list(srcs), list(dsts))
        dims = MambaStateDims(nheads=4, headdim=2, d_state=2, ngroups=2, d_conv=2)
        ms = [MambaShardLayout(global_rank=r, tp_size=2, tp_rank=r, layer_start=0, num_layers=2, dims=dims) for r in range(2)]
        md = [MambaShardLayout(global_rank=5, tp_size=1, tp_rank=0, layer_start=0, num_layers=2, dims=dims)]
        m1, m2 = plan_mamba_reshard(ms, md), plan_mamba_reshard(list(ms), list(md))
        emit(
            kv_len=len(kv1), kv_distinct=hashes(kv1), kv_equal=kv1 == kv2,
            kv_same_hash=[hash(a) == hash(b) for a, b in zip(kv1, kv2)] if hashes(kv1) >= 0 else [],
            m_len=len(m1), m_distinct=hashes(m1), m_equal=m1 == m2,
            layouts_hash=hashes(srcs + dsts + ms + md + [dims]),
            frozen=[frozen(srcs[0], "tp_rank"), frozen(kv1[0], "src_rank"), frozen(ms[0], "tp_rank"),
                    frozen(m1[0], "src_lo"), frozen(dims, "nheads")],
        )
    """)
    assert out["kv_len"] > 0 and out["m_len"] > 0
    assert out["frozen"] == [True] * 5, f"assignable fields (layout, kv transfer, mamba layout, mamba transfer, dims): {out['frozen']}"
    assert out["kv_distinct"] == out["kv_len"], f"KV transfers are not hashable values ({out['kv_distinct']})"
    assert out["m_distinct"] == out["m_len"], f"Mamba transfers are not hashable values ({out['m_distinct']})"
    assert out["layouts_hash"] == 8, f"layouts are not hashable values ({out['layouts_hash']})"
    assert out["kv_equal"] and out["m_equal"], "equal plans do not compare equal"
    assert all(out["kv_same_hash"]) and out["kv_same_hash"], "equal transfers hash differently"
