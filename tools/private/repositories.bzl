"""Repository rules: the InfraDev CLI built with the host's Go, and the submissions to score.

Neither needs rules_go, so the same //tasks/... and //environments/... targets load on Debian's
offline Bazel 4.2.3 (WORKSPACE mode) and on Bazel 7+ (through the module extension).
"""

def _tool_impl(rctx):
    root = rctx.path(Label("//:go.mod")).dirname
    if hasattr(rctx, "watch_tree"):
        # Bazel 7.1+: rebuild whenever a harness file changes.
        rctx.watch_tree(root.get_child("harness"))
    go = rctx.which("go")
    if go == None:
        fail("infradev_tool: no `go` on PATH; install Go (see README) or put it on PATH")
    env = {
        # Offline: modules come from the module cache that `go mod download` filled.
        "GOPROXY": "off",
        "CGO_CFLAGS": "-O2 -g -Wno-deprecated-declarations",
    }

    # Built as tools/demo builds it, so the binary (whose digest keys every result) is the same
    # one, and `bazel test` and `infradev eval` share results.
    res = rctx.execute(
        [go, "build", "-trimpath", "-buildvcs=false", "-o", str(rctx.path("infradev")), "./harness/cmd/infradev"],
        working_directory = str(root),
        environment = env,
        timeout = 1200,
        quiet = True,
    )
    if res.return_code != 0:
        fail("infradev_tool: go build failed (%d):\n%s%s" % (res.return_code, res.stdout, res.stderr))
    rctx.file("BUILD.bazel", """# The InfraDev CLI, built from this workspace's harness/ by the host Go.
package(default_visibility = ["//visibility:public"])

exports_files(["infradev"])
""")

infradev_tool = repository_rule(
    implementation = _tool_impl,
    doc = "Builds the InfraDev CLI from this workspace with the host Go (no rules_go).",
    attrs = {
        "harness_digest": attr.string(
            doc = "Digest of harness/, go.mod and go.sum (written by `infradev gen`): a change " +
                  "rebuilds the CLI on Bazel versions without repository_ctx.watch_tree.",
            mandatory = True,
        ),
    },
    environ = ["PATH", "GOROOT", "GOPATH", "GOMODCACHE"],
)

def _predictions_impl(rctx):
    source = rctx.os.environ.get("INFRADEV_PREDICTIONS", "")
    model = rctx.os.environ.get("INFRADEV_MODEL", "")
    patches = {}
    if source:
        # A label is watched: editing the file re-reads it. A plain path is read once per
        # value of INFRADEV_PREDICTIONS (`bazel sync --only=infradev_predictions` re-reads it).
        path = rctx.path(Label(source)) if source.startswith("//") or source.startswith("@") else rctx.path(source)
        if not path.exists:
            fail("INFRADEV_PREDICTIONS: %s does not exist" % source)
        for n, line in enumerate(rctx.read(path).splitlines()):
            if not line.strip():
                continue
            p = json.decode(line)
            for field in ["instance_id", "model_name_or_path", "model_patch"]:
                if field not in p:
                    fail("%s:%d: %s is required" % (source, n + 1, field))
            if model and p["model_name_or_path"] != model:
                continue
            iid = p["instance_id"]
            if iid in patches:
                fail("%s:%d: a second prediction for %s; set INFRADEV_MODEL to pick one model" % (source, n + 1, iid))
            patches[iid] = p["model_patch"] or ""
        unknown = [i for i in patches if i not in rctx.attr.tasks]
        if unknown:
            fail("%s: predictions for unknown tasks: %s" % (source, ", ".join(sorted(unknown))))

    # Upstream tasks whose gold cannot be derived here (no mirror, nothing stored): their patch
    # is an action that fails with the reason, so only their targets fail, with that message.
    missing = []
    for task_id, gold in rctx.attr.tasks.items():
        if source:
            # A task the file has no prediction for is scored as an empty submission.
            content = patches.get(task_id, "")
        elif gold.startswith("upstream:"):
            content, why = _derived_gold(rctx, gold[len("upstream:"):])
            if content == None:
                rctx.file(task_id + ".why", why)
                missing.append(task_id)
                continue
        else:
            content = rctx.read(rctx.path(Label(gold)))
        rctx.file(task_id + ".patch", content)
    rules = "".join([_UNDERIVED.format(id = i) for i in sorted(missing)])
    rctx.file("BUILD.bazel", """# Submissions to score, one patch per task: from {source} (model {model}).
package(default_visibility = ["//visibility:public"])

exports_files(glob(["*.patch"]))
{rules}""".format(source = source or "each task's gold.patch", model = model or "any", rules = rules))

_UNDERIVED = """
genrule(
    name = "{id}.underived",
    srcs = ["{id}.why"],
    outs = ["{id}.patch"],
    cmd = "cat $< >&2; exit 1",
)
"""

def _derived_gold(rctx, task_dir):
    # An upstream task's gold patch is derived from its commits: from the store, else from a
    # mirror (INFRADEV_STORE, INFRADEV_GIT_MIRRORS), never checked in. Returns (patch, None),
    # or (None, why) when it cannot be derived here.
    root = rctx.path(Label("//:go.mod")).dirname
    tool = rctx.path(Label("@infradev_tool//:infradev"))
    store = rctx.os.environ.get("INFRADEV_STORE", str(root) + "/.infradev/store")
    res = rctx.execute([tool, "--store", store, "task", "derive", "--print", "gold", str(root) + "/" + task_dir], quiet = True)
    if res.return_code != 0:
        return None, "the gold patch of %s cannot be derived: %s\nPass --repo_env=INFRADEV_GIT_MIRRORS=... (or INFRADEV_STORE holding its derivation), or predictions with --repo_env=INFRADEV_PREDICTIONS.\n" % (task_dir, res.stderr.strip())
    return res.stdout, None

infradev_predictions = repository_rule(
    implementation = _predictions_impl,
    doc = "One patch per task, from the predictions file named by --repo_env=INFRADEV_PREDICTIONS " +
          "(a label or an absolute path; INFRADEV_MODEL picks one model's lines), else each task's gold.",
    attrs = {
        "tasks": attr.string_dict(doc = "Task id -> label of its gold.patch, or upstream:<task dir> for a task whose gold is derived (written by `infradev gen`).", mandatory = True),
    },
    environ = ["INFRADEV_PREDICTIONS", "INFRADEV_MODEL", "INFRADEV_STORE", "INFRADEV_GIT_MIRRORS", "INFRADEV_GIT_MIRRORS_FILE"],
)
