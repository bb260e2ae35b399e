"""infradev_env_image: an environment's OCI image layout, built by `infradev env build --locked`."""

load(":providers.bzl", "InfradevEnvDefinitionInfo", "InfradevImageInfo")

def _env_image_impl(ctx):
    layout = ctx.actions.declare_directory(ctx.label.name + ".oci")
    digest = ctx.actions.declare_file(ctx.label.name + ".digest")
    ctx.actions.run_shell(
        inputs = ctx.files.srcs + [ctx.file.spec, ctx.file.lock],
        tools = [ctx.executable._infradev],
        outputs = [layout, digest],
        # The store is scratch: only the layout and the manifest digest leave the action.
        command = """set -euo pipefail
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
"$1" --store "$store/store" --cache "$store/cache" env build --locked --digest-file "$4" "$2"
cp -R "$store/store/oci/." "$3"
""",
        arguments = [ctx.executable._infradev.path, ctx.file.spec.dirname, layout.path, digest.path],
        mnemonic = "InfradevEnvImage",
        progress_message = "Building environment image %s" % ctx.label,
        # The Debian and apt layers come from a pinned mirror (env.lock pins their bytes), and
        # building root file systems needs the host's mmdebstrap and root: no sandbox.
        execution_requirements = {"no-sandbox": "1", "requires-network": "1"},
        use_default_shell_env = True,
    )
    return [
        DefaultInfo(files = depset([layout, digest]), runfiles = ctx.runfiles(files = [layout, digest])),
        InfradevImageInfo(layout = layout, digest = digest),
        OutputGroupInfo(layout = depset([layout]), digest = depset([digest])),
    ]

_env_image = rule(
    implementation = _env_image_impl,
    doc = "Builds an environment's OCI image layout; outputs NAME.oci/ and NAME.digest.",
    attrs = {
        "spec": attr.label(doc = "The environment's env.yaml.", allow_single_file = ["env.yaml"], mandatory = True),
        "lock": attr.label(doc = "The environment's env.lock: the build fails unless it reproduces it.", allow_single_file = ["env.lock"], mandatory = True),
        "srcs": attr.label_list(doc = "Every file the environment's steps read (git sources, copied files).", allow_files = True),
        "_infradev": attr.label(doc = "The InfraDev CLI.", default = "@infradev_tool//:infradev", executable = True, cfg = "exec", allow_single_file = True),
    },
)

def infradev_env_image(name, spec = "env.yaml", lock = "env.lock", srcs = [], **kwargs):
    """An environment image target: the OCI layout of `spec`, held to `lock`.

    Args:
      name: target name; by convention the environment's name.
      spec: the env.yaml file.
      lock: the env.lock file; required, so every image Bazel builds is pinned.
      srcs: files the steps read (sources of git and copy steps).
      **kwargs: common attributes (visibility, tags).
    """
    if not name:
        fail("infradev_env_image: name is required")
    if spec in srcs or lock in srcs:
        fail("infradev_env_image(%s): spec and lock are given apart; leave them out of srcs" % name)
    _env_image(name = name, spec = spec, lock = lock, srcs = srcs, **kwargs)

def _env_definition_impl(ctx):
    specs = [f for f in ctx.files.srcs if f.basename == "env.yaml" and f.dirname == ctx.label.package]
    if len(specs) != 1:
        fail("%s: the environment's files must hold exactly one env.yaml in %s" % (ctx.label, ctx.label.package))
    files = depset(ctx.files.srcs, transitive = [d[InfradevEnvDefinitionInfo].files for d in ctx.attr.deps])
    return [
        DefaultInfo(files = files),
        InfradevEnvDefinitionInfo(spec = specs[0], files = files),
    ]

_env_definition = rule(
    implementation = _env_definition_impl,
    doc = "The files that define an environment, with those of the environments it stacks on.",
    attrs = {
        "srcs": attr.label_list(doc = "This environment's files: env.yaml, its locks and sources.", allow_files = True),
        "deps": attr.label_list(doc = "The definitions of the environments it stacks on (`from:`).", providers = [InfradevEnvDefinitionInfo]),
    },
)

def infradev_env_definition(name, deps = [], **kwargs):
    """The files that define an environment, with those of the environments it stacks on.

    An upstream task's test builds its image from them: env.yaml, its locks and sources.

    Args:
      name: target name; by convention "definition".
      deps: the definitions of the environments this one stacks on (`from:`).
      **kwargs: common attributes (visibility, tags).
    """
    _env_definition(
        name = name,
        srcs = native.glob(["**"], exclude = ["BUILD.bazel", "**/__pycache__/**"]),
        deps = deps,
        **kwargs
    )
