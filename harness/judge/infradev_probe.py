"""Out-of-process probes: the judging side.

A probe is a pytest test whose process (the judge) decides pass or fail. The judge never
imports the task's repository: the code under test may rewrite anything in the process that
imports it (assertion helpers, the test runner, the report). So a probe sends a short driver
program to a child process, the child runs the code under test and sends back plain data
(JSON values, numpy arrays as raw bytes), and the judge checks that data.

The child is the submission's too: whatever runs there can rewrite what it sends (wrap
``emit``, write its own result message, send NaN, answer from code it wrote for the probe). So
a probe decides only from what the child cannot fake:

- inputs drawn fresh for every attempt (``fresh``), never written in the probe file, so a
  recorded answer is worthless next time;
- references the judge computes itself, or that a **reference child** computes
  (``reference``): the same driver over the gold tree, in a process that never loads the
  submission and runs as a user the submission's children are not;
- consequences the judge measures (``measure``: its own clock, the kernel's and the driver's
  memory figures).

    from infradev_probe import fresh, reference, run, same

    def test_state_dict_is_a_snapshot():
        rng = fresh()
        args = {"seed": int(rng.integers(1 << 31)), "steps": int(rng.integers(2, 6))}
        got = run(DRIVER, args)          # the submission
        want = reference(DRIVER, args)   # gold, on the same fresh inputs
        same(got, want)

In the driver, ``ARGS`` holds the ``args`` given to ``run`` and ``emit(**values)`` records
values to send back (JSON types, numpy arrays and scalars, torch tensors, bytes, nested in
dicts with string keys and lists). ``run`` returns them as a dict; arrays come back as numpy
arrays. NaN and infinities are refused (``ChildFailed``) unless the call says
``allow_nan=True``: NaN equals NaN under numpy's array comparisons, so a child that sent NaN
everywhere would pass a comparison of two of its own values. If the driver raises, or the child
dies before it finishes, ``run`` raises ``ChildFailed`` (an AssertionError: the probe fails).

The child runs as another user (nobody) that cannot read the probes, their expected values,
the gold tree or the judge's memory; it starts isolated (no user site, neither its working
directory nor the repository on ``sys.path`` until the boot code has imported what it needs,
so a repository module named like a standard-library one cannot replace the boot's), gets a
fresh stdin, inherits only its result pipe, and once its result is in or its time is up it is
killed with every process it started, in its session or not (the judge is their subreaper).
Its output is discarded: what it prints (the driver's source, say) never reaches a log the
submitter sees; a failure says only which exception the child reported. The harness turns
``INFRADEV_PROBE_VERBOSE`` on for task authors (validation), who see the child's output and
tracebacks.

``measure`` runs a driver the same way and also returns the ``Usage`` the judge itself saw
(wall time, host and GPU memory), for probes about resources: see its docstring for what the
figures can and cannot show. ``run(..., repository=False)`` is a reference run that nothing of
any repository can reach, to compare such figures with.

Validation checks that probes decide this way: it records what gold's children sent and
replays it (``INFRADEV_PROBE_FORGE=replay``: a child that sends gold's messages verbatim), and
tries the other forgeries a child can make (``mix``: the code under test's own values with
every scalar taken from gold's recording; ``nan``: every float NaN). A probe that still passes
decides from what the child reports, and is refused. Reference children are never forged.

Loaded as a pytest plugin (``-p infradev_probe``), this module also keeps the judge honest:
it refuses any import that would load a module from the task's repository.
"""

import base64
import collections
import hashlib
import json
import math
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

__all__ = ["run", "measure", "reference", "fresh", "same", "Usage", "ChildFailed", "ChildTimeout",
           "workdir", "repo"]

# The user the code under test runs as: it owns nothing and can read only what is world-readable.
CHILD_UID = 65534
CHILD_GID = 65534
# The user reference children run as: the only one besides the judge that can read the gold
# tree (its folder belongs to this group), and one the submission's children cannot signal.
REF_UID = 65532
REF_GID = 65532
REF_USER = "infradev-reference"
# The most a child may send back.
MAX_RESULT_BYTES = 256 << 20
_ALLOWED_KINDS = "biufc"  # bool, int, uint, float, complex: no object arrays

# What the harness set for this phase (read once: nothing a probe does changes them).
_VERBOSE = os.environ.get("INFRADEV_PROBE_VERBOSE") == "1"
_RECORD = os.environ.get("INFRADEV_PROBE_RECORD") or None
_FORGE = os.environ.get("INFRADEV_PROBE_FORGE") or None
_RECORDED = os.environ.get("INFRADEV_PROBE_RECORDED") or None
FORGERIES = ("replay", "mix", "nan")
if _FORGE is not None and (_FORGE not in FORGERIES or not _RECORDED):
    raise RuntimeError(f"INFRADEV_PROBE_FORGE={_FORGE!r}: want one of {FORGERIES} with INFRADEV_PROBE_RECORDED set")


class ChildFailed(AssertionError):
    """The code under test raised, sent what is not plain data, or its process ended without
    sending a result."""


class ChildTimeout(ChildFailed):
    """The child ran past its time limit and was killed."""


def repo():
    """The task repository's path (where the child runs)."""
    path = os.environ.get("INFRADEV_REPO")
    if not path:
        raise RuntimeError("INFRADEV_REPO is not set: probes run only under the harness")
    return path


def workdir(prefix="probe-"):
    """A fresh directory the child may write to (world-writable, under /tmp)."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(path, 0o1777)
    return path


def fresh():
    """A numpy random Generator seeded from the operating system's entropy when called: draw a
    probe's inputs from it, so that no attempt sees the inputs of another and a recorded answer
    is worth nothing. Pass what the driver needs (sizes, values, a seed for torch) in ``args``."""
    import numpy as np

    return np.random.default_rng(secrets.randbits(128))


def run(code, args=None, *, timeout=300, env=None, repository=True, allow_nan=False, oracle=None):
    """Runs ``code`` in a child process over the task's repository and returns what it emitted.

    ``args`` (JSON values and numpy arrays) is available to the driver as ``ARGS``; ``env``
    adds environment variables. The child is killed after ``timeout`` seconds. With
    ``repository=False`` no repository is on the child's import path or its working directory:
    a reference run (a baseline to compare with) that no code under test can reach; with
    ``repository="reference"`` it is ``reference``. ``allow_nan`` accepts NaN and infinities
    in what comes back.

    ``oracle`` is a function of the judge's that the driver calls as ``ORACLE(*args)``: each
    call goes to the judge, which runs ``oracle(*args)`` and sends back what it returns (plain
    data, as for ``emit``). It is how a probe makes the code under test go through the judge:
    a model whose weights only the judge knows, a transport whose bytes the judge counts. What
    the oracle counts is the judge's own figure; what it is sent is the child's and is checked
    like anything else the child sends. A call the oracle raises on comes back to the child as
    a ``RuntimeError``.
    """
    return _run(code, args, timeout, env, None, repository, allow_nan, oracle)


def reference(code, args=None, *, timeout=300, env=None, allow_nan=False, oracle=None):
    """Runs ``code`` as ``run`` does, over the gold tree instead of the submission: the task's
    repository at its base commit with the gold patch and the official tests applied, read by
    a child that runs as its own user and never loads the submission. Compare what the
    submission's child sends with this, on the same fresh ``args``."""
    return _run(code, args, timeout, env, None, "reference", allow_nan, oracle)


def measure(code, args=None, *, timeout=300, env=None, gpu=False, repository=True, allow_nan=False, oracle=None):
    """Runs ``code`` as ``run`` does and returns ``(values, usage)``: what it emitted, and a
    ``Usage`` of what the judge saw it use, measured from outside the child.

    A figure the child reports about itself (``torch.cuda.max_memory_allocated``, a timer) is
    whatever the code under test makes it: it can reset the counters or replace the functions.
    ``Usage`` comes from the kernel and the driver instead: the judge's own clock, the resident
    memory of every process the child started (summed, sampled every 20 ms, and the main
    process's high-water mark), and with ``gpu=True`` the memory NVML reports used on the GPUs
    the judge was given, sampled every 2 ms, above the level before the child started. Sampled
    peaks miss allocations shorter than the interval, so they bound what stays allocated (a
    caching allocator keeps what it once took), not every transient allocation.
    """
    watch = _Watch(gpu)
    values = _run(code, args, timeout, env, watch, repository, allow_nan, oracle)
    return values, watch.usage()


def same(got, want, *, rtol=0.0, atol=0.0, path="values"):
    """Asserts that ``got`` (what the submission's child sent) equals ``want`` (a reference):
    the same keys, lengths, types, array dtypes and shapes, numbers equal within ``rtol`` and
    ``atol`` (exactly by default). The message names the first place that differs."""
    import numpy as np

    if isinstance(want, dict):
        if not isinstance(got, dict):
            raise AssertionError(f"{path}: got a {type(got).__name__}, want a dict")
        if set(got) != set(want):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            raise AssertionError(f"{path}: keys differ (missing {missing}, unexpected {extra})")
        for k in want:
            same(got[k], want[k], rtol=rtol, atol=atol, path=f"{path}[{k!r}]")
        return
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            raise AssertionError(f"{path}: got {_shape_of(got)}, want a list of {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, rtol=rtol, atol=atol, path=f"{path}[{i}]")
        return
    if isinstance(want, np.ndarray):
        if not isinstance(got, np.ndarray):
            raise AssertionError(f"{path}: got {_shape_of(got)}, want an array")
        if got.shape != want.shape or got.dtype != want.dtype:
            raise AssertionError(f"{path}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}")
        if want.dtype.kind in "fc" and (rtol or atol):
            bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
        else:
            bad = got != want
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(f"{path}: {int(bad.sum())} of {want.size} elements differ, first at {list(where)}")
        return
    if isinstance(want, bool) or want is None or isinstance(want, (str, bytes)):
        if type(got) is not type(want) or got != want:
            raise AssertionError(f"{path}: got {_shape_of(got)} that differs from the reference's {type(want).__name__}")
        return
    if isinstance(want, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise AssertionError(f"{path}: got {_shape_of(got)}, want a number")
        if not math.isclose(got, want, rel_tol=rtol, abs_tol=atol) and got != want:
            raise AssertionError(f"{path}: the number differs from the reference's")
        return
    raise TypeError(f"{path}: cannot compare a reference of type {type(want).__name__}")


def _shape_of(v):
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None and isinstance(v, np.ndarray):
        return f"an array {v.dtype}{list(v.shape)}"
    if isinstance(v, (list, tuple)):
        return f"a list of {len(v)}"
    return f"a {type(v).__name__}"


def _run(code, args, timeout, env, watch, repository, allow_nan, oracle=None):
    code = textwrap.dedent(code)
    forge = _FORGE if repository is True else None  # reference children are the judge's own
    key = _next_key() if repository is True and (_RECORD or forge) else None
    recorded = _recorded(key) if forge else None
    payload = {"code": code, "args": _encode(args or {})}
    if forge == "replay":
        # A child that sends gold's message for this call verbatim, whatever the inputs are.
        payload = {"code": "", "args": {}, "replay": base64.b64encode(recorded or b"").decode()}
    data, status = _exchange(json.dumps(payload).encode(), timeout, env, watch, repository, oracle)
    if key is not None and _RECORD and data is not None:
        _record(key, data)
    if forge in ("mix", "nan"):
        data = _forged(forge, data, recorded)
    if data is None:
        raise ChildFailed(f"the child exited {status} without sending a result")
    return _result(data, allow_nan)


def _exchange(payload, timeout, env, watch, repository, oracle=None):
    """Starts a child, hands it payload, serves its oracle calls, and returns (the message it
    sent, or None; its exit status as words). Raises ChildTimeout or ChildFailed for a child
    that ran out of time or sent an oversized or broken message."""
    child_env = _child_env(env)
    pythonpath = child_env.pop("PYTHONPATH")
    cwd = repo()
    kwargs = {}
    as_root = os.geteuid() == 0
    home = ""
    if repository == "reference":
        cwd = _reference_root()
        pythonpath = os.environ.get("INFRADEV_REFERENCE_PYTHONPATH") or cwd
        # A home of its own, which the child makes (the judge may not give files away) under
        # a name nobody can guess: nothing the submission's children left in /tmp is in it.
        home = f"/tmp/infradev-ref-{secrets.token_hex(16)}"
        # The reference user has no passwd entry: name it, as getpass (and torch's caches,
        # built from the user's name) look for it.
        child_env.update(HOME=home, TMPDIR=home, USER=REF_USER, LOGNAME=REF_USER)
        if as_root:
            kwargs.update(user=REF_UID, group=REF_GID, extra_groups=[])
    else:
        if repository is False:
            pythonpath, cwd = "", "/"
        if as_root:
            kwargs.update(user=CHILD_UID, group=CHILD_GID, extra_groups=[])
    quiet = None if _VERBOSE else subprocess.DEVNULL
    fds = []  # the judge's ends, then the child's
    read_fd, write_fd = os.pipe()
    fds += [read_fd, write_fd]
    ask_r = ask_w = answer_r = answer_w = -1
    if oracle is not None:
        ask_r, ask_w = os.pipe()
        answer_r, answer_w = os.pipe()
        fds += [ask_r, ask_w, answer_r, answer_w]
    child_fds = [f for f in (write_fd, ask_w, answer_r) if f >= 0]
    for f in child_fds:
        os.set_inheritable(f, True)
    try:
        # -s -P: no user site, and neither the working directory nor (PYTHONPATH is not set)
        # the repository on sys.path while the interpreter and the boot code start.
        proc = subprocess.Popen(
            [sys.executable, "-s", "-P", "-c", _BOOT, str(write_fd), pythonpath, str(ask_w), str(answer_r), home],
            stdin=subprocess.PIPE,
            stdout=quiet,
            stderr=quiet,
            cwd=cwd,
            env=child_env,
            pass_fds=tuple(child_fds),
            start_new_session=True,
            **kwargs,
        )
    except BaseException:
        for f in fds:
            os.close(f)
        raise
    for f in child_fds:
        os.close(f)
    mine = [f for f in fds if f not in child_fds]
    if watch is not None:
        watch.start(proc.pid)
    deadline = time.monotonic() + timeout
    data, timed_out = None, False
    try:
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except OSError:
            pass
        data, timed_out = _serve(read_fd, ask_r, answer_w, oracle, deadline, proc)
        if watch is not None:
            watch.received()
        if not timed_out:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        for f in mine:
            os.close(f)
        if watch is not None:
            watch.stop()
        _kill(proc)
    if timed_out:
        raise ChildTimeout(f"the code under test ran past {timeout}s and was killed")
    status = _status(proc.returncode)
    if data is None:
        return None, status
    if data is _BROKEN:
        raise ChildFailed(f"the child exited {status} in the middle of sending its result")
    return data, status


_BROKEN = object()


class _Framed:
    """Length-prefixed messages (8 bytes, big-endian, then the bytes) read off a pipe."""

    def __init__(self, fd, limit):
        self.fd, self.limit, self.buf, self.eof = fd, limit, bytearray(), False

    def feed(self):
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            self.eof = True
        self.buf += chunk

    def message(self):
        """The next whole message, or None."""
        if len(self.buf) < 8:
            return None
        size = int.from_bytes(self.buf[:8], "big")
        if size > self.limit:
            raise ChildFailed(f"the child sent a message of {size} bytes, over {self.limit}")
        if len(self.buf) < 8 + size:
            return None
        msg = bytes(self.buf[8:8 + size])
        del self.buf[:8 + size]
        return msg


def _serve(read_fd, ask_r, answer_w, oracle, deadline, proc):
    """Waits for the child's result, answering its oracle calls meanwhile. Returns (result
    bytes, or None when the child sent none, or _BROKEN for half a result; timed out).

    The result is a length and that many bytes: processes the child leaves behind may hold the
    pipe open, so the end of the result is not the end of the pipe."""
    result = _Framed(read_fd, MAX_RESULT_BYTES)
    asks = _Framed(ask_r, MAX_RESULT_BYTES) if oracle is not None else None
    while True:
        got = result.message()
        if got is not None:
            return got, False
        if result.eof:
            return (_BROKEN if result.buf else None), False
        left = deadline - time.monotonic()
        if left <= 0:
            return None, True
        watched = [read_fd] + ([ask_r] if asks is not None and not asks.eof else [])
        ready, _, _ = select.select(watched, [], [], min(left, 0.5))
        if not ready:
            if proc.poll() is not None and not select.select(watched, [], [], 0)[0]:
                return (_BROKEN if result.buf else None), False
            continue
        if read_fd in ready:
            result.feed()
        if asks is not None and ask_r in ready:
            asks.feed()
            while (call := asks.message()) is not None:
                reply = _answer(oracle, call)
                try:
                    _write_all(answer_w, len(reply).to_bytes(8, "big") + reply)
                except OSError:
                    pass  # the child stopped listening


def _answer(oracle, call):
    """The judge's answer to one oracle call: what oracle returns for the call's arguments, or
    the reason it refused them (a call the judge cannot decode or will not answer)."""
    try:
        args = _decode(json.loads(call, parse_constant=_refuse_constant))
        if not isinstance(args, list):
            raise ValueError("an oracle call is a list of arguments")
        return json.dumps({"ok": True, "value": _encode(oracle(*args))}).encode()
    except Exception as e:  # noqa: BLE001 - the reason goes back to the child, not into the verdict
        return json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}).encode()


def _refuse_constant(name):
    raise ValueError(f"{name} is not accepted")


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _reference_root():
    path = os.environ.get("INFRADEV_REFERENCE")
    if not path:
        raise RuntimeError("INFRADEV_REFERENCE is not set: this phase has no gold tree to run a reference child over")
    return path


# Recording and forging (validation only). A probe's calls are numbered in the order it makes
# them; the same probe makes the same calls on other inputs, so gold's n-th message is what a
# forger would send for the n-th call.
_calls = collections.Counter()


def _current_test():
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def _next_key():
    test = _current_test()
    n = _calls[test]
    _calls[test] += 1
    return hashlib.sha256(test.encode()).hexdigest()[:32], n, test


def _record(key, data):
    folder = os.path.join(_RECORD, key[0])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "test"), "w") as f:
        f.write(key[2])
    tmp = os.path.join(folder, f".{key[1]}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(folder, str(key[1])))


def _recorded(key):
    try:
        with open(os.path.join(_RECORDED, key[0], str(key[1])), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _forged(forge, data, recorded):
    """What a forging child would have sent: ``mix`` keeps the code under test's own values
    and takes every scalar from gold's recording (a child that answers from the base code and
    fakes its counters), falling back to gold's whole message where the code under test raised;
    ``nan`` turns every float into NaN."""
    mine = _loads(data)
    gold = _loads(recorded)
    if not (isinstance(mine, dict) and mine.get("ok") is True):
        mine = gold
    elif forge == "mix" and isinstance(gold, dict) and gold.get("ok") is True:
        mine = {"ok": True, "values": _mix(mine.get("values"), gold.get("values"))}
    if mine is None:
        return data
    if forge == "nan":
        mine = _nan(mine)
    return json.dumps(mine).encode()


def _loads(data):
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _is_wrapped(v):
    return isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("__nd__", "__bytes__")


def _mix(mine, gold):
    if isinstance(mine, dict) and isinstance(gold, dict) and not _is_wrapped(mine) and not _is_wrapped(gold):
        out = {k: _mix(v, gold[k]) if k in gold else v for k, v in mine.items()}
        out.update({k: v for k, v in gold.items() if k not in out})
        return out
    if isinstance(mine, list) and isinstance(gold, list) and len(mine) == len(gold):
        return [_mix(a, b) for a, b in zip(mine, gold)]
    scalar = (bool, int, float, str, type(None))
    if isinstance(mine, scalar) and isinstance(gold, scalar):
        return gold
    return mine


def _nan(v):
    if isinstance(v, dict) and set(v) == {"__nd__"}:
        try:
            import numpy as np

            dt, shape, _ = v["__nd__"]
            dtype = np.dtype(dt)
            if dtype.kind in "fc":
                arr = np.full(tuple(shape), np.nan, dtype=dtype)
                return {"__nd__": [dt, shape, base64.b64encode(arr.tobytes()).decode()]}
        except (TypeError, ValueError, ImportError):
            pass
        return v
    if isinstance(v, dict):
        return {k: _nan(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_nan(x) for x in v]
    if isinstance(v, float):
        return float("nan")
    return v


class Usage(collections.namedtuple("Usage", "wall_seconds host_peak_bytes gpu_peak_bytes samples")):
    """What the judge saw a child use (see ``measure``): ``wall_seconds`` from its start to its
    result, ``host_peak_bytes``, ``gpu_peak_bytes`` (None when not asked for) and the number of
    ``samples`` taken."""

    __slots__ = ()

    def __str__(self):
        gpu = "not measured" if self.gpu_peak_bytes is None else f"{self.gpu_peak_bytes / 2**20:.1f} MiB"
        return (f"wall {self.wall_seconds:.2f}s, host peak {self.host_peak_bytes / 2**20:.1f} MiB, "
                f"GPU peak {gpu} ({self.samples} samples)")


class _Watch:
    """Samples a child's memory from the judge's side of the process boundary."""

    GPU_INTERVAL = 0.002
    HOST_INTERVAL = 0.02

    def __init__(self, gpu):
        import threading

        self._gpu = _Nvml() if gpu else None
        self._idle = self._gpu.used() if self._gpu else 0
        self._host_peak = self._gpu_peak = self._samples = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="infradev-probe-watch", daemon=True)
        self._pid = None
        self._began = self._ended = None

    def start(self, pid):
        self._pid = pid
        self._began = time.monotonic()
        self._sample(host=True)
        self._thread.start()

    def received(self):
        if self._ended is None:
            self._ended = time.monotonic()

    def stop(self):
        self.received()
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def usage(self):
        wall = (self._ended or time.monotonic()) - (self._began or time.monotonic())
        return Usage(wall, self._host_peak, self._gpu_peak if self._gpu else None, self._samples)

    def _loop(self):
        interval = self.GPU_INTERVAL if self._gpu else self.HOST_INTERVAL
        every = max(1, round(self.HOST_INTERVAL / interval))
        n = 0
        while not self._stopped.wait(interval):
            n += 1
            self._sample(host=n % every == 0)

    def _sample(self, host):
        self._samples += 1
        if self._gpu is not None:
            used = self._gpu.used()
            if used > self._idle:
                self._gpu_peak = max(self._gpu_peak, used - self._idle)
        if host:
            self._host_peak = max(self._host_peak, _descendants_rss(), _high_water(self._pid))


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _processes():
    """{pid: (ppid, resident bytes)} for every process /proc shows."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone, or not ours to read
        # pid (comm) state ppid ... ; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2:].split()
        try:
            table[int(name)] = (int(fields[1]), int(fields[21]) * _PAGE)
        except (IndexError, ValueError):
            continue
    return table


def _descendants(table=None):
    """The judge's descendants: every process its children started, wherever they went (the
    judge is their subreaper, so even a daemonized one stays below it)."""
    table = _processes() if table is None else table
    kids = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [os.getpid()]
    while todo:
        for c in kids.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def _descendants_rss():
    table = _processes()
    return sum(table[p][1] for p in _descendants(table))


def _high_water(pid):
    """The kernel's high-water mark of pid's resident memory (VmHWM), in bytes; 0 once it exits."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class _Nvml:
    """Used memory on the GPUs given to the judge (NVIDIA_VISIBLE_DEVICES' NVML indices when it
    names them, else every GPU whose memory NVML reports), through the driver's NVML library."""

    def __init__(self):
        import ctypes

        class Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                        ("used", ctypes.c_ulonglong)]

        path = os.environ.get("INFRADEV_NVML_LIBRARY") or "libnvidia-ml.so.1"
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise RuntimeError(f"the judge cannot measure GPU memory: NVML ({path}) does not load: {e}") from None
        lib.nvmlDeviceGetHandleByIndex_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        lib.nvmlDeviceGetMemoryInfo.argtypes = [ctypes.c_void_p, ctypes.POINTER(Memory)]
        rc = lib.nvmlInit_v2()
        if rc != 0:
            raise RuntimeError(f"the judge cannot measure GPU memory: nvmlInit_v2 returned {rc}")
        count = ctypes.c_uint()
        rc = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if rc != 0:
            raise RuntimeError(f"the judge cannot measure GPU memory: nvmlDeviceGetCount_v2 returned {rc}")
        self._lib, self._mem, self._ctypes = lib, Memory(), ctypes
        visible = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
        wanted = range(count.value)
        if visible and all(x.strip().isdigit() for x in visible.split(",")):
            wanted = [int(x) for x in visible.split(",")]
        self._handles = []
        for i in wanted:
            h = ctypes.c_void_p()
            if i < count.value and lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0 \
                    and lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(self._mem)) == 0:
                self._handles.append(h)
        if not self._handles:
            raise RuntimeError(f"the judge cannot measure GPU memory: NVML reads none of GPUs {list(wanted)}")

    def used(self):
        total = 0
        for h in self._handles:
            if self._lib.nvmlDeviceGetMemoryInfo(h, self._ctypes.byref(self._mem)) == 0:
                total += self._mem.used
        return total


def _child_env(extra):
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("INFRADEV_") or k.startswith("PYTEST_") or k in _JUDGE_ONLY)}
    env.update({
        # Not the child interpreter's own PYTHONPATH: the boot code puts it on sys.path, and in
        # the environment for what the child starts, once it has imported what it needs.
        "PYTHONPATH": os.environ.get("INFRADEV_CHILD_PYTHONPATH") or repo(),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTHONHASHSEED": env.get("PYTHONHASHSEED", "0"),
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
    })
    env.update({str(k): str(v) for k, v in (extra or {}).items()})
    return env


_JUDGE_ONLY = {"PYTHONPATH", "PYTHONSAFEPATH", "PYTHONSTARTUP"}


def _kill(proc):
    """Kills the child and everything it started, in its session or not."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    _sweep()


def _sweep():
    """Kills every process the judge's children left behind. A process that left the child's
    session (setsid, a double fork) is still the judge's descendant: the judge is a subreaper.
    Nothing of one child outlives it to touch the next one's files, ports or memory."""
    deadline, pause = time.monotonic() + SWEEP_TIMEOUT, 0.005
    while True:
        left = _descendants()
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the judge could not end the processes a child left behind "
                               f"within {SWEEP_TIMEOUT}s: {sorted(left)}")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in left:  # the orphans among them are the judge's own children now
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(pause)  # a process tearing down a GPU context takes a while to go
        pause = min(pause * 2, 0.2)


# How long processes a child left behind may take to exit once killed.
SWEEP_TIMEOUT = 60


def _become_subreaper():
    """Orphans of the judge's children are reparented to the judge, not to init."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    except (OSError, AttributeError) as e:
        raise RuntimeError(f"the judge cannot keep track of its children's processes: {e}") from None


_become_subreaper()


def _result(data, allow_nan=False):
    def constant(name):
        if not allow_nan:
            raise ChildFailed(f"the child sent {name}, which this probe does not accept")
        return float(name)

    try:
        msg = json.loads(data, parse_constant=constant)
    except ValueError as e:
        raise ChildFailed(f"the child sent something that is not JSON: {e}") from None
    if not isinstance(msg, dict) or msg.get("ok") not in (True, False):
        raise ChildFailed("the child sent a malformed result")
    if not msg["ok"]:
        raise ChildFailed("the code under test raised " + _failure(msg.get("error"), msg.get("type")))
    values = _decode(msg.get("values"), allow_nan)
    if not isinstance(values, dict):
        raise ChildFailed("the child sent a malformed result")
    return values


def _failure(error, kind):
    """What a failure message may say of the child's traceback. Its text is the child's: it
    could carry the driver's source or the probe's inputs to the run folder, where the next
    submission's author reads it. So only the exception's name is shown, unless the harness
    runs the probes for their authors."""
    text = str(error or "")
    if _VERBOSE:
        return ":\n" + text[:20000]
    name = kind if isinstance(kind, str) else ""
    if not (0 < len(name) <= 64 and all(p.isidentifier() for p in name.split("."))):
        name = "an exception"
    return name + " (the child's traceback is shown to the task's authors only)"


def _status(code):
    if code is None:
        return "(still running)"
    if code < 0:
        return f"on signal {-code}"
    return str(code)


def _encode(v):
    """Encodes the judge's args for the child (the same format the child uses for results)."""
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None and isinstance(v, np.ndarray):
        return {"__nd__": [v.dtype.str, list(v.shape), base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()]}
    if np is not None and isinstance(v, np.generic):
        return v.item()
    if isinstance(v, dict):
        return {str(k): _encode(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_encode(x) for x in v]
    if isinstance(v, bytes):
        return {"__bytes__": base64.b64encode(v).decode()}
    return v


def _decode(v, allow_nan=False):
    if isinstance(v, list):
        return [_decode(x, allow_nan) for x in v]
    if not isinstance(v, dict):
        return v
    if set(v) == {"__nd__"}:
        return _array(v["__nd__"], allow_nan)
    if set(v) == {"__bytes__"}:
        return base64.b64decode(v["__bytes__"], validate=True)
    return {k: _decode(x, allow_nan) for k, x in v.items()}


def _array(spec, allow_nan=False):
    import numpy as np

    try:
        dtype_str, shape, b64 = spec
        dtype = np.dtype(dtype_str)
        shape = tuple(int(n) for n in shape)
        raw = base64.b64decode(b64, validate=True)
    except (TypeError, ValueError) as e:
        raise ChildFailed(f"the child sent a malformed array: {e}") from None
    if dtype.kind not in _ALLOWED_KINDS or dtype.hasobject:
        raise ChildFailed(f"the child sent an array of dtype {dtype}, which is not plain data")
    count = 1
    for n in shape:
        if n < 0:
            raise ChildFailed("the child sent an array with a negative dimension")
        count *= n
    if count * dtype.itemsize != len(raw):
        raise ChildFailed("the child sent an array whose bytes do not match its shape")
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if dtype.kind in "fc" and not allow_nan and not np.isfinite(arr).all():
        raise ChildFailed("the child sent an array holding NaN or infinities, which this probe does not accept")
    return arr


# Driver code for probes whose scenario needs several ranks (one process per GPU, or per CPU
# rank with cuda=False): prepend it to the driver (``run(RANKS_PRELUDE + DRIVER, ...)``) and call
# ``spawn_ranks(world, fn, payload, timeout)``. Each rank is forked from the driver (which must
# not have touched CUDA), gets the usual RANK/WORLD_SIZE/MASTER_* variables and, with cuda=True,
# its own device, and runs ``fn(rank, world, port, payload)``; the values come back in rank
# order. A rank that raises, dies or hangs fails the whole scenario with the rank named.
RANKS_PRELUDE = r"""
import multiprocessing as _rk_mp
import os as _rk_os
import queue as _rk_queue
import socket as _rk_socket
import time as _rk_time
import traceback as _rk_traceback


def free_port():
    s = _rk_socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _rank_entry(rank, world, port, fn, payload, q, cuda):
    try:
        _rk_os.environ.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        })
        if cuda:
            import torch
            if torch.cuda.device_count() < world:
                raise RuntimeError("this probe needs %d GPUs, %d visible" % (world, torch.cuda.device_count()))
            torch.cuda.set_device(rank)
        value = fn(rank, world, port, payload)
        q.put((rank, True, value))
    except BaseException:
        q.put((rank, False, _rk_traceback.format_exc()))
    q.close()
    q.join_thread()
    _rk_os._exit(0)


def spawn_ranks(world, fn, payload, timeout, *, cuda=True):
    ctx = _rk_mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_entry, args=(r, world, port, fn, payload, q, cuda), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    deadline = _rk_time.monotonic() + timeout
    try:
        while len(got) < world:
            left = deadline - _rk_time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world)) - set(got))
                raise TimeoutError("ranks %s did not finish within %ss" % (missing, timeout))
            try:
                rank, ok, value = q.get(timeout=min(left, 5.0))
            except _rk_queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in got and not p.is_alive()]
                if not dead:
                    continue
                try:
                    rank, ok, value = q.get(timeout=5.0)
                except _rk_queue.Empty:
                    raise RuntimeError("ranks %s died without a result (exit codes %s)"
                                       % (dead, [procs[r].exitcode for r in dead])) from None
            if not ok:
                raise RuntimeError("rank %d raised:\n%s" % (rank, value))
            got[rank] = value
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)
    return [got[r] for r in range(world)]
"""


# The child's side: read the driver and its args from stdin, run it, send the emitted values
# (or the traceback) through the result pipe. It runs inside the code under test's process, so
# nothing here is trusted: the judge checks what arrives.
_BOOT = r'''
import base64, json, os, sys, traceback
_fd = int(sys.argv[1])
_path = sys.argv[2]
_ask, _answer = int(sys.argv[3]), int(sys.argv[4])
if sys.argv[5]:
    os.mkdir(sys.argv[5], 0o700)
_msg = json.loads(sys.stdin.buffer.read())
sys.stdin.close()
del sys.argv[1:]

def _dec(v):
    if isinstance(v, list):
        return [_dec(x) for x in v]
    if not isinstance(v, dict):
        return v
    if set(v) == {"__nd__"}:
        import numpy as np
        dt, shape, b64 = v["__nd__"]
        return np.frombuffer(base64.b64decode(b64), dtype=np.dtype(dt)).reshape(shape).copy()
    if set(v) == {"__bytes__"}:
        return base64.b64decode(v["__bytes__"])
    return {k: _dec(x) for k, x in v.items()}

def _enc(v):
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        t = v.detach().cpu()
        if t.dtype in (torch.bfloat16, torch.float16) or not t.is_contiguous():
            t = t.float() if t.dtype in (torch.bfloat16, torch.float16) else t.contiguous()
        v = t.numpy()
    if np is not None and isinstance(v, np.ndarray):
        if v.dtype.kind not in "biufc":
            raise TypeError("emit: only numeric or boolean arrays can be sent, got dtype %s" % v.dtype)
        return {"__nd__": [v.dtype.str, list(v.shape), base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()]}
    if np is not None and isinstance(v, np.generic):
        return v.item()
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError("emit: dict keys must be strings, got %r" % (k,))
            out[k] = _enc(x)
        return out
    if isinstance(v, (list, tuple)):
        return [_enc(x) for x in v]
    if isinstance(v, bytes):
        return {"__bytes__": base64.b64encode(v).decode()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError("emit: cannot send a %s" % type(v).__name__)

_values = {}

def emit(**kw):
    _values.update(kw)

def _send(obj):
    data = json.dumps(obj).encode()
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        n = os.write(_fd, view)
        view = view[n:]

# Processes the driver forks (ranks) share the oracle's pipes: a call is one request and its
# answer, under a POSIX lock (held per process, so forked ranks take turns).
if _ask >= 0:
    import fcntl
    _lock = os.open("/tmp/.infradev-oracle-%d" % os.getpid(), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink("/tmp/.infradev-oracle-%d" % os.getpid())

def ORACLE(*args):
    if _ask < 0:
        raise RuntimeError("this probe gave its driver no oracle")
    data = json.dumps(_enc(list(args))).encode()
    fcntl.lockf(_lock, fcntl.LOCK_EX)
    try:
        view = memoryview(len(data).to_bytes(8, "big") + data)
        while view:
            view = view[os.write(_ask, view):]
        head = b""
        while len(head) < 8:
            chunk = os.read(_answer, 8 - len(head))
            if not chunk:
                raise RuntimeError("the judge closed the oracle")
            head += chunk
        size, body = int.from_bytes(head, "big"), b""
        while len(body) < size:
            chunk = os.read(_answer, min(size - len(body), 1 << 20))
            if not chunk:
                raise RuntimeError("the judge closed the oracle")
            body += chunk
    finally:
        fcntl.lockf(_lock, fcntl.LOCK_UN)
    reply = json.loads(body)
    if not reply.get("ok"):
        raise RuntimeError("the oracle refused the call: " + str(reply.get("error")))
    return _dec(reply["value"])

if "replay" in _msg:
    # A forger's child (validation only): gold's message, sent as it was recorded.
    _raw = base64.b64decode(_msg["replay"])
    _view = memoryview(len(_raw).to_bytes(8, "big") + _raw)
    while _view:
        _view = _view[os.write(_fd, _view):]
    os._exit(0)

_args = _dec(_msg["args"])
# Only now, with everything the boot needs imported, is the repository importable.
if _path:
    sys.path[0:0] = [p for p in _path.split(":") if p]
    os.environ["PYTHONPATH"] = _path
_g = {"__name__": "__main__", "ARGS": _args, "emit": emit, "ORACLE": ORACLE}
try:
    exec(compile(_msg["code"], "<string>", "exec"), _g)
    _out = {"ok": True, "values": _enc(_values)}
except BaseException as _e:
    _out = {"ok": False, "error": traceback.format_exc(), "type": type(_e).__name__}
try:
    sys.stdout.flush()
    sys.stderr.flush()
except Exception:
    pass
_send(_out)
os._exit(0)
'''


# As a pytest plugin: the judge must never load the repository's code. Any import that would
# load a module from a file under the repository fails, whatever path led there (sys.path,
# an editable install's finder, importlib).
class _RepositoryImportGuard:
    def __init__(self, root):
        self.root = os.path.realpath(root).rstrip("/") + "/"

    def _inside(self, path):
        return path and os.path.realpath(path).startswith(self.root)

    def find_spec(self, name, path=None, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            places = [spec.origin] + list(spec.submodule_search_locations or [])
            if any(self._inside(p) for p in places if isinstance(p, str)):
                raise ImportError(
                    f"probe judge: {name!r} would be imported from the task repository "
                    f"({spec.origin}); a probe's judging process must not import the code under "
                    f"test: run it in a child with infradev_probe.run")
            return None  # let the import machinery use that finder as usual
        return None


def pytest_configure(config):
    root = os.environ.get("INFRADEV_REPO")
    if root and not any(isinstance(f, _RepositoryImportGuard) for f in sys.meta_path):
        sys.meta_path.insert(0, _RepositoryImportGuard(root))
