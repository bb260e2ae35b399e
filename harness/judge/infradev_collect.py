"""pytest plugin for the harness's check of a task's probes: writes the node ids collected and
the collection errors (with their text) as JSON to the file named by INFRADEV_COLLECT_OUT."""

import json
import os

_errors = []


def pytest_collectreport(report):
    if report.failed:
        _errors.append({"nodeid": report.nodeid, "text": str(report.longrepr)[-4000:]})


def pytest_collection_finish(session):
    with open(os.environ["INFRADEV_COLLECT_OUT"], "w") as f:
        json.dump({"collected": [item.nodeid for item in session.items], "errors": _errors}, f)
