"""Hidden probes for minitron-0002 (bucketed gradient all-reduce).

The judge (this module) never imports minitron. Two ranks run in the child, but their links
go through the judge (an oracle): every all-reduce message is seen, counted and checked here
against the buckets the instruction defines, over gradients the judge draws fresh. So the
traffic is the judge's figure, not the ranks' own counters."""

import collections

import numpy as np

from infradev_probe import fresh, reference, run, same

class Wire:
    """The judge's side of the ranks' links: every message passes through here, so the
    traffic is counted by the judge, not by the code under test."""

    def __init__(self):
        self.boxes = collections.defaultdict(collections.deque)
        self.log = []  # (src, dst, array) in the order sent

    def __call__(self, op, *args):
        if op == "send":
            src, dst, array = int(args[0]), int(args[1]), args[2]
            if not isinstance(array, np.ndarray):
                raise ValueError("a message is an array")
            self.boxes[(src, dst)].append(array)
            self.log.append((src, dst, array))
            return None
        if op == "recv":
            dst, src = int(args[0]), int(args[1])
            box = self.boxes[(src, dst)]
            return box.popleft() if box else None
        raise ValueError("unknown operation")

    def sent_by(self, rank):
        return [a for s, _, a in self.log if s == rank]


# Prepended to a driver: minitron's process groups send and receive through the judge (the
# pipes launch() makes are never handed to them).
WIRED = """
import time
import numpy as np
import minitron.comm as _comm

_init = _comm.ProcessGroup.__init__

def _wired_init(self, rank, world_size, conns):
    _init(self, rank, world_size, {})

def _send(self, array, dst):
    array = np.ascontiguousarray(array)
    self.bytes_sent += array.nbytes
    self.messages_sent += 1
    ORACLE("send", self.rank, int(dst), array)

def _recv(self, src):
    while True:
        got = ORACLE("recv", self.rank, int(src))
        if got is not None:
            return got
        time.sleep(0.0005)

_comm.ProcessGroup.__init__, _comm.ProcessGroup.send, _comm.ProcessGroup.recv = _wired_init, _send, _recv
"""


def _shapes(d_in, d_h, d_out):
    """MLP(d_in, d_h, d_out)'s parameters on one tensor-parallel rank, in named_parameters() order."""
    return {"fc1.bias": (d_h,), "fc1.weight": (d_in, d_h), "fc2.bias": (d_out,), "fc2.weight": (d_h, d_out)}


def _buckets(sizes, bucket):
    """The instruction's packing: in order, at most `bucket` bytes each, an oversized gradient alone."""
    if not bucket:
        return [[n] for n in sizes]
    out, cur, used = [], [], 0
    for name, nbytes in sizes.items():
        if cur and used + nbytes > bucket:
            out.append(cur)
            cur, used = [], 0
        cur.append(name)
        used += nbytes
    if cur:
        out.append(cur)
    return out


_ALLREDUCE = WIRED + """
from minitron.comm import ProcessGroup, launch
from minitron.model import MLP
from minitron.train import allreduce_gradients

def rank(group, args):
    m = MLP(*args["dims"], ProcessGroup(0, 1, {}), seed=0)
    for name, _, g in m.named_parameters():
        g[...] = args["grads"][group.rank][name]
    allreduce_gradients(m, group, bucket_size_bytes=args["bucket"])
    return {"names": [n for n, _, _ in m.named_parameters()],
            "grads": {n: np.array(g) for n, _, g in m.named_parameters()}}

emit(ranks=launch(rank, 2, ARGS))
"""


def _check_allreduce(rng, bucket_of):
    dims = [int(x) for x in rng.integers(2, 12, size=3)]
    shapes = _shapes(*dims)
    grads = [{n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()} for _ in range(2)]
    sizes = {n: int(np.prod(s)) * 4 for n, s in shapes.items()}
    bucket = bucket_of(sizes)
    wire = Wire()
    out = run(_ALLREDUCE, {"dims": dims, "grads": grads, "bucket": bucket}, oracle=wire)
    plan = _buckets(sizes, bucket)
    for r, got in enumerate(out["ranks"]):
        assert got["names"] == list(shapes), f"rank {r}: parameters {got['names']}"
        mean = {n: (grads[0][n] + grads[1][n]) / 2 for n in shapes}
        same(got["grads"], mean, rtol=1e-6, atol=1e-7, path=f"rank {r}: averaged gradients")
        sent = wire.sent_by(r)
        assert len(sent) == len(plan), f"rank {r} sent {len(sent)} messages, want {len(plan)} (one per bucket)"
        for i, (msg, names) in enumerate(zip(sent, plan)):
            want = np.concatenate([grads[r][n].ravel() for n in names])
            assert msg.dtype == np.float32 and msg.size == want.size, \
                f"rank {r}, bucket {i}: {msg.dtype} x {msg.size}, want float32 x {want.size} ({names})"
            np.testing.assert_array_equal(msg.ravel(), want, err_msg=f"rank {r}, bucket {i}: not its gradients")


def test_one_bucket_is_one_message_of_the_gradients_bytes():
    rng = fresh()
    _check_allreduce(rng, lambda sizes: sum(sizes.values()) + int(rng.integers(0, 1 << 16)))


def test_without_buckets_and_with_tiny_buckets_each_gradient_goes_alone():
    rng = fresh()
    _check_allreduce(rng, lambda sizes: None)
    _check_allreduce(rng, lambda sizes: int(rng.integers(1, min(sizes.values()) + 1)))
    # A limit that falls between gradients: some buckets hold several.
    _check_allreduce(rng, lambda sizes: int(rng.integers(max(sizes.values()), sum(sizes.values()))))


_TRAIN = WIRED + """
from minitron.comm import ProcessGroup, launch
from minitron.model import MLP
from minitron.optimizer import SGD
from minitron.train import train_steps

def rank(group, args):
    m = MLP(*args["dims"], ProcessGroup(0, 1, {}), seed=args["seed"])
    train_steps(m, SGD(m, lr=0.05), args["steps"], group=group, seed=args["seed"], bucket_size_bytes=args["bucket"])
    return {n: np.array(p) for n, p, _ in m.named_parameters()}

emit(ranks=launch(rank, 2, ARGS))
"""


def test_train_steps_uses_the_buckets():
    rng = fresh()
    dims = [8, int(rng.integers(2, 24)), 4]  # train_steps' batches: 8 features in, 4 out
    sizes = {n: int(np.prod(s)) * 4 for n, s in _shapes(*dims).items()}
    # fc1's bias and weight share the first bucket, fc2's weight is in another.
    first_two = sizes["fc1.bias"] + sizes["fc1.weight"]
    args = {"dims": dims, "steps": int(rng.integers(1, 4)), "seed": int(rng.integers(1 << 20)),
            "bucket": int(rng.integers(first_two, sum(sizes.values())))}
    wire, gold = Wire(), Wire()
    got = run(_TRAIN, args, oracle=wire)
    want = reference(_TRAIN, args, oracle=gold)
    same(got, want, rtol=1e-6, atol=1e-7)
    plan = _buckets(sizes, args["bucket"])
    for r in range(2):
        sent = [m.nbytes for m in wire.sent_by(r)]
        want_sizes = [sum(sizes[n] for n in names) for names in plan] * args["steps"]
        assert sent == want_sizes, f"rank {r} sent messages of {sent} bytes, want {want_sizes} (the buckets, each step)"
