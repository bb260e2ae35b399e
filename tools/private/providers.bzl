"""Providers of InfraDev's rules."""

InfradevImageInfo = provider(
    doc = "An environment's OCI image: its layout directory and the file holding its manifest digest.",
    fields = {
        "layout": "File: the OCI image layout directory (NAME.oci).",
        "digest": "File: the manifest digest (sha256:...) as the CLI wrote it.",
    },
)

InfradevEnvDefinitionInfo = provider(
    doc = "The files that define an environment and those it stacks on (`from:`).",
    fields = {
        "spec": "File: this environment's env.yaml.",
        "files": "depset of File: every defining file, this environment's and its bases'.",
    },
)
