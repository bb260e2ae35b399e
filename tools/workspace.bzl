"""WORKSPACE-mode setup (Bazel 4.2.3 here): `load` this from WORKSPACE and call it."""

load("//tools/private:repositories.bzl", "infradev_predictions", "infradev_tool")
load("//tools/private:suite.bzl", "HARNESS_DIGEST", "TASKS")

def infradev_repositories():
    """Declares @infradev_tool (the CLI, built by the host Go) and @infradev_predictions."""
    infradev_tool(name = "infradev_tool", harness_digest = HARNESS_DIGEST)
    infradev_predictions(name = "infradev_predictions", tasks = TASKS)
