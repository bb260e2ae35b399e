"""Bzlmod module extension (Bazel 7+): the same repositories as //tools:workspace.bzl."""

load("//tools/private:repositories.bzl", "infradev_predictions", "infradev_tool")
load("//tools/private:suite.bzl", "HARNESS_DIGEST", "TASKS")

def _infradev_impl(_module_ctx):
    infradev_tool(name = "infradev_tool", harness_digest = HARNESS_DIGEST)
    infradev_predictions(name = "infradev_predictions", tasks = TASKS)

infradev = module_extension(
    implementation = _infradev_impl,
    doc = "Declares @infradev_tool and @infradev_predictions.",
)
