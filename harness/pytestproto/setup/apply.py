"""Sets up one attempt's repository inside the sandbox, before any of the submission's code runs.

Run by the harness as `python3 -I apply.py` with the repository as the working directory. It

1. checks that the repository is at the task's base commit, and builds the official tree (base
   plus the official test patch) in a scratch index: both are decided without the submission;
2. applies the submission all-or-nothing with `git apply`;
3. makes every harness-owned path exactly what the official tree has, with plain writes of the
   blobs' bytes (no git attributes or filters in play): the test roots (every file under them,
   `__init__.py` and helpers included), the official test files, and every runner or
   interpreter configuration file anywhere (conftest.py, sitecustomize.py, pytest.ini, ...);
4. removes test modules the submission added outside the test roots (they never run);
5. plants the attempt's canary tests among the official tests, named and placed as the file's
   own tests are (plant): their node ids go to canaries.json for the harness;
6. writes what the submission left on disk (every file it added or changed outside the
   harness-owned paths, with the base version beside it) to changes.tar for the static scan.

Before the submission is applied it also writes the gold tree's difference from the base
(gold and the official tests applied in a scratch index whose new objects go to this run's
/tmp, never into the repository, where the submission's code could read them) under
reference/: the files, and reference.deleted listing removed paths. The harness lays it over the
image as the tree the probes' reference children read.

Exit codes (the harness grades them): 0 ready; 30 not at the base commit, 32 the official
tests do not apply and 33 gold does not apply over them (faults of the task, decided before
the submission is applied); 20 the
submission does not apply; 21 the harness's files could not be put in place over the
submission (counted against it). Paths are handled as bytes end to end: a file name may hold
any byte but '/' and NUL.
"""

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import traceback

IN = "/run/infradev/in"
OUT = "/run/infradev/out"

EXIT_PATCH_DOES_NOT_APPLY = 20
EXIT_SETUP_OVER_PATCH = 21
EXIT_NOT_AT_BASE = 30
EXIT_TESTS_DO_NOT_APPLY = 32
EXIT_GOLD_DOES_NOT_APPLY = 33

GIT_ENV = dict(
    os.environ,
    GIT_CEILING_DIRECTORIES="/",
    GIT_CONFIG_NOSYSTEM="1",
    GIT_CONFIG_GLOBAL="/dev/null",
    GIT_ATTR_NOSYSTEM="1",
    GIT_OPTIONAL_LOCKS="0",
    GIT_TERMINAL_PROMPT="0",
    HOME="/tmp",
    LC_ALL="C",
)


def git(*args, env=None, stdin=None):
    """Runs git; returns stdout bytes, or raises CalledProcessError with stderr shown."""
    p = subprocess.run(("git",) + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env or GIT_ENV)
    if p.returncode != 0:
        sys.stderr.write(p.stderr.decode(errors="replace"))
        raise subprocess.CalledProcessError(p.returncode, ("git",) + args)
    return p.stdout


def tree_entries(out):
    """Parses `git ls-files -s -z` or `git ls-tree -r -z` output into {path: (mode, sha)}."""
    entries = {}
    for rec in out.split(b"\0"):
        if not rec:
            continue
        meta, path = rec.split(b"\t", 1)
        fields = meta.split()
        if fields[1] in (b"blob", b"commit", b"tree"):  # ls-tree: mode type sha
            mode, sha = fields[0], fields[2]
        else:  # ls-files -s: mode sha stage
            mode, sha = fields[0], fields[1]
        entries[path] = (mode.decode(), sha.decode())
    return entries


def snapshot():
    """Every file and link in the work tree (not .git) with what changes when it is written."""
    sig = {}
    for top, dirs, files in os.walk(b".", followlinks=False):
        if top == b".":
            dirs[:] = [d for d in dirs if d != b".git"]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            full = os.path.join(top, name)
            st = os.lstat(full)
            sig[full[2:]] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    return sig


class Blobs:
    """Reads blobs' raw bytes through one `git cat-file --batch` process."""

    def __init__(self):
        self.p = subprocess.Popen(["git", "cat-file", "--batch"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=GIT_ENV)

    def read(self, sha):
        self.p.stdin.write(sha.encode() + b"\n")
        self.p.stdin.flush()
        header = self.p.stdout.readline().split()
        if len(header) != 3:
            raise RuntimeError("git cat-file: no blob %s" % sha)
        data = self.p.stdout.read(int(header[2]))
        self.p.stdout.read(1)
        return data


def remove(path):
    """Removes whatever is at path (file, link or directory tree) without following links."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def make_parents(path):
    """Makes path's parent directories real directories: links or files in the way are removed."""
    parts = path.split(b"/")[:-1]
    cur = b""
    for part in parts:
        cur = part if not cur else cur + b"/" + part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur)
            continue
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(cur)
            os.mkdir(cur)


def write_entry(path, mode, data):
    """Writes one tree entry byte-exact at path, replacing whatever is there."""
    make_parents(path)
    remove(path)
    if mode == "120000":
        os.symlink(data, path)
        return
    if mode == "160000":  # a submodule: an empty directory, as git checks it out
        os.mkdir(path)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if mode == "100755" else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def main():
    global infradev_canaries
    sys.path.insert(0, IN)
    import infradev_canaries  # staged beside this script (package canary)

    with open(os.path.join(IN, "apply.json"), "rb") as f:
        cfg = json.load(f)
    base = cfg["base"]
    head = git("rev-parse", "HEAD").decode().strip()
    if head != base:
        print("repository is at %s, not at the base commit %s" % (head, base))
        return EXIT_NOT_AT_BASE

    # The official tree: base plus the official test patch, in a scratch index.
    official_env = dict(GIT_ENV, GIT_INDEX_FILE="/tmp/infradev-official.index")
    try:
        git("read-tree", base, env=official_env)
        if os.path.getsize(os.path.join(IN, "tests.patch")) > 0:
            git("apply", "--cached", os.path.join(IN, "tests.patch"), env=official_env)
        official = tree_entries(git("ls-files", "-s", "-z", env=official_env))
        changed_by_tests = set(p for p in git("diff-index", "--cached", "-z", "--name-only", base,
                                              env=official_env).split(b"\0") if p)
    except subprocess.CalledProcessError:
        print("the official test patch does not apply at the base commit")
        return EXIT_TESTS_DO_NOT_APPLY
    git("reset", "-q")
    if cfg.get("reference"):
        try:
            write_reference(base, official_env)
        except subprocess.CalledProcessError:
            print("the gold patch does not apply over the official tests")
            return EXIT_GOLD_DOES_NOT_APPLY

    roots = [r.encode() for r in cfg["test_roots"]]
    official_files = set(p.encode() for p in cfg["official"])
    config_names = set(n.encode() for n in cfg["runner_config"])

    def owned(p):
        return (p in official_files or os.path.basename(p) in config_names
                or any(p == r or p.startswith(r + b"/") for r in roots))

    desired = {p: e for p, e in official.items() if owned(p)}
    before = snapshot()

    patch = os.path.join(IN, "submission.patch")
    if os.path.getsize(patch) > 0:
        for args in (("apply", "--check", "--verbose", patch), ("apply", patch)):
            if subprocess.run(("git",) + args, env=GIT_ENV).returncode != 0:
                return EXIT_PATCH_DOES_NOT_APPLY

    # From here on the work tree holds the submission: anything that goes wrong is its doing.
    try:
        if cfg.get("cheat"):
            install_cheat(cfg["cheat"], owned)
        blobs = Blobs()
        after = snapshot()
        for p, sig in after.items():
            if owned(p) and p not in desired and (p not in before or before[p] != sig or p in changed_by_tests):
                remove(p)
        for p, (mode, sha) in desired.items():
            if p in changed_by_tests or p not in after or before.get(p) != after.get(p):
                write_entry(p, mode, blobs.read(sha))
        # Test modules the submission adds elsewhere never run (only the official ids do);
        # removed, they cannot serve as code that the scan would excuse as a test.
        for p in after:
            if p not in before and not owned(p) and is_test_module(p) and os.path.lexists(p):
                remove(p)
        by_file = {}
        for i, c in enumerate(cfg.get("canaries") or []):
            by_file.setdefault(c["file"], []).append((i, c))
        planted = {}
        for path, items in sorted(by_file.items()):
            with open(path.encode(), "rb") as f:
                src = f.read()
            new, ids = infradev_canaries.plant(path, src, items)
            fd = os.open(path.encode(), os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
            with os.fdopen(fd, "wb") as f:
                f.write(new)
            planted.update(ids)
        with open(os.path.join(OUT, "canaries.json"), "w") as f:
            json.dump({str(i): nodeid for i, nodeid in sorted(planted.items())}, f)
        write_changes(before, owned, blobs, cfg["max_changes"], tree_entries(git("ls-tree", "-r", "-z", base)))
    except Exception:
        traceback.print_exc()
        print("the harness could not put the official tests in place over this patch")
        return EXIT_SETUP_OVER_PATCH
    return 0


def write_reference(base, official_env):
    """Writes the gold tree's difference from the base commit under OUT/reference."""
    objects = "/tmp/infradev-reference-objects"
    os.makedirs(objects, exist_ok=True)
    env = dict(official_env, GIT_INDEX_FILE="/tmp/infradev-reference.index", GIT_OBJECT_DIRECTORY=objects,
               GIT_ALTERNATE_OBJECT_DIRECTORIES=os.path.abspath(git("rev-parse", "--git-path", "objects").decode().strip()))
    shutil.copyfile("/tmp/infradev-official.index", "/tmp/infradev-reference.index")
    git("apply", "--cached", os.path.join(IN, "gold.patch"), env=env)
    tree = tree_entries(git("ls-files", "-s", "-z", env=env))
    changed = [p for p in git("diff-index", "--cached", "-z", "--name-only", "--no-renames", base, env=env).split(b"\0") if p]
    out = os.path.join(OUT.encode(), b"reference")
    os.mkdir(out)
    deleted = []
    blobs = subprocess.Popen(["git", "cat-file", "--batch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    for p in changed:
        if p not in tree:
            deleted.append(p)
            continue
        mode, sha = tree[p]
        blobs.stdin.write(sha.encode() + b"\n")
        blobs.stdin.flush()
        header = blobs.stdout.readline().split()
        data = blobs.stdout.read(int(header[2]))
        blobs.stdout.read(1)
        target = os.path.join(out, p)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if mode == "120000":
            os.symlink(data, target)
        else:
            with open(target, "wb") as f:
                f.write(data)
            os.chmod(target, 0o755 if mode == "100755" else 0o644)
    blobs.stdin.close()
    blobs.wait()
    with open(os.path.join(OUT, "reference.deleted"), "wb") as f:
        f.write(b"".join(p + b"\0" for p in deleted))


def is_test_module(p):
    name = os.path.basename(p)
    return name.endswith(b".py") and (name.startswith(b"test_") or name.endswith(b"_test.py"))


def install_cheat(cheat, owned):
    """Adds an in-process cheat to every top-level package, as a submission could: a module
    beside the package's code, imported at the end of its __init__.py."""
    name = cheat["module"].encode()
    installed = 0
    for parent in (b".", b"src"):
        if not os.path.isdir(parent):
            continue
        for entry in sorted(os.listdir(parent)):
            pkg = os.path.normpath(os.path.join(parent, entry))
            init = os.path.join(pkg, b"__init__.py")
            if entry.startswith(b".") or owned(pkg) or owned(init) or not os.path.isfile(init):
                continue
            with open(os.path.join(pkg, name + b".py"), "wb") as f:
                f.write(cheat["source"].encode())
            with open(init, "ab") as f:
                f.write(b"\nfrom . import " + name + b"  # noqa\n")
            installed += 1
    if not installed:
        raise RuntimeError("no top-level package to add the cheat to")


def write_changes(before, owned, blobs, limit, base_tree):
    """Writes changes.tar: what the submission left on disk outside the harness-owned paths.
    Members are named by the hex of the path's bytes: n/ new content, l/ a link's target,
    b/ the base content of a changed file, d/ a deleted path; "over" if they exceed limit."""
    after = snapshot()
    total = 0
    with open(os.path.join(OUT, "changes.tar"), "wb") as raw, \
            tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        def full():
            # The archive's own bytes count too (a member's headers, a long name's pax record):
            # many small files must not make it larger than the harness reads.
            return raw.tell() > limit

        for p in sorted(after):
            if owned(p) or before.get(p) == after[p]:
                continue
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                data, kind = os.readlink(p), "l"
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    data = f.read(limit - total + 1)
                kind = "n"
            else:
                continue
            base = blobs.read(base_tree[p][1]) if p in base_tree and kind == "n" else None
            total += len(data) + len(base or b"")
            if total > limit or full():
                add("over", b"")
                return
            add(kind + "/" + p.hex(), data)
            if base is not None:
                add("b/" + p.hex(), base)
        for p in sorted(before):
            if p not in after and not owned(p):
                if full():
                    add("over", b"")
                    return
                add("d/" + p.hex(), b"")


if __name__ == "__main__":
    os.chdir(os.environ.get("INFRADEV_REPO", "."))
    sys.exit(main())
