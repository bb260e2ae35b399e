module github.com/infradev/infradev

go 1.26.8

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/bazelbuild/remote-apis v0.0.0-20260908115904-76ddd98e1f92
	github.com/bluekeyes/go-gitdiff v0.9.0
	github.com/gofrs/flock v0.13.2
	github.com/google/go-cmp v0.7.0
	github.com/google/go-containerregistry v0.22.1
	github.com/joshdk/go-junit v1.0.0
	github.com/mattn/go-isatty v0.0.24
	github.com/opencontainers/runtime-spec v1.3.0
	github.com/rogpeppe/go-internal v1.16.0
	github.com/sashabaranov/go-openai v1.43.0
	github.com/schollz/progressbar/v3 v3.19.1
	github.com/spf13/cobra v1.10.2
	golang.org/x/sys v0.49.0
	google.golang.org/protobuf v1.36.11
	gopkg.in/yaml.v3 v3.0.1
)

require (
	cloud.google.com/go/longrunning v0.8.0 // indirect
	github.com/bazelbuild/bazel-gazelle v0.45.0 // indirect
	github.com/bazelbuild/buildtools v0.0.0-20260904073137-eaa4d125b423 // indirect
	github.com/bmatcuk/doublestar/v4 v4.9.1 // indirect
	github.com/docker/cli v29.7.2+incompatible // indirect
	github.com/docker/docker-credential-helpers v0.9.3 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/google/safeopen v0.0.0-20260327150837-43626d6f4685 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	golang.org/x/mod v0.39.0 // indirect
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/term v0.45.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	golang.org/x/tools v0.49.0 // indirect
	golang.org/x/tools/go/vcs v0.1.0-deprecated // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260203192932-546029d2fa20 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260203192932-546029d2fa20 // indirect
	google.golang.org/grpc v1.76.0 // indirect
	gotest.tools/v3 v3.5.2 // indirect
)

tool (
	github.com/bazelbuild/bazel-gazelle/cmd/gazelle
	github.com/bazelbuild/buildtools/buildifier
)
