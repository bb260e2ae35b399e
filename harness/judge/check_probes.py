"""Checks a task's probe modules without importing them (run once per task, before any
submission): every module parses, none imports the task repository's code in the judging
process, and every test draws fresh inputs (calls infradev_probe.fresh, itself or through the
functions and fixtures it uses): a probe whose inputs are written in its file can be passed by
a child that replays what gold's child once sent. Prints a JSON list of problems, each with
file, line and message.

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


class Functions:
    """Every function defined in the probe modules, by module and name, with the names its body
    uses, and the names each module imports from the others."""

    def __init__(self):
        self.uses = {}  # (module, name) -> names used in its body (calls, references, fixtures)
        self.fresh = set()  # (module, name) of functions whose body calls fresh()
        self.imports = {}  # module -> {local name: (module, name)}

    def add(self, module, tree, modules):
        imported = self.imports.setdefault(module, {})
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                for alias in node.names:
                    imported[alias.asname or alias.name] = (node.module, alias.name)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                used = {a.arg for a in node.args.args + node.args.kwonlyargs}
                calls_fresh = False
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Name):
                        used.add(sub.id)
                    elif isinstance(sub, ast.Attribute):
                        used.add(sub.attr)
                    if isinstance(sub, ast.Call):
                        fn = sub.func
                        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                        if name == "fresh":
                            calls_fresh = True
                key = (module, node.name)
                self.uses.setdefault(key, set()).update(used)
                if calls_fresh:
                    self.fresh.add(key)

    def _resolve(self, module, name):
        if (module, name) in self.uses:
            return (module, name)
        return self.imports.get(module, {}).get(name)

    def reaches_fresh(self, module, name):
        seen, todo = set(), [(module, name)]
        while todo:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            if key in self.fresh:
                return True
            for u in self.uses.get(key, ()):
                target = self._resolve(key[0], u)
                if target is not None:
                    todo.append(target)
        return False


def tests_in(tree):
    """The test functions pytest collects from a module: test_* at the top and in Test* classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            yield node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith("test"):
                    yield sub


def main():
    repo, probes = sys.argv[1], sys.argv[2]
    modules = repository_modules(repo)
    problems = []
    parsed = []
    for top, dirs, files in os.walk(probes):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                full = os.path.join(top, name)
                rel = os.path.relpath(full, probes)
                found = problems_in(full, rel, modules)
                problems += found
                if not found:
                    with open(full, "rb") as f:
                        tree = ast.parse(f.read(), filename=rel)
                    parsed.append((rel, tree))
    # Probe modules import one another by their names (the probes folder is the rootdir).
    names = {os.path.splitext(rel)[0].replace(os.sep, "."): tree for rel, tree in parsed}
    funcs = Functions()
    for module, tree in names.items():
        funcs.add(module, tree, names)
    for rel, tree in parsed:
        if not os.path.basename(rel).startswith("test"):
            continue
        module = os.path.splitext(rel)[0].replace(os.sep, ".")
        for node in tests_in(tree):
            if not funcs.reaches_fresh(module, node.name):
                problems.append({"file": rel, "line": node.lineno,
                                 "msg": "%s draws no fresh input (infradev_probe.fresh): a child that replays "
                                        "what gold's child once sent would pass it" % node.name})
    json.dump(problems, sys.stdout)


if __name__ == "__main__":
    main()
