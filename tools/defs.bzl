"""Public Bazel API of InfraDev: environment images and task tests.

    load("//tools:defs.bzl", "infradev_env_image", "infradev_task_test")

`infradev_env_image` builds an environment's content-addressed OCI image layout (the role
rules_oci plays elsewhere, done by InfraDev's own image tool on go-containerregistry).
`infradev_task_test` makes a task a test target whose action is exactly `infradev run-task`,
with the task spec, probes, image, runner and submission as declared inputs, so Bazel's
content-addressed cache and remote execution apply to scoring. An upstream task's image (its
framework environment plus its repository at the base commit) is built by the test itself from
`infradev_env_definition` files, a shared store and git mirrors.
"""

load("//tools/private:env_image.bzl", _infradev_env_definition = "infradev_env_definition", _infradev_env_image = "infradev_env_image")
load("//tools/private:task_test.bzl", _infradev_task_test = "infradev_task_test")

infradev_env_image = _infradev_env_image
infradev_env_definition = _infradev_env_definition
infradev_task_test = _infradev_task_test
