"""Hidden probes for vllm-0003 (prefix-caching-aware scheduling of V0 prefills).

The judge never imports vllm. Every probe draws its scenario fresh (block sizes, pool sizes,
chain lengths, shared prefixes, token ids, chunk sizes, token budgets, which prompts repeat or
extend which, how many steps run), drives the block allocators, the V0 block manager or the V0
scheduler in a child process and checks what comes back: lookups and cached-token counts
against what the judge computes from the instruction's contract, scheduler traces against the
same driver over the gold tree (``reference``) on the same inputs."""

from infradev_probe import fresh, reference, run, same

# Reference children run as a user with no passwd entry; torch asks getpass for a user name
# when vllm is imported, which then needs one in the environment.
_ENV = {"USER": "probe", "LOGNAME": "probe"}

_LOOKUP = r"""
from vllm.core.block.cpu_gpu_block_allocator import CpuGpuBlockAllocator
from vllm.core.block.prefix_caching_block import PrefixCachingBlockAllocator
from vllm.utils import Device

bs = ARGS["block_size"]


def chain(tokens, allocate):
    blocks, prev = [], None
    for i in range(0, len(tokens), bs):
        prev = allocate(prev, tokens[i:i + bs])
        blocks.append(prev)
    return blocks


def positions(found, hashes):
    # Where each returned value sits in the queried list (-1: not one of the given hashes).
    if type(found) is not list:
        return "not a list: " + type(found).__name__
    return [hashes.index(v) if v in hashes else -1 for v in found]


r = {}
a = PrefixCachingBlockAllocator(num_blocks=ARGS["num_blocks"], block_size=bs)
new = lambda prev, toks: a.allocate_immutable_block(prev_block=prev, token_ids=toks)
blocks_a = chain(ARGS["a"], new)
a.mark_blocks_as_computed([])
ha = [b.content_hash for b in blocks_a]
# B shares A's first blocks; its own blocks are allocated but not computed yet.
blocks_b = chain(ARGS["b"], new)
hb = [b.content_hash for b in blocks_b]
free = []
r["a_part"] = positions(a.find_cached_blocks_prefix(ha[:ARGS["qa"]]), ha)
r["b_uncomputed"] = positions(a.find_cached_blocks_prefix(hb), hb)
free.append(a.get_num_free_blocks())
for blk in blocks_a:
    a.free(blk)
free.append(a.get_num_free_blocks())
r["a_after_free"] = positions(a.find_cached_blocks_prefix(ha), ha)
r["a_prefix_after_free"] = positions(a.find_cached_blocks_prefix(ha[:ARGS["qb"]]), ha)
r["unknown"] = positions(a.find_cached_blocks_prefix([int(x) for x in ARGS["unknown"]]), ha)
free.append(a.get_num_free_blocks())
a.mark_blocks_as_computed([])
r["b_computed"] = positions(a.find_cached_blocks_prefix(hb), hb)
# Fresh chains take the never-used blocks, then evict A's unshared tail from its end.
chain(list(range(500000, 500000 + bs * ARGS["take"])), new)
a.mark_blocks_as_computed([])
free.append(a.get_num_free_blocks())
r["a_after_some_eviction"] = positions(a.find_cached_blocks_prefix(ha), ha)
chain(list(range(600000, 600000 + bs * a.get_num_free_blocks())), new)
a.mark_blocks_as_computed([])
free.append(a.get_num_free_blocks())
r["a_after_eviction"] = positions(a.find_cached_blocks_prefix(ha), ha)
r["free"] = free

dev = CpuGpuBlockAllocator.create(allocator_type="prefix_caching",
                                  num_gpu_blocks=ARGS["gpu_blocks"],
                                  num_cpu_blocks=ARGS["cpu_blocks"], block_size=bs)
hd = [b.content_hash for b in chain(
    ARGS["d"], lambda prev, toks: dev.allocate_immutable_block(prev, toks, device=Device.GPU))]
dev.mark_blocks_as_computed([])
# The same tokens on the CPU allocator: cached there, never computed.
chain(ARGS["d"], lambda prev, toks: dev.allocate_immutable_block(prev, toks, device=Device.CPU))
r["device_default"] = positions(dev.find_cached_blocks_prefix(hd[:ARGS["qd"]]), hd)
r["device_gpu"] = positions(dev.find_cached_blocks_prefix(hd, Device.GPU), hd)
r["device_cpu"] = positions(dev.find_cached_blocks_prefix(hd, Device.CPU), hd)
naive = CpuGpuBlockAllocator.create(allocator_type="naive", num_gpu_blocks=ARGS["gpu_blocks"],
                                    num_cpu_blocks=ARGS["cpu_blocks"], block_size=bs)
chain(ARGS["d"], lambda prev, toks: naive.allocate_immutable_block(prev, toks, device=Device.GPU))
r["naive"] = positions(naive.find_cached_blocks_prefix(hd), hd)
emit(**r)
"""

_SEQ = r"""
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus
from vllm.inputs import token_inputs


def group(seq_id, tokens, block_size):
    seq = Sequence(seq_id, inputs=token_inputs([int(t) for t in tokens]), block_size=block_size)
    g = SequenceGroup(request_id=str(seq_id), seqs=[seq], arrival_time=0.0,
                      sampling_params=SamplingParams(max_tokens=1000))
    return seq, g


def append(seq, token):
    seq.append_token_id(int(token), {int(token): Logprob(0.0)})
"""

_TRACKING = _SEQ + r"""
from vllm.core.block_manager import SelfAttnBlockSpaceManager

bs = ARGS["block_size"]
bm = SelfAttnBlockSpaceManager(block_size=bs, num_gpu_blocks=ARGS["num_blocks"],
                               num_cpu_blocks=8, watermark=0, enable_caching=True)
r = {}


def admit(seq, g, chunk):
    # What the scheduler does for a waiting prompt: ask, allocate, run a chunk.
    n = bm.get_num_cached_tokens(seq)
    bm.allocate(g)
    seq.status = SequenceStatus.RUNNING
    bm.mark_blocks_as_computed(g, chunk)
    g.update_num_computed_tokens(chunk)
    return n


s1, g1 = group(1, ARGS["s1"], bs)
r["s1_first"] = admit(s1, g1, len(ARGS["s1"]))
r["s1_computed"] = s1.get_num_computed_tokens()
for t in ARGS["s1_decode"]:
    append(s1, t)
r["s1_decode"] = bm.get_num_cached_tokens(s1)

s2, g2 = group(2, ARGS["s2"], bs)
r["s2_first"] = bm.get_num_cached_tokens(s2)
bm.free(s1)
# A copy of S2's prompt runs: S2's blocks are all cached now, but S2 is still in prefill.
s7, g7 = group(7, ARGS["s2"], bs)
admit(s7, g7, len(ARGS["s2"]))
r["s2_again"] = bm.get_num_cached_tokens(s2)

# S3: one chunk of its prefill runs, then it is preempted by recompute.
s3, g3 = group(3, ARGS["s3"], bs)
r["s3_first"] = admit(s3, g3, ARGS["s3_chunk"])
r["s3_prefill_again"] = bm.get_num_cached_tokens(s3)
bm.free(s3)
s3.status = SequenceStatus.WAITING
s3.reset_state_for_recompute()
r["s3_after_recompute"] = bm.get_num_cached_tokens(s3)

# S2 finishes; its id comes back with other tokens (as a recomputed request would).
admit(s2, g2, len(ARGS["s2"]))
bm.free(s2)
s2b, g2b = group(2, ARGS["s2b"], bs)
r["reused_id"] = bm.get_num_cached_tokens(s2b)

off = SelfAttnBlockSpaceManager(block_size=bs, num_gpu_blocks=ARGS["num_blocks"],
                                num_cpu_blocks=8, watermark=0, enable_caching=False)
s4, g4 = group(4, ARGS["s1"], bs)
r["no_caching_first"] = off.get_num_cached_tokens(s4)
off.allocate(g4)
s4.status = SequenceStatus.RUNNING
off.mark_blocks_as_computed(g4, len(ARGS["s1"]))
g4.update_num_computed_tokens(len(ARGS["s1"]))
s5, g5 = group(5, ARGS["s1"], bs)
r["no_caching_shared"] = off.get_num_cached_tokens(s5)
emit(**r)
"""

_SCHED = _SEQ + r"""
from vllm.config import CacheConfig, SchedulerConfig
from vllm.core.scheduler import Scheduler


def make_scheduler(c):
    sc = SchedulerConfig(max_num_batched_tokens=c["budget"], max_num_seqs=8,
                         max_model_len=c["max_len"], enable_chunked_prefill=c["chunked"])
    cc = CacheConfig(c["block_size"], 1.0, 1, "auto", is_attention_free=c["attention_free"],
                     enable_prefix_caching=c["caching"])
    cc.num_cpu_blocks = 16
    cc.num_gpu_blocks = c["gpu_blocks"]
    return Scheduler(sc, cc, None)


def step(s, add, token):
    for seq_id, tokens in add:
        s.add_seq_group(group(seq_id, tokens, s.cache_config.block_size)[1])
    metas, out, _ = s.schedule()
    nblocks = {m.request_id: len(m.computed_block_nums or []) for m in metas}
    row = {
        "scheduled": [[x.seq_group.request_id, int(x.token_chunk_size),
                       nblocks.get(x.seq_group.request_id, -1)]
                      for x in out.scheduled_seq_groups],
        "num_batched_tokens": int(out.num_batched_tokens),
    }
    # What the engine does after the model ran.
    for x in out.scheduled_seq_groups:
        x.seq_group.update_num_computed_tokens(x.token_chunk_size)
        for seq in x.seq_group.get_seqs():
            if not seq.is_prefill():
                append(seq, token)
    return row


traces = {}
for name, c in ARGS["configs"].items():
    s = make_scheduler(c)
    traces[name] = [step(s, add, token) for add, token in zip(c["steps"], c["tokens"])]
    if c["attention_free"]:
        traces[name + "_manager"] = type(s.block_manager).__name__
emit(**traces)
"""


def _tokens(rng, n, lo=0, hi=30000):
    return [int(t) for t in rng.integers(lo, hi, size=n)]


def test_find_cached_blocks_prefix_contract():
    rng = fresh()
    bs = int(rng.integers(1, 9))
    n_a = int(rng.integers(3, 11))
    k = int(rng.integers(1, n_a))       # blocks B shares with A
    m = int(rng.integers(1, 6))         # B's own blocks
    num_blocks = n_a + m + int(rng.integers(2, 16))
    a = _tokens(rng, n_a * bs)
    b = a[:k * bs] + _tokens(rng, m * bs, 30000, 60000)
    hashless = num_blocks - n_a - m
    evicted = int(rng.integers(1, n_a - k + 1))
    args = {
        "block_size": bs, "num_blocks": num_blocks, "a": a, "b": b,
        "qa": int(rng.integers(1, n_a + 1)), "qb": int(rng.integers(1, n_a + 1)),
        "unknown": [int(x) for x in rng.integers(1, 1 << 62, size=int(rng.integers(1, 5)))],
        "take": hashless + evicted,
        "gpu_blocks": 0, "cpu_blocks": 0, "d": [], "qd": 0,
    }
    n_d = int(rng.integers(1, 9))
    args.update(gpu_blocks=n_d + int(rng.integers(1, 8)), cpu_blocks=n_d + int(rng.integers(1, 8)),
                d=_tokens(rng, n_d * bs, 60000, 90000), qd=int(rng.integers(1, n_d + 1)))
    r = run(_LOOKUP, args)
    where = (f"block size {bs}, {num_blocks} blocks: A is {n_a} computed blocks, B shares A's first "
             f"{k} and holds {m} uncomputed blocks of its own")
    want = {
        "a_part": list(range(args["qa"])),
        "b_uncomputed": list(range(k)),
        "a_after_free": list(range(n_a)),          # freed (evictable) computed blocks count
        "a_prefix_after_free": list(range(args["qb"])),
        "unknown": [],
        "b_computed": list(range(k + m)),
        "a_after_some_eviction": list(range(n_a - evicted)),
        "a_after_eviction": list(range(k)),        # A's unshared tail is gone; B holds its head
        "device_default": list(range(args["qd"])),
        "device_gpu": list(range(n_d)),
        "device_cpu": [],
        "naive": [],
    }
    for key, w in want.items():
        assert r[key] == w, (
            f"{where}: {key}: positions {r[key]} of the queried hashes, want {w} (the result is the "
            f"leading hashes themselves whose blocks are cached and computed)")
    # Lookups change no free count: the counts are those of the allocations and frees alone.
    want_free = [hashless, hashless + n_a - k, hashless + n_a - k, n_a - k - evicted, 0]
    assert r["free"] == want_free, f"{where}: free blocks {r['free']} along the scenario, want {want_free}"


def test_cached_token_count_follows_each_sequence():
    rng = fresh()
    bs = int(rng.integers(2, 9))
    n1 = int(rng.integers(2 * bs, 6 * bs + 1))
    s1 = _tokens(rng, n1)
    k = int(rng.integers(1, n1 // bs + 1))
    s2 = s1[:k * bs] + _tokens(rng, int(rng.integers(bs + 1, 4 * bs)), 30000, 40000)
    n3 = int(rng.integers(2 * bs, 6 * bs + 1))
    s3 = _tokens(rng, n3, 40000, 50000)
    j = int(rng.choice([x for x in range(0, n3 // bs + 1) if x != k]))
    s2b = s3[:j * bs] + _tokens(rng, int(rng.integers(1, 3 * bs)), 50000, 60000)
    args = {"block_size": bs, "num_blocks": int(rng.integers(64, 129)), "s1": s1,
            "s1_decode": _tokens(rng, int(rng.integers(1, 2 * bs + 1)), 60000, 70000),
            "s2": s2, "s3": s3, "s3_chunk": int(rng.integers(1, n3)), "s2b": s2b}
    r = run(_TRACKING, args)
    want = {
        "s1_first": 0,                       # nothing cached yet
        "s1_computed": n1,
        "s1_decode": n1 // bs * bs,          # full computed blocks only; recomputed in decode
        "s2_first": k * bs,                  # S2 shares S1's first k blocks
        "s2_again": k * bs,                  # still in prefill: the first answer stands
        "s3_first": 0,
        "s3_prefill_again": 0,               # one chunk ran, still in prefill: unchanged
        "s3_after_recompute": n3 // bs * bs,  # preempted and freed: its computed blocks are cached
        "reused_id": j * bs,                 # a freed id carries nothing over to new tokens
        "no_caching_first": 0,
        "no_caching_shared": 0,
    }
    where = (f"block size {bs}: S1 {n1} tokens, S2 {len(s2)} sharing {k} blocks, S3 {n3} tokens "
             f"with a first chunk of {args['s3_chunk']}, id 2 reused for {len(s2b)} tokens sharing "
             f"{j} blocks of S3")
    bad = [f"{key}: got {r.get(key)}, want {v}" for key, v in want.items() if r.get(key) != v]
    assert not bad, where + ":\n" + "\n".join(bad)


def _budget_configs(rng):
    """Three schedulers over random prompts: prefix caching with and without chunking, and the
    same unchunked scenario without prefix caching."""
    bs = int(rng.choice([2, 4, 8]))
    kb = int(rng.integers(max(3, -(-8 // bs)), 7))
    budget = bs * kb
    steps_n = int(rng.integers(6, 10))
    next_id = [1]

    def new_id():
        next_id[0] += 1
        return next_id[0]

    def scenario(max_len, binding):
        prompts, steps = [], [[] for _ in range(steps_n)]
        # Step 1: one prompt of whole blocks, alone.
        p0 = _tokens(rng, bs * int(rng.integers(1, min(kb, max_len // bs) + 1)))
        prompts.append(p0)
        steps[0].append([new_id(), p0])
        start = 1
        if binding:
            # Step 2: an exact copy of it (fully cached: costs 1) and a fresh prompt as long as the
            # budget, which must not fit beside it.
            steps[1] += [[new_id(), list(p0)], [new_id(), _tokens(rng, budget, 30000, 40000)]]
            start = 2
        for s in range(start, steps_n):
            for _ in range(int(rng.integers(0, 3))):
                how = int(rng.integers(3))
                base = prompts[int(rng.integers(len(prompts)))]
                if how == 0:
                    p = _tokens(rng, int(rng.integers(1, max_len + 1)), 40000, 60000)
                elif how == 1:
                    p = list(base)
                else:
                    keep = bs * int(rng.integers(0, len(base) // bs + 1))
                    p = base[:keep] + _tokens(rng, int(rng.integers(1, max(2, max_len - keep + 1))), 60000, 80000)
                p = p[:max_len]
                prompts.append(p)
                steps[s].append([new_id(), p])
        return steps

    def config(chunked, caching, max_len, steps):
        return {"block_size": bs, "budget": budget, "max_len": max_len, "chunked": chunked,
                "caching": caching, "attention_free": False,
                "gpu_blocks": 9 * (-(-(max_len + steps_n + 2) // bs)) + int(rng.integers(8, 32)),
                "steps": steps, "tokens": _tokens(rng, steps_n, 90000, 100000)}

    plain_steps = scenario(budget, True)
    long_len = budget * int(rng.integers(2, 5))
    return {
        "caching": config(False, True, budget, plain_steps),
        "plain": config(False, False, budget, plain_steps),
        "chunked": config(True, True, long_len, scenario(long_len, False)),
    }


def test_prefills_admitted_by_uncached_tokens():
    rng = fresh()
    args = {"configs": _budget_configs(rng)}
    got = run(_SCHED, args)
    want = reference(_SCHED, args, env=_ENV)
    for name in ("caching", "plain", "chunked"):
        c = args["configs"][name]
        assert len(got[name]) == len(c["steps"]), f"{name}: one row per step"
        for i, (g, w) in enumerate(zip(got[name], want[name])):
            assert g == w, (
                f"{name} (block size {c['block_size']}, budget {c['budget']}, max_model_len "
                f"{c['max_len']}) step {i + 1}, adding prompts of "
                f"{[len(p) for _, p in c['steps'][i]]} tokens: scheduled {g}, want {w} "
                f"([request, token_chunk_size, computed blocks] and num_batched_tokens)")
    same(got, want)


def test_attention_free_scheduler_runs():
    rng = fresh()
    bs = int(rng.choice([4, 8, 16]))
    max_len = int(rng.integers(32, 129))
    n_steps = int(rng.integers(2, 6))
    steps, sid = [], 1
    for s in range(n_steps):
        add = []
        for _ in range(int(rng.integers(1 if s == 0 else 0, 4))):
            add.append([sid, _tokens(rng, int(rng.integers(1, max_len + 1)))])
            sid += 1
        steps.append(add)
    args = {"configs": {"free": {
        "block_size": bs, "budget": max_len * 4, "max_len": max_len, "chunked": False,
        "caching": False, "attention_free": True, "gpu_blocks": 64, "steps": steps,
        "tokens": _tokens(rng, n_steps, 90000, 100000)}}}
    got = run(_SCHED, args)
    assert got["free_manager"] == "PlaceholderBlockSpaceManager", got["free_manager"]
    want = reference(_SCHED, args, env=_ENV)
    assert got["free"] == want["free"], (
        f"attention-free scheduler over prompts {[[len(p) for _, p in a] for a in steps]}: "
        f"scheduled {got['free']}, want {want['free']}")
    # The first step admits every first prompt whole (nothing is cached for such a model).
    assert got["free"][0]["scheduled"] == [[str(i), len(p), 0] for i, p in steps[0]], got["free"][0]
