"""Tests of infradev_probe, run by judge_test.go under pytest with the library as a plugin."""

import os
import tempfile

import numpy as np
import pytest

import infradev_probe as probe


def test_values_come_back_as_plain_data():
    out = probe.run("""
        import os
        import numpy as np
        from pkg import double
        emit(v=double(ARGS["x"]), arr=np.arange(6, dtype=np.float32).reshape(2, 3) * ARGS["scale"],
             uid=os.getuid(), raw=b"\\x00\\x01", nested={"a": [1, (2, 3)]}, scalar=np.int64(7))
    """, {"x": 21, "scale": np.float32(2)})
    assert out["v"] == 42
    np.testing.assert_array_equal(out["arr"], np.arange(6, dtype=np.float32).reshape(2, 3) * 2)
    assert out["arr"].dtype == np.float32
    assert out["raw"] == b"\x00\x01" and out["nested"] == {"a": [1, [2, 3]]} and out["scalar"] == 7
    if os.geteuid() == 0:
        assert out["uid"] == probe.CHILD_UID, "the code under test must not run as the judge's user"


def test_the_child_cannot_read_what_only_the_judge_can():
    secret = os.path.join(os.environ["JUDGE_PRIVATE"], "expected.txt")
    with open(secret, "w") as f:
        f.write("42")
    if os.geteuid() != 0:
        pytest.skip("the judge must run as root to start its children as another user")
    with pytest.raises(probe.ChildFailed, match="PermissionError"):
        probe.run("open(ARGS['p']).read()", {"p": secret})


def test_a_raising_driver_fails_the_probe_naming_only_the_exception(monkeypatch):
    # The child's traceback is its own text: it could carry the driver's source to the run
    # folder. Only the exception's name is shown, unless the probes run for their authors.
    leak = "raise ValueError(open('/proc/self/cmdline').read() + str(ARGS))"
    with pytest.raises(probe.ChildFailed) as info:
        probe.run(leak, {"secret": "s3cr3t-input"})
    assert "ValueError" in str(info.value)
    assert "s3cr3t" not in str(info.value) and "cmdline" not in str(info.value)
    with pytest.raises(probe.ChildFailed) as info:
        probe.run("raise type('X' * 200, (Exception,), {})('driver source here')")
    assert "an exception" in str(info.value) and "driver source" not in str(info.value)
    monkeypatch.setattr(probe, "_VERBOSE", True)
    with pytest.raises(probe.ChildFailed, match="ValueError: boom"):
        probe.run("raise ValueError('boom')")


def test_the_child_output_is_discarded(capfd, monkeypatch):
    code = "import os, sys\nprint('OUT-' + 'MARK')\nsys.stderr.write('ERR-' + 'MARK')\nos.write(1, b'RAW-MARK')\nemit(x=1)"
    assert probe.run(code) == {"x": 1}
    got = capfd.readouterr()
    assert "MARK" not in got.out + got.err
    monkeypatch.setattr(probe, "_VERBOSE", True)
    probe.run(code)
    got = capfd.readouterr()
    assert "OUT-MARK" in got.out + got.err


def test_nan_and_infinities_are_refused_unless_asked_for():
    for code in ["emit(x=float('nan'))", "emit(x=[1.0, float('inf')])",
                 "import numpy as np\nemit(a=np.array([1.0, np.nan], dtype=np.float32))",
                 "import numpy as np\nemit(a=np.full((2, 2), -np.inf))"]:
        with pytest.raises(probe.ChildFailed, match="NaN|Infinity|infinit"):
            probe.run(code)
    got = probe.run("import numpy as np\nemit(a=np.array([np.nan]), x=float('inf'))", allow_nan=True)
    assert np.isnan(got["a"][0]) and got["x"] == float("inf")


def test_a_repository_module_cannot_shadow_what_the_boot_imports():
    # The test repository has json.py at its root, which forges a result when imported.
    got = probe.run("import json, pkg\nemit(x=pkg.double(2), json=json.__name__)")
    assert got == {"x": 4, "json": "json"}
    # The code under test still finds the repository, and what it starts finds it too.
    got = probe.run("import os, subprocess, sys\n"
                    "out = subprocess.run([sys.executable, '-c', 'import pkg; print(pkg.double(5))'],"
                    " capture_output=True, text=True, cwd='/')\nemit(out=out.stdout.strip(), path=os.environ['PYTHONPATH'])")
    assert got == {"out": "10", "path": probe.repo()}


def test_fresh_inputs_differ_every_time():
    a, b = probe.fresh().integers(1 << 62, size=4), probe.fresh().integers(1 << 62, size=4)
    assert (a != b).any()


def test_reference_children_run_gold_and_never_the_submission():
    assert probe.reference("import pkg\nemit(x=pkg.double(3), gold=pkg.GOLD)") == {"x": 6, "gold": True}
    got = probe.reference("import getpass, os, sys\nemit(uid=os.getuid(), cwd=os.getcwd(), path=sys.path, home=os.environ['HOME'], user=getpass.getuser())")
    assert got["user"] == probe.REF_USER
    assert probe.repo() not in got["path"] and got["cwd"] == os.environ["INFRADEV_REFERENCE"]
    if os.geteuid() == 0:
        assert got["uid"] == probe.REF_UID
        # The submission's child cannot read the gold tree.
        with pytest.raises(probe.ChildFailed, match="PermissionError"):
            probe.run("open(ARGS['p']).read()", {"p": os.path.join(os.environ["INFRADEV_REFERENCE"], "pkg", "__init__.py")})
    assert probe.run("import pkg\nemit(gold=hasattr(pkg, 'GOLD'))") == {"gold": False}


@pytest.mark.parametrize("got, want, message", [
    ({"a": 1}, {"a": 1, "b": 2}, r"keys differ \(missing \['b'\]"),
    ({"a": [1, 2]}, {"a": [1, 2, 3]}, r"\['a'\]: got a list of 2, want a list of 3"),
    ({"a": np.zeros(3)}, {"a": np.zeros(3, dtype=np.float32)}, r"got float64\[3\], want float32\[3\]"),
    ({"a": np.array([1, 2, 3])}, {"a": np.array([1, 5, 3])}, r"1 of 3 elements differ, first at \[1\]"),
    ({"a": True}, {"a": 1}, r"want a number"),
    ({"a": "x"}, {"a": "y"}, r"differs"),
    ({"a": 1.0}, {"a": 1.5}, r"number differs"),
])
def test_same_names_the_first_difference(got, want, message):
    with pytest.raises(AssertionError, match=message):
        probe.same(got, want)


def test_same_accepts_equal_values_within_tolerance():
    probe.same({"a": [np.array([1.0, 2.0]), 3, "s", None, b"x"]}, {"a": [np.array([1.0, 2.0 + 1e-9]), 3, "s", None, b"x"]}, atol=1e-6)


def test_a_child_that_dies_without_a_result():
    with pytest.raises(probe.ChildFailed, match="exited 3 without sending a result"):
        probe.run("import os; os._exit(3)")


def test_processes_left_behind_do_not_hold_the_judge():
    out = probe.run("import subprocess; p = subprocess.Popen(['sleep', '60']); emit(pid=p.pid)", timeout=20)
    assert not os.path.exists(f"/proc/{out['pid']}"), "the child's sleep outlived it"


_DAEMON = """
import os, time

def daemon(body):
    # Double fork into a new session: the grandchild leaves the child's session and its parent.
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            body()
            os._exit(0)
        os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32))
    os.wait()
    return pid
"""


def test_processes_that_left_the_session_are_ended_too():
    out = probe.run(_DAEMON + """
pid = daemon(lambda: time.sleep(60))
assert os.getsid(pid) != os.getsid(0)
emit(pid=pid)
""", timeout=20)
    assert not os.path.exists(f"/proc/{out['pid']}"), "a daemonized process outlived the child"
    # The next child starts with nothing of the last one left.
    after = probe.run("import os\nemit(mine=sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and os.stat('/proc/' + p).st_uid == os.getuid()))")
    assert out["pid"] not in after["mine"]


def test_timeout_kills_the_child():
    with pytest.raises(probe.ChildTimeout):
        probe.run("import time; time.sleep(30)", timeout=1)


@pytest.fixture
def authors(monkeypatch):
    """The probes run for their authors: the child's tracebacks are shown."""
    monkeypatch.setattr(probe, "_VERBOSE", True)


def test_object_arrays_are_refused(authors):
    with pytest.raises(probe.ChildFailed, match="only numeric or boolean arrays"):
        probe.run("import numpy as np; emit(a=np.array([object()], dtype=object))")


def test_a_forged_result_is_checked_not_trusted():
    # The driver writes its own "result" into the pipe: a length then an array whose bytes do
    # not match its shape.
    bad = '{"ok": true, "values": {"a": {"__nd__": ["<f4", [4], "AAAA"]}}}'
    with pytest.raises(probe.ChildFailed, match="do not match its shape"):
        probe.run(f"""
            import os, __main__
            data = {bad!r}.encode()
            os.write(__main__._fd, len(data).to_bytes(8, "big") + data)
            os._exit(0)
        """)
    with pytest.raises(probe.ChildFailed, match="not plain data"):
        forged = '{"ok": true, "values": {"a": {"__nd__": ["|O", [1], "AAAAAAAAAAA="]}}}'
        probe.run(f"""
            import os, __main__
            data = {forged!r}.encode()
            os.write(__main__._fd, len(data).to_bytes(8, "big") + data)
            os._exit(0)
        """)


def test_the_judge_cannot_import_the_repository():
    import sys
    sys.path.insert(0, probe.repo())
    try:
        with pytest.raises(ImportError, match="must not import the code under test"):
            import pkg  # noqa: F401
    finally:
        sys.path.remove(probe.repo())


def test_ranks_come_back_in_rank_order():
    got = probe.run(probe.RANKS_PRELUDE + """
import os

def rank(r, world, port, payload):
    return {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]),
            "port": port, "value": payload["k"] * r}

emit(ranks=spawn_ranks(ARGS["world"], rank, ARGS, 60, cuda=False))
""", {"world": 3, "k": 7}, timeout=120)
    ranks = got["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2]
    assert [r["value"] for r in ranks] == [0, 7, 14]
    assert {r["world"] for r in ranks} == {3} and len({r["port"] for r in ranks}) == 1


@pytest.mark.parametrize("body, message", [
    ("if r == 1: raise ValueError('bad shard %d' % r)", "rank 1 raised:"),
    ("if r == 2: os._exit(9)", "ranks [2] died without a result (exit codes [9])"),
    ("if r == 0: time.sleep(60)", "ranks [0] did not finish within 3s"),
])
def test_a_failing_rank_fails_the_scenario_by_name(body, message, authors):
    with pytest.raises(probe.ChildFailed) as info:
        probe.run(probe.RANKS_PRELUDE + f"""
import os, time

def rank(r, world, port, payload):
    {body}
    return r

emit(ranks=spawn_ranks(3, rank, None, 3, cuda=False))
""", timeout=120)
    assert message in str(info.value)
    if "raise" in body:
        # Only rank 1 failed, so its own error is the one reported.
        assert "ValueError: bad shard 1" in str(info.value)


def test_a_cuda_rank_needs_its_gpu(authors):
    with pytest.raises(probe.ChildFailed) as info:
        probe.run(probe.RANKS_PRELUDE + """
import sys, types
torch = types.ModuleType("torch")
torch.cuda = types.SimpleNamespace(device_count=lambda: 0, set_device=lambda i: None)
sys.modules["torch"] = torch
emit(ranks=spawn_ranks(2, lambda r, w, p, a: r, None, 30))
""", timeout=120)
    assert "this probe needs 2 GPUs, 0 visible" in str(info.value)


MIB = 1 << 20


def test_measure_sees_host_memory_the_child_does_not_report():
    # The child holds 300 MiB for a moment and reports nothing: the judge's figure comes from
    # the kernel, not from what the child says.
    got, usage = probe.measure("""
import time
block = b"x" * (300 << 20)
time.sleep(0.3)
del block
emit(reported=0)
""", timeout=60)
    assert got == {"reported": 0}
    assert usage.host_peak_bytes >= 300 * MIB, usage
    assert usage.gpu_peak_bytes is None
    assert 0.3 <= usage.wall_seconds < 60, usage


def test_measure_keeps_the_high_water_mark_of_a_short_peak():
    # Allocated and freed between two samples: the kernel's high-water mark still shows it.
    _, usage = probe.measure("""
import time
block = b"x" * (200 << 20)
del block
time.sleep(0.2)
""", timeout=60)
    assert usage.host_peak_bytes >= 200 * MIB, usage


def test_measure_counts_processes_the_child_starts():
    _, usage = probe.measure("""
import subprocess, sys
subprocess.run([sys.executable, "-c", "import time; b = b'x' * (250 << 20); time.sleep(1)"], check=True)
""", timeout=60)
    assert usage.host_peak_bytes >= 250 * MIB, usage


def test_measure_counts_processes_that_left_the_session():
    _, usage = probe.measure(_DAEMON + """
def hold():
    b = b"x" * (250 << 20)
    time.sleep(1.5)

daemon(hold)
time.sleep(2)
""", timeout=60)
    assert usage.host_peak_bytes >= 250 * MIB, usage


def test_a_reference_run_cannot_reach_the_repository(authors):
    assert probe.run("import pkg\nemit(x=pkg.double(2))") == {"x": 4}
    with pytest.raises(probe.ChildFailed, match="No module named 'pkg'"):
        probe.run("import pkg", repository=False)
    got = probe.run("import os, sys\nemit(cwd=os.getcwd(), path=sys.path)", repository=False)
    assert got["cwd"] == "/" and probe.repo() not in got["path"] and "" not in got["path"]


def _gpu_used(nbytes):
    path = os.environ["FAKE_NVML_USED"]
    with open(path + ".tmp", "w") as f:
        f.write(str(nbytes))
    os.chmod(path + ".tmp", 0o666)
    os.replace(path + ".tmp", path)


def test_measure_reads_gpu_memory_through_nvml():
    # Another user holds 50 MiB before the child starts; the child takes 150 MiB in all for a
    # moment, then gives it back and reports that it used none.
    _gpu_used(50 * MIB)
    try:
        got, usage = probe.measure("""
import os, time

def used(n):
    with open(ARGS["file"] + ".child", "w") as f:
        f.write(str(n))
    os.replace(ARGS["file"] + ".child", ARGS["file"])

used(150 << 20)
time.sleep(0.2)
used(50 << 20)
emit(reported=0)
""", {"file": os.environ["FAKE_NVML_USED"]}, timeout=60, gpu=True)
    finally:
        _gpu_used(0)
    assert got == {"reported": 0}
    assert usage.gpu_peak_bytes == 100 * MIB, usage
    assert usage.samples > 10, usage


def test_measure_without_nvml_is_an_error_not_a_zero(monkeypatch):
    monkeypatch.setenv("INFRADEV_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
    with pytest.raises(RuntimeError, match="cannot measure GPU memory: NVML"):
        probe.measure("emit(x=1)", gpu=True)


def test_measure_reads_only_the_gpus_it_was_given(monkeypatch):
    # The stand-in's second GPU cannot be read, as one outside the sandbox cannot.
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "1")
    with pytest.raises(RuntimeError, match=r"reads none of GPUs \[1\]"):
        probe.measure("emit(x=1)", gpu=True)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "0")
    _, usage = probe.measure("emit(x=1)", gpu=True)
    assert usage.gpu_peak_bytes == 0, usage


# Recording gold's children and forging them, as validation does: a probe run under pytest in
# a judge of its own, with the phase's variables set.
_PROBE_FILE = '''
import numpy as np
from infradev_probe import fresh, reference, run, same

DRIVER = """
import pkg
emit(doubled=[pkg.double(x) for x in ARGS["xs"]], count=len(ARGS["xs"]), ok=True)
"""


def test_fixed_inputs():
    # Decides from the child's word: a recording of any earlier run passes it.
    out = run(DRIVER, {"xs": [1, 2, 3]})
    assert out["doubled"] == [2, 4, 6] and out["ok"]


def test_child_against_child():
    out = run("import pkg\\nemit(a=float(pkg.double(ARGS['x'])), b=float(ARGS['x'] * 2))", {"x": float(fresh().integers(1, 99))})
    np.testing.assert_array_equal(out["a"], out["b"])


def test_counter_only():
    # Fresh inputs, but the deciding value is a count that does not depend on them.
    xs = [int(v) for v in fresh().integers(0, 1000, size=3)]
    out = run(DRIVER, {"xs": xs})
    assert out["count"] == 3 and out["ok"]


def test_fresh_against_reference():
    xs = [int(v) for v in fresh().integers(0, 1000, size=3)]
    args = {"xs": xs}
    same(run(DRIVER, args), reference(DRIVER, args))
'''


def _judge(tmp, repo_dir, **env):
    import subprocess
    import sys

    path = os.path.join(tmp, "test_p.py")
    with open(path, "w") as f:
        f.write(_PROBE_FILE)
    full = dict(os.environ, INFRADEV_REPO=repo_dir, PYTHONPATH=os.environ["JUDGE_LIB"], **env)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "infradev_probe",
                        "-rA", path], capture_output=True, text=True, env=full, cwd=tmp)
    passed = {line.split("::")[1].split()[0] for line in p.stdout.splitlines() if line.startswith("PASSED")}
    return passed, p.stdout + p.stderr


def test_recorded_messages_replayed_and_forged():
    import shutil

    tmp = tempfile.mkdtemp(prefix="judge-forge-", dir="/tmp")
    os.chmod(tmp, 0o755)
    try:
        _replay_and_forge(tmp)
    finally:
        shutil.rmtree(tmp)


def _replay_and_forge(tmp):
    def repository(name, body):
        path = os.path.join(tmp, name)
        os.makedirs(os.path.join(path, "pkg"))
        with open(os.path.join(path, "pkg", "__init__.py"), "w") as f:
            f.write(body)
        for d in (path, os.path.join(path, "pkg")):
            os.chmod(d, 0o755)
        os.chmod(os.path.join(path, "pkg", "__init__.py"), 0o644)
        return path

    gold_repo = repository("gold", "def double(x):\n    return 2 * x\n")
    record = os.path.join(tmp, "record")
    # "Gold": the gold tree as the repository, recorded.
    passed, out = _judge(tmp, gold_repo, INFRADEV_PROBE_RECORD=record)
    assert passed == {"test_fixed_inputs", "test_child_against_child", "test_counter_only", "test_fresh_against_reference"}, out
    # A repository whose double is wrong: every probe but the fixed-input one sees it... under
    # replay the child sends gold's messages whatever the code is.
    broken = repository("broken", "def double(x):\n    raise NotImplementedError\n")
    passed, out = _judge(tmp, broken)
    assert passed == set(), out
    # Replayed, every probe that does not compare with a reference on fresh inputs passes.
    replayable = {"test_fixed_inputs", "test_child_against_child", "test_counter_only"}
    passed, out = _judge(tmp, broken, INFRADEV_PROBE_FORGE="replay", INFRADEV_PROBE_RECORDED=record)
    assert passed == replayable, out
    # Where the code under test raises, the mixing forger sends gold's message whole.
    passed, out = _judge(tmp, broken, INFRADEV_PROBE_FORGE="mix", INFRADEV_PROBE_RECORDED=record)
    assert passed == replayable, out
    # Over code that runs, every scalar (list items too) is gold's: a probe that decides from
    # scalars the child reports passes, one that checks them against a reference does not.
    off = repository("off", "def double(x):\n    return 2 * x + 1\n")
    passed, out = _judge(tmp, off, INFRADEV_PROBE_FORGE="mix", INFRADEV_PROBE_RECORDED=record)
    assert passed == replayable, out
    passed, out = _judge(tmp, gold_repo, INFRADEV_PROBE_FORGE="nan", INFRADEV_PROBE_RECORDED=record)
    assert "test_child_against_child" not in passed and "test_fresh_against_reference" in passed, out


def test_the_oracle_is_the_judges():
    # A model whose weights only the judge holds: the child can compute nothing without it,
    # and the judge counts every call it makes.
    weights = probe.fresh().standard_normal(8)
    calls = []

    def oracle(op, x):
        calls.append(op)
        if op != "dot":
            raise ValueError("no such operation")
        return float(np.dot(weights, x))

    xs = probe.fresh().standard_normal((3, 8))
    got = probe.run("""
import numpy as np
out = [ORACLE("dot", x) for x in ARGS["xs"]]
try:
    ORACLE("weights", ARGS["xs"][0])
except RuntimeError as e:
    refused = str(e)
emit(out=np.array(out), refused=refused)
""", {"xs": xs}, oracle=oracle)
    np.testing.assert_allclose(got["out"], xs @ weights)
    assert calls == ["dot", "dot", "dot", "weights"]
    assert "no such operation" in got["refused"]


def test_a_driver_without_an_oracle_cannot_call_one(authors):
    with pytest.raises(probe.ChildFailed, match="no oracle"):
        probe.run("ORACLE(1)")


def test_oracle_calls_the_judge_cannot_decode_are_refused():
    got = probe.run("""
import json, os, __main__
data = b"not json"
os.write(__main__._ask, len(data).to_bytes(8, "big") + data)
head = os.read(__main__._answer, 8)
emit(reply=json.loads(os.read(__main__._answer, int.from_bytes(head, "big")))["ok"])
""", oracle=lambda *a: 1)
    assert got == {"reply": False}


def test_forked_ranks_share_the_oracle():
    # Four forked ranks call the oracle at once, many times: every call gets its own answer.
    got = probe.run(probe.RANKS_PRELUDE + """
def rank(r, world, port, payload):
    return [ORACLE("echo", r, i) for i in range(200)]

emit(ranks=spawn_ranks(4, rank, None, 60, cuda=False))
""", timeout=120, oracle=lambda op, r, i: [r, i])
    assert got["ranks"] == [[[r, i] for i in range(200)] for r in range(4)]
