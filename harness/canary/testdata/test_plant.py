"""Tests of plant.py, run by canary_test.go under pytest with plant.py importable.

CANARY_CORPUS names test files written in this repository (the demo projects' tests, the
probes) to plant canaries in."""

import ast
import os
import random

import numpy as np
import pytest

import plant

CORPUS = [p for p in os.environ["CANARY_CORPUS"].split(os.pathsep) if p]


def _tests(src):
    """Top-level tests of a source, in order: (name, is a class)."""
    out = []
    for node in ast.parse(src).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            out.append((node.name, False))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            out.append((node.name, True))
    return out


def _canaries(rng, n):
    out = []
    for i in range(n):
        if rng.random() < 0.2:
            body = "import unittest as _u%d\n\n\nclass __CANARY_CLASS__(_u%d.TestCase):\n    def __CANARY_METHOD__(self):\n        pass\n" % (i, i)
            out.append((i, {"kind": "class", "body": body, "seed": rng.getrandbits(64)}))
        else:
            out.append((i, {"kind": "function", "body": "def __CANARY_NAME__():\n    assert 1 + 1 == 2\n", "seed": rng.getrandbits(64)}))
    return out


def test_every_canary_is_planted_where_pytest_finds_it():
    rng = random.Random(1)
    for path in CORPUS:
        with open(path, "rb") as f:
            src = f.read()
        cans = _canaries(rng, 4)
        new, ids = plant.plant("t/" + os.path.basename(path), src, cans)
        ast.parse(new)  # still Python
        names = {n for n, _ in _tests(new)}
        assert set(ids) == {i for i, _ in cans}
        assert len(set(ids.values())) == len(ids), "two canaries under one id"
        for nodeid in ids.values():
            assert nodeid.split("::")[1] in names, nodeid
        # The file's own tests are all still there, in their order.
        own = [n for n, _ in _tests(src)]
        assert [n for n, _ in _tests(new) if n in own] == own


def _hex_planter(path, src, canaries):
    """How canaries used to be made: fresh hex names, appended at the end."""
    ids, text = {}, src
    for i, c in canaries:
        name = "test_%012x" % random.getrandbits(48)
        body = c["body"].replace("__CANARY_NAME__", name).replace("__CANARY_CLASS__", "Test" + name[5:]).replace("__CANARY_METHOD__", "test_x")
        text += b"\n\n" + body.encode()
        ids[i] = "%s::%s" % (path, name if c["kind"] == "function" else "Test" + name[5:])
    return text, ids


def _features(names):
    """What a classifier that knows how canaries are made can read off each top-level test: the
    share of its word pairs no other name has, its length in words, how common its words are
    in the other names, and where it stands in the file."""
    words = [[w for w in n.split("_")[1:]] if not cls else plant.camel_words(n[4:]) for n, cls in names]
    rows = []
    for i, ws in enumerate(words):
        others_pairs, others_words = set(), []
        for j, o in enumerate(words):
            if j != i:
                others_pairs.update(zip(["<s>"] + o, o + ["</s>"]))
                others_words += o
        pairs = list(zip(["<s>"] + ws, ws + ["</s>"]))
        novelty = sum(p not in others_pairs for p in pairs) / len(pairs)
        freq = np.mean([np.log1p(others_words.count(w)) for w in ws]) if ws else 0.0
        hexish = float(any(len(w) >= 8 and all(c in "0123456789abcdef" for c in w) for w in ws))
        rows.append([novelty, len(ws), freq, i / max(1, len(words) - 1), float(i == len(words) - 1), hexish])
    return np.array(rows, dtype=float)


def _trials(planter, rng, count):
    out = []
    files = []
    for path in CORPUS:
        with open(path, "rb") as f:
            src = f.read()
        if len(_tests(src)) >= 3:
            files.append((path, src))
    for _ in range(count):
        path, src = rng.choice(files)
        m = rng.randint(1, 3)
        new, ids = planter("t/x.py", src, _canaries(rng, m))
        planted = {v.split("::")[1] for v in ids.values()}
        names = _tests(new)
        labels = np.array([n in planted for n, _ in names])
        out.append((_features(names), labels))
    return out


def _precision(trials, direction):
    """The classifier marks the m most canary-like tests of each file (m: how many it holds);
    returns its precision and chance's."""
    hit, chance = [], []
    for x, y in trials:
        z = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-9)
        score = z @ direction
        m = int(y.sum())
        picked = np.argsort(-score)[:m]
        hit.append(y[picked].mean())
        chance.append(m / len(y))
    return float(np.mean(hit)), float(np.mean(chance))


def _learn(trials):
    """The direction in feature space that separates canaries from the file's tests on the
    training plantings (the classifier simulates the public rules to learn it)."""
    pos, neg = [], []
    for x, y in trials:
        z = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-9)
        pos += list(z[y])
        neg += list(z[~y])
    return np.mean(pos, axis=0) - np.mean(neg, axis=0)


@pytest.mark.parametrize("planter, name", [(plant.plant, "plant"), (_hex_planter, "hex")])
def test_a_classifier_that_knows_the_rules(planter, name, record_property):
    rng = random.Random(7)
    train, test = _trials(planter, rng, 1000), _trials(planter, rng, 1000)
    direction = _learn(train)
    got, chance = _precision(test, direction)
    print("%s: direction %s" % (name, np.round(direction, 2)))
    record_property("precision", got)
    print("%s: classifier precision %.3f, chance %.3f" % (name, got, chance))
    if name == "hex":
        # The classifier has the power to see canaries made the old way.
        assert got > 0.9, (got, chance)
    else:
        assert got < chance + 0.07, "a classifier tells canaries from the file's tests: precision %.3f, chance %.3f" % (got, chance)
