"""Tests of infradev_probe, run by judge_test.go under pytest with the library as a plugin."""

import os

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


def test_a_raising_driver_fails_the_probe_with_its_traceback():
    with pytest.raises(probe.ChildFailed, match="ValueError: boom"):
        probe.run("raise ValueError('boom')")


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


def test_object_arrays_are_refused():
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
def test_a_failing_rank_fails_the_scenario_by_name(body, message):
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


def test_a_cuda_rank_needs_its_gpu():
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


def test_a_reference_run_cannot_reach_the_repository():
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
