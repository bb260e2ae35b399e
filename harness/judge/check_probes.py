"""Checks a task's probe modules without importing them (run once per task, before any
submission): every module parses, and none imports the task repository's code in the judging
process. Prints a JSON list of problems, each with file, line and message.

usage: python3 -I check_probes.py REPO PROBES_DIR
"""

import ast
import json
import os
import sys


def repository_modules(repo):
    """Top-level names the repository provides: packages, namespace directories holding Python
    files, and modules, at its root and under src/."""
    names = set()
    for parent in (repo, os.path.join(repo, "src")):
        if not os.path.isdir(parent):
            continue
        for entry in os.listdir(parent):
            full = os.path.join(parent, entry)
            if entry.startswith("."):
                continue
            if entry.endswith(".py") and os.path.isfile(full):
                names.add(entry[:-3])
            elif os.path.isdir(full) and entry.isidentifier():
                if any(f.endswith(".py") for f in os.listdir(full)):
                    names.add(entry)
    return names


def problems_in(path, rel, modules):
    with open(path, "rb") as f:
        src = f.read()
    try:
        tree = ast.parse(src, filename=rel)
    except SyntaxError as e:
        return [{"file": rel, "line": e.lineno or 0, "msg": "syntax error: %s" % e.msg}]
    out = []

    def flag(node, name):
        out.append({"file": rel, "line": node.lineno,
                    "msg": "imports %r from the task repository in the judging process; "
                           "run the code under test in a child with infradev_probe.run" % name})

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in modules:
                    flag(node, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.split(".")[0] in modules:
                flag(node, node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            arg = node.args[0].value
            if called in ("import_module", "__import__") and isinstance(arg, str) and arg.split(".")[0] in modules:
                flag(node, arg)
    return out


def main():
    repo, probes = sys.argv[1], sys.argv[2]
    modules = repository_modules(repo)
    problems = []
    for top, dirs, files in os.walk(probes):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                full = os.path.join(top, name)
                problems += problems_in(full, os.path.relpath(full, probes), modules)
    json.dump(problems, sys.stdout)


if __name__ == "__main__":
    main()
