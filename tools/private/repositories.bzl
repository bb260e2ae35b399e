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
    # The CLI writes every patch file itself, byte for byte: a patch read into a Starlark string
    # and written back would have its non-ASCII bytes re-encoded by Bazel 4 (Latin-1 in, UTF-8
    # out), and no longer apply. This rule only hands over names and paths.
    root = rctx.path(Label("//:go.mod")).dirname
    tool = rctx.path(Label("@infradev_tool//:infradev"))
    store = rctx.os.environ.get("INFRADEV_STORE", str(root) + "/.infradev/store")
    args = [tool, "--store", store, "bazel-submissions", "--out", str(rctx.path("."))]
    source = rctx.os.environ.get("INFRADEV_PREDICTIONS", "")
    if source:
        # A label is watched: editing the file re-reads it. A plain path is read once per
        # value of INFRADEV_PREDICTIONS (`bazel sync --only=infradev_predictions` re-reads it).
        path = rctx.path(Label(source)) if source.startswith("//") or source.startswith("@") else rctx.path(source)
        if not path.exists:
            fail("INFRADEV_PREDICTIONS: %s does not exist" % source)
        args += ["--predictions", str(path)]
        if hasattr(rctx, "watch"):
            rctx.watch(path)  # Bazel 7.1+: a plain path is watched too
    model = rctx.os.environ.get("INFRADEV_MODEL", "")
    if model:
        args += ["--model", model]
    for task_id, gold in sorted(rctx.attr.tasks.items()):
        if gold.startswith("upstream:"):
            ref = "upstream:" + str(root) + "/" + gold[len("upstream:"):]
        else:
            ref = str(rctx.path(Label(gold)))
        args.append("%s=%s" % (task_id, ref))
    res = rctx.execute(args, quiet = True, timeout = 1200)
    if res.return_code != 0:
        fail("infradev bazel-submissions (%d): %s" % (res.return_code, res.stderr.strip()))

infradev_predictions = repository_rule(
    implementation = _predictions_impl,
    doc = "One patch per task (ID.patch, with its digest in ID.digest), written byte for byte by " +
          "`infradev bazel-submissions` from the predictions file named by " +
          "--repo_env=INFRADEV_PREDICTIONS (a label or an absolute path; INFRADEV_MODEL picks one " +
          "model's lines), else each task's gold.",
    attrs = {
        "tasks": attr.string_dict(doc = "Task id -> label of its gold.patch, or upstream:<task dir> for a task whose gold is derived (written by `infradev gen`).", mandatory = True),
    },
    environ = ["INFRADEV_PREDICTIONS", "INFRADEV_MODEL", "INFRADEV_STORE", "INFRADEV_GIT_MIRRORS", "INFRADEV_GIT_MIRRORS_FILE"],
)
