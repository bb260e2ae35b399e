"""The harness's pytest plugin: the only way test outcomes leave the sandbox.

pytest writes its JUnit report straight into a pipe the harness holds (fd 4). Once the run is
over, this plugin appends a trailer carrying a nonce that the harness sent through another
pipe (fd 3) before any test module was imported, and ends the process with os._exit, so no
atexit handler or leftover code of the submission runs after the report. The harness accepts a
report only if it is one XML document followed by exactly that trailer.

The same pipe carries the node ids to run (after a "select" line): they are read with the
nonce, before any test module is imported, and never written anywhere the code under test
could read them (no file lists them).
"""

import hashlib
import json
import os
import sys

import pytest

NONCE_FD = 3
REPORT_FD = 4

_state = {}


def pytest_addoption(parser):
    parser.addoption("--infradev-select", action="store_true", default=False,
                     help="run only the node ids the harness sent with the nonce (the official test files are collected whole)")
    parser.addoption("--infradev-outcomes", default=None,
                     help="write every test's outcome by node id, as JSON, to this file (surveys of upstream code); "
                          "{rank} in it is the launcher's rank (0 without one)")


_outcomes = {}


def pytest_runtest_logreport(report):
    """Records each test's outcome: the worst of its setup, call and teardown."""
    if report.when == "call" or report.outcome != "passed":
        rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
        outcome = report.outcome
        if report.when != "call" and outcome == "failed":
            outcome = "error"
        prev = _outcomes.get(report.nodeid)
        if prev is None or rank[outcome] > rank[prev]:
            _outcomes[report.nodeid] = outcome


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    with os.fdopen(NONCE_FD, "rb") as f:
        data = f.read(1 << 26)
    nonce, _, rest = data.partition(b"\n")
    _state["nonce"] = nonce.strip()
    if rest.startswith(b"select\n"):
        # Kept as salted digests: the list itself is in no file and no plain string.
        salt = os.urandom(16)
        _state["select"] = (salt, set(hashlib.sha256(salt + x.encode()).digest()
                                      for x in rest[len(b"select\n"):].decode("utf-8").split("\n") if x))
    _state["report"] = os.fstat(REPORT_FD).st_ino
    _state["status"] = 3


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Keeps the requested ids (and the parameter cases of a requested test). The harness
    collects whole files rather than naming ids, because pytest refuses every id on its
    command line when one module cannot be imported: a module broken at the base commit must
    fail only its own tests."""
    if not config.getoption("--infradev-select"):
        return
    salt, wanted = _state.pop("select", (b"", set()))

    def asked(nodeid):
        return hashlib.sha256(salt + nodeid.encode()).digest() in wanted

    keep, drop = [], []
    for item in items:
        nodeid = item.nodeid
        base = nodeid.split("[", 1)[0]
        (keep if asked(nodeid) or asked(base) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_sessionfinish(session, exitstatus):
    _state["status"] = int(exitstatus)
    path = session.config.getoption("--infradev-outcomes")
    if path is not None:
        path = path.replace("{rank}", os.environ.get("INFRADEV_RANK", "0"))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_outcomes, f, sort_keys=True)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    status = _state.get("status", 3)
    try:
        if os.fstat(REPORT_FD).st_ino == _state.get("report"):
            os.write(REPORT_FD, b"\n<!-- infradev-report " + _state["nonce"] + b" -->\n")
        else:
            status = 97  # the report pipe was replaced: send no trailer
    except OSError:
        status = 97
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or replaced stream must not keep the process alive
                pass
        os._exit(status)
