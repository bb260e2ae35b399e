"""infradev_task_test: a task as a test target whose action is `infradev run-task`."""

load(":providers.bzl", "InfradevEnvDefinitionInfo", "InfradevImageInfo")

# An upstream task's image is its framework environment plus its repository at the base
# commit: run-task builds it (cached layers come from INFRADEV_STORE, the repository from
# INFRADEV_GIT_MIRRORS, both passed with --test_env), and derives the task's files the same way.
# It reads the environments' definitions from a staged copy (links followed), as it reads them
# from a checkout: the runfiles tree holds links, which a copy step would copy as links.
_UPSTREAM_IMAGE = '--environments "$TEST_TMPDIR/environments"'
_UPSTREAM_STORE = '--store "${{INFRADEV_STORE:-$TEST_TMPDIR/store}}"'

def _runfile(f):
    # Tests start in the main repository's runfiles directory, where a file's short path
    # resolves (external repositories' files as ../<repo>/...).
    return f.short_path

def _dir(f):
    return f.short_path.rsplit("/", 1)[0]

def _quote(s):
    return "'" + s.replace("'", "'\\''") + "'"

def _relative(files, dir, what):
    out = []
    for f in files:
        if not f.short_path.startswith(dir + "/"):
            fail("%s %s is outside %s" % (what, f.short_path, dir))
        out.append(_quote(f.short_path[len(dir) + 1:]))
    return " ".join(out)

def _task_test_impl(ctx):
    spec = ctx.file.spec
    probes = [f for f in ctx.files.probes if f.basename == "probes.yaml"]
    if len(probes) != 1:
        fail("%s: probes must hold exactly one probes.yaml, got %d" % (ctx.label, len(probes)))
    env = ctx.attr.environment
    if ctx.attr.upstream:
        if InfradevEnvDefinitionInfo not in env:
            fail("%s: an upstream task's environment must be an infradev_env_definition" % ctx.label)
        envs_root = _dir(env[InfradevEnvDefinitionInfo].spec).rsplit("/", 1)[0]
        env_files = env[InfradevEnvDefinitionInfo].files.to_list()
        stage_envs = 'stage %s "$TEST_TMPDIR/environments" %s' % (_quote(envs_root), _relative(env_files, envs_root, "environment file"))
        image_args = _UPSTREAM_IMAGE
        store_args = _UPSTREAM_STORE.format()
    else:
        if InfradevImageInfo not in env:
            fail("%s: environment must be an infradev_env_image" % ctx.label)
        img = env[InfradevImageInfo]
        image_args = '--layout "%s" --image "$(cat "%s")"' % (_runfile(img.layout), _runfile(img.digest))
        store_args = ""
        stage_envs = ""
    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    ctx.actions.expand_template(
        template = ctx.file._template,
        output = script,
        substitutions = {
            "%INFRADEV%": _runfile(ctx.executable._infradev),
            "%TASK%": _dir(spec),
            "%TASK_FILES%": _relative([spec] + ctx.files.srcs, _dir(spec), "task file"),
            "%PROBES%": _dir(probes[0]),
            "%PROBE_FILES%": _relative(ctx.files.probes, _dir(probes[0]), "probe file"),
            "%IMAGE%": image_args,
            "%STAGE_ENVIRONMENTS%": stage_envs,
            "%STORE%": store_args,
            "%PATCH%": _runfile(ctx.file.submission),
            "%DIGEST%": _runfile(ctx.file.submission_digest),
        },
        is_executable = True,
    )
    image = ctx.files.environment
    files = [spec, ctx.file.submission, ctx.file.submission_digest, ctx.executable._infradev] + ctx.files.srcs + ctx.files.probes + image
    return [DefaultInfo(executable = script, runfiles = ctx.runfiles(files = files))]

_task_test = rule(
    implementation = _task_test_impl,
    test = True,
    doc = "Runs `infradev run-task` on one task and one submission; passes when resolved.",
    attrs = {
        "spec": attr.label(doc = "The task's task.yaml.", allow_single_file = ["task.yaml"], mandatory = True),
        "srcs": attr.label_list(doc = "The task's other files: instruction, PR description, gold and tests patches.", allow_files = True),
        "probes": attr.label(doc = "The task's probes: a filegroup holding probes.yaml and the probe files.", allow_files = True, mandatory = True),
        "environment": attr.label(doc = "The task's environment: an infradev_env_image target, or for an upstream task an infradev_env_definition.", mandatory = True),
        "upstream": attr.bool(doc = "The task references an upstream change: its image and files are built by run-task from the environment's definition, the store and the mirrors.", default = False),
        "submission": attr.label(doc = "The patch to score (a unified diff; may be empty).", allow_single_file = True, mandatory = True),
        "submission_digest": attr.label(doc = "The submission's digest as the user gave it (sha256:...): run-task refuses a patch whose bytes differ.", allow_single_file = True, mandatory = True),
        "_infradev": attr.label(doc = "The InfraDev CLI.", default = "@infradev_tool//:infradev", executable = True, cfg = "exec", allow_single_file = True),
        "_template": attr.label(doc = "The test's script, filled in per task.", default = Label("//tools/private:task_test.sh.tpl"), allow_single_file = True),
    },
)

# Bazel's timeout classes, in seconds.
_TIMEOUTS = [("short", 60), ("moderate", 300), ("long", 900), ("eternal", 3600)]

def infradev_task_test(name, spec, probes, environment, submission, submission_digest = None, srcs = [], gpus = 0, cpus = 1, memory = "", timeout_seconds = 0, tags = [], upstream = False, **kwargs):
    """A task as a test target.

    Args:
      name: the task id.
      spec: the task.yaml.
      probes: filegroup of the task's probes directory.
      environment: the infradev_env_image the task runs in.
      submission: the patch file to score (e.g. @infradev_predictions//:ID.patch).
      submission_digest: the file holding its digest as given (default: the submission's label
        with .digest for .patch, as @infradev_predictions writes it).
      srcs: the task's other agent-facing files.
      gpus: GPUs the task needs; sets the `resources:gpu:N` tag (Bazel 7+ schedules it against
        --local_extra_resources=gpu=N) and the `gpu` execution property for remote pools.
      cpus: CPUs the task's sandbox gets; the `cpu:N` tag reserves them locally.
      memory: the task's memory limit, passed to remote pools as an execution property.
      timeout_seconds: the task's own timeouts summed; picks Bazel's timeout class.
      tags: extra tags.
      upstream: the task references an upstream change (repo.merge_commit): `environment` is
        then an infradev_env_definition, and run-task builds the image and derives the files
        (pass INFRADEV_STORE and INFRADEV_GIT_MIRRORS with --test_env).
      **kwargs: common test attributes (visibility, flaky, ...).
    """
    if submission_digest == None:
        if not submission.endswith(".patch"):
            fail("infradev_task_test(%s): submission %s does not end in .patch: give submission_digest" % (name, submission))
        submission_digest = submission[:-len(".patch")] + ".digest"
    if gpus < 0 or cpus < 1:
        fail("infradev_task_test(%s): gpus must be >= 0 and cpus >= 1" % name)
    if "timeout" in kwargs or "size" in kwargs:
        fail("infradev_task_test(%s): the timeout comes from the task's timeouts (timeout_seconds)" % name)
    timeout = "eternal"
    for cls, secs in _TIMEOUTS:
        if timeout_seconds <= secs:
            timeout = cls
            break
    exec_properties = {"cpus": str(cpus), "gpus": str(gpus), "Pool": "gpu" if gpus else "cpu"}
    if memory:
        exec_properties["memory"] = memory

    # Attempts run in runc over overlayfs, which Bazel's own sandbox cannot nest: no-sandbox
    # keeps them cacheable (unlike `local`). Remote executors must run them privileged.
    all_tags = ["infradev", "no-sandbox", "cpu:%d" % cpus] + tags
    if gpus:
        all_tags += ["gpu", "resources:gpu:%d" % gpus]
    _task_test(
        name = name,
        upstream = upstream,
        spec = spec,
        srcs = srcs,
        probes = probes,
        environment = environment,
        submission = submission,
        submission_digest = submission_digest,
        timeout = timeout,
        tags = all_tags,
        exec_properties = exec_properties,
        **kwargs
    )
