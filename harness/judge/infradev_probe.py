"""Out-of-process probes: the judging side.

A probe is a pytest test whose process (the judge) decides pass or fail. The judge never
imports the task's repository: the code under test may rewrite anything in the process that
imports it (assertion helpers, the test runner, the report). So a probe sends a short driver
program to a child process, the child runs the code under test and sends back plain data
(JSON values, numpy arrays as raw bytes), and the judge checks that data with its own
assertions and reference values.

The child runs as another user (nobody) that cannot read the probes, their expected values
or this file's caller; it gets a fresh stdin, inherits only its result pipe, and once its
result is in or its time is up it is killed with every process it started, in its session or
not (the judge is their subreaper), so nothing of one child reaches the next. Whatever the
child sends is untrusted data: it is decoded, never unpickled or executed.

    from infradev_probe import run

    def test_state_dict_is_a_snapshot():
        out = run('''
            from minitron.optimizer import Adam
            ...
            emit(before=a, after=b)
        ''')
        np.testing.assert_array_equal(out["before"], out["after"])

In the driver, ``ARGS`` holds the ``args`` given to ``run`` and ``emit(**values)`` records
values to send back (JSON types, numpy arrays and scalars, torch tensors, bytes, nested in
dicts with string keys and lists). ``run`` returns them as a dict; arrays come back as numpy
arrays. If the driver raises, or the child dies before it finishes, ``run`` raises
``ChildFailed`` (an AssertionError: the probe fails) with the child's traceback.

``measure`` runs a driver the same way and also returns the ``Usage`` the judge itself saw
(wall time, host and GPU memory), for probes about resources: see its docstring for what the
figures can and cannot show. ``run(..., repository=False)`` is a reference run that nothing
of the repository can reach, to compare such figures with.

Loaded as a pytest plugin (``-p infradev_probe``), this module also keeps the judge honest:
it refuses any import that would load a module from the task's repository.
"""

import base64
import collections
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

__all__ = ["run", "measure", "Usage", "ChildFailed", "ChildTimeout", "workdir", "repo"]

# The user the code under test runs as: it owns nothing and can read only what is world-readable.
CHILD_UID = 65534
CHILD_GID = 65534
# The most a child may send back.
MAX_RESULT_BYTES = 256 << 20
_ALLOWED_KINDS = "biufc"  # bool, int, uint, float, complex: no object arrays


class ChildFailed(AssertionError):
    """The code under test raised, or its process ended without sending a result."""


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


def run(code, args=None, *, timeout=300, env=None, repository=True):
    """Runs ``code`` in a child process over the task's repository and returns what it emitted.

    ``args`` (JSON values and numpy arrays) is available to the driver as ``ARGS``; ``env``
    adds environment variables. The child is killed after ``timeout`` seconds. With
    ``repository=False`` the repository is neither on the child's import path nor its working
    directory: a reference run (a baseline to compare with) that no code under test can reach.
    """
    return _run(code, args, timeout, env, None, repository)


def measure(code, args=None, *, timeout=300, env=None, gpu=False, repository=True):
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
    values = _run(code, args, timeout, env, watch, repository)
    return values, watch.usage()


def _run(code, args, timeout, env, watch, repository):
    payload = json.dumps({"code": textwrap.dedent(code), "args": _encode(args or {})}).encode()
    child_env = _child_env(env)
    cwd = repo()
    if not repository:
        child_env.pop("PYTHONPATH", None)
        child_env["PYTHONSAFEPATH"] = "1"  # nor the working directory first on sys.path
        cwd = "/"
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, True)
    kwargs = {}
    if os.geteuid() == 0:
        kwargs.update(user=CHILD_UID, group=CHILD_GID, extra_groups=[])
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(write_fd)],
            stdin=subprocess.PIPE,
            cwd=cwd,
            env=child_env,
            pass_fds=(write_fd,),
            start_new_session=True,
            **kwargs,
        )
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    os.close(write_fd)
    if watch is not None:
        watch.start(proc.pid)
    deadline = time.monotonic() + timeout
    header, data, timed_out = b"", b"", False
    try:
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except OSError:
            pass
        # The result is a length and that many bytes: processes the child leaves behind may
        # hold the pipe open, so the end of the result is not the end of the pipe.
        header = _read_exactly(read_fd, 8, deadline, proc)
        if header is None:
            timed_out = True
        elif len(header) == 8:
            size = int.from_bytes(header, "big")
            if size > MAX_RESULT_BYTES:
                raise ChildFailed(f"the child sent a result of {size} bytes, over {MAX_RESULT_BYTES}")
            data = _read_exactly(read_fd, size, deadline, proc)
            if data is None:
                timed_out = True
        if watch is not None:
            watch.received()
        if not timed_out:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        os.close(read_fd)
        if watch is not None:
            watch.stop()
        _kill(proc)
    if timed_out:
        raise ChildTimeout(f"the code under test ran past {timeout}s and was killed")
    if not header:
        raise ChildFailed(f"the child exited {_status(proc.returncode)} without sending a result")
    if len(header) < 8 or len(data) != int.from_bytes(header, "big"):
        raise ChildFailed(f"the child exited {_status(proc.returncode)} in the middle of sending its result")
    return _result(data)


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


def _read_exactly(fd, n, deadline, proc):
    """Reads n bytes from fd; fewer if it ends first or the child exits with nothing more
    sent (what it left behind may keep the pipe open); None if the deadline passes."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            if proc.poll() is not None and not select.select([fd], [], [], 0)[0]:
                break
            continue
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def _child_env(extra):
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("INFRADEV_") or k.startswith("PYTEST_") or k in _JUDGE_ONLY)}
    env.update({
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


def _result(data):
    try:
        msg = json.loads(data)
    except ValueError as e:
        raise ChildFailed(f"the child sent something that is not JSON: {e}") from None
    if not isinstance(msg, dict) or msg.get("ok") not in (True, False):
        raise ChildFailed("the child sent a malformed result")
    if not msg["ok"]:
        raise ChildFailed("the code under test raised:\n" + str(msg.get("error", ""))[:20000])
    values = _decode(msg.get("values"))
    if not isinstance(values, dict):
        raise ChildFailed("the child sent a malformed result")
    return values


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


def _decode(v):
    if isinstance(v, list):
        return [_decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    if set(v) == {"__nd__"}:
        return _array(v["__nd__"])
    if set(v) == {"__bytes__"}:
        return base64.b64decode(v["__bytes__"], validate=True)
    return {k: _decode(x) for k, x in v.items()}


def _array(spec):
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
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


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

_g = {"__name__": "__probe_driver__", "ARGS": _dec(_msg["args"]), "emit": emit}
try:
    exec(compile(_msg["code"], "<probe driver>", "exec"), _g)
    _out = {"ok": True, "values": _enc(_values)}
except BaseException:
    _out = {"ok": False, "error": traceback.format_exc()}
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
