"""Process groups simulated with OS processes and pipes.

``launch(fn, world_size)`` runs ``fn(group, *args)`` on ``world_size`` processes and returns
their results in rank order. Every collective counts the bytes each rank sends, so callers can
see how much traffic a change costs (``group.bytes_sent``).
"""

import multiprocessing as mp
import traceback

import numpy as np


class ProcessGroup:
    """One rank's view of a group of ranks connected pairwise by pipes."""

    def __init__(self, rank, world_size, conns):
        self.rank = rank
        self.world_size = world_size
        self._conns = conns  # peer rank -> Connection
        self.bytes_sent = 0
        self.messages_sent = 0

    def send(self, array, dst):
        array = np.ascontiguousarray(array)
        self.bytes_sent += array.nbytes
        self.messages_sent += 1
        self._conns[dst].send(array)

    def recv(self, src):
        return self._conns[src].recv()

    def all_reduce(self, array, op="sum"):
        """Returns the element-wise sum (or mean) of ``array`` over all ranks."""
        if self.world_size == 1:
            out = np.array(array, copy=True)
        else:
            for peer in range(self.world_size):
                if peer != self.rank:
                    self.send(array, peer)
            out = np.array(array, dtype=np.float64, copy=True)
            for peer in range(self.world_size):
                if peer != self.rank:
                    out += self.recv(peer)
            out = out.astype(np.asarray(array).dtype)
        if op == "mean":
            out = out / self.world_size
        elif op != "sum":
            raise ValueError(f"unknown reduce op {op!r}")
        return out

    def all_gather(self, array):
        """Returns the list of every rank's ``array``, in rank order."""
        for peer in range(self.world_size):
            if peer != self.rank:
                self.send(array, peer)
        parts = []
        for peer in range(self.world_size):
            parts.append(np.array(array, copy=True) if peer == self.rank else self.recv(peer))
        return parts

    def broadcast(self, array, src=0):
        """Returns ``array`` as held by rank ``src``."""
        if self.rank == src:
            for peer in range(self.world_size):
                if peer != src:
                    self.send(array, peer)
            return np.array(array, copy=True)
        return self.recv(src)

    def barrier(self):
        self.all_reduce(np.zeros(1))


def _worker(fn, rank, world_size, conns, args, out):
    group = ProcessGroup(rank, world_size, conns)
    try:
        out.send(("ok", fn(group, *args)))
    except BaseException:  # report any failure to the launcher, which re-raises it
        out.send(("error", traceback.format_exc()))


def launch(fn, world_size, *args):
    """Runs ``fn(group, *args)`` on ``world_size`` ranks; returns results in rank order."""
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    if world_size == 1:
        return [fn(ProcessGroup(0, 1, {}), *args)]
    ctx = mp.get_context("fork")
    conns = [dict() for _ in range(world_size)]
    for a in range(world_size):
        for b in range(a + 1, world_size):
            ca, cb = ctx.Pipe()
            conns[a][b], conns[b][a] = ca, cb
    procs, outs = [], []
    for rank in range(world_size):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(fn, rank, world_size, conns[rank], args, child))
        p.start()
        procs.append(p)
        outs.append(parent)
    results = [o.recv() for o in outs]
    for p in procs:
        p.join()
    for rank, (status, value) in enumerate(results):
        if status == "error":
            raise RuntimeError(f"rank {rank} failed:\n{value}")
    return [value for _, value in results]
