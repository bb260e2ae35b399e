"""Plants canary tests in an official test file so that they look like the file's own.

Imported by the setup script (apply.py), which calls plant for every official test file that
gets canaries, after the file holds exactly the official tree's bytes and before any of the
submission's code runs. Nothing here runs in the code under test's process.
"""

import ast
import random


def plant(path, src, canaries):
    """Plants canaries in one official test file's source: each is named as the file's own
    tests are (a word chain drawn from the bigrams of their names) and put before one of its
    top-level tests or at the end, chosen at random from the canary's seed. Returns the new
    source and {canary index: node id}."""
    lines = src.split(b"\n")
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        tree = None
    slots, functions, classes, taken = [], [], [], set()
    for node in (tree.body if tree else []):
        name = getattr(node, "name", None)
        if name:
            taken.add(name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name.startswith("test"):
            functions.append(name)
        elif isinstance(node, ast.ClassDef) and name.startswith("Test"):
            classes.append(name)
            functions += [m.name for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and m.name.startswith("test")]
        else:
            continue
        slots.append(min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1)
    slots.append(len(lines))
    code = code_words(tree) if tree else set()
    fn_words = Words([n.split("_")[1:] for n in functions if n.startswith("test_")], code)
    cls_words = Words([camel_words(n[4:]) for n in classes], code)
    ids, inserts = {}, []
    for index, c in canaries:
        rng = random.Random(c["seed"])
        if c["kind"] == "class":
            # A file without test classes lends its functions' words, a few at a time.
            cls = "Test" + "".join(w[:1].upper() + w[1:] for w in (cls_words or fn_words).name(rng, taken, camel=True))
            taken.add(cls)
            method = "test_" + "_".join(fn_words.name(rng, set()))
            body = c["body"].replace("__CANARY_CLASS__", cls).replace("__CANARY_METHOD__", method)
            ids[index] = "%s::%s::%s" % (path, cls, method)
        else:
            name = "test_" + "_".join(fn_words.name(rng, taken, prefix="test_"))
            taken.add(name)
            body = c["body"].replace("__CANARY_NAME__", name)
            ids[index] = "%s::%s" % (path, name)
        inserts.append((rng.choice(slots), index, body.encode()))
    for at, _, body in sorted(inserts, reverse=True):
        lines[at:at] = [b"", b""] + body.rstrip(b"\n").split(b"\n") + [b"", b""]
    return b"\n".join(lines), ids


def camel_words(name):
    out, cur = [], ""
    for ch in name:
        if ch.isupper() and cur:
            out.append(cur)
            cur = ""
        cur += ch.lower()
    return out + ([cur] if cur else [])


class Words:
    """A word chain over a file's test names: canary names are drawn from it so that their
    lengths, words and word order follow the file's own. A name's length is drawn from the
    lengths of the file's names. Its words follow the names' bigrams, except that, as often as
    a real name's word pair occurs in no other name (its novelty, measured over the names one
    left out at a time), the next word is taken out of turn from the names' words, and as often
    as a real name's word occurs in no other name, it is taken from the words of the file's
    code that no test name uses: recombined bigrams alone would make names whose every pair and
    word occurs elsewhere, which real names seldom are."""

    def __init__(self, names, code_words=()):
        self.names = [n for n in names if n]
        self.next = {}
        self.vocab = []
        for words in self.names:
            self.vocab += words
            for a, b in zip(["<s>"] + words, words + ["</s>"]):
                self.next.setdefault(a, []).append(b)
        used = set(self.vocab)
        self.fresh_words = sorted(set(w for w in code_words if w not in used))
        pairs = novel = words = unique = 0
        for i, ws in enumerate(self.names):
            other_pairs, other_words = set(), set()
            for j, w in enumerate(self.names):
                if j != i:
                    other_pairs.update(zip(["<s>"] + w, w + ["</s>"]))
                    other_words.update(w)
            for pair in zip(["<s>"] + ws, ws + ["</s>"]):
                pairs += 1
                novel += pair not in other_pairs
            words += len(ws)
            unique += sum(w not in other_words for w in ws)
        self.novelty = novel / pairs if pairs else 0.0
        self.uniqueness = unique / words if words and self.fresh_words else 0.0
        self.lengths = [len(n) for n in self.names] or [2]
        # A fresh word makes the pairs on both its sides novel already: out of turn only as
        # often as the novelty fresh words leave unexplained.
        mean = sum(self.lengths) / len(self.lengths)
        self.out_of_turn = max(0.0, self.novelty - 2 * self.uniqueness * mean / (mean + 1))

    def __bool__(self):
        return bool(self.names)

    def _word(self, rng, prev, taken_words):
        if self.fresh_words and rng.random() < self.uniqueness:
            return rng.choice(self.fresh_words)
        nxt = [w for w in self.next.get(prev, []) if w != "</s>"]
        if not nxt or rng.random() < self.out_of_turn:
            nxt = self.vocab or ["case"]
        return rng.choice(nxt)

    def name(self, rng, taken, prefix="", camel=False, limit=None):
        join = (lambda ws: "Test" + "".join(w[:1].upper() + w[1:] for w in ws)) if camel else (lambda ws: prefix + "_".join(ws))
        for _ in range(200):
            length = min(rng.choice(self.lengths), limit or 1 << 30)
            words, word = [], "<s>"
            while len(words) < length:
                word = self._word(rng, word, words)
                words.append(word)
            if words and join(words) not in taken:
                return words
        # A file with one or two tests has few chains: a variant of one of its names, as files
        # number their cases.
        base = list(rng.choice(self.names)) if self.names else ["case"]
        while True:
            words = base + [str(rng.randrange(2, 100))]
            if join(words) not in taken:
                return words


def code_words(tree):
    """The lower-case words of the identifiers a module's code uses (split at underscores)."""
    out = set()
    for node in ast.walk(tree):
        for name in (getattr(node, "id", None), getattr(node, "attr", None), getattr(node, "arg", None)):
            if isinstance(name, str):
                out.update(w for w in name.lower().split("_") if len(w) >= 2 and w.isalpha())
    return out
