package bazelgen_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/bazelgen"
	"github.com/infradev/infradev/harness/internal/testenv"
)

// TestCheckedInFilesAreCurrent: the repository's generated Bazel files match its specs and
// harness sources (run `infradev gen` when this fails).
func TestCheckedInFilesAreCurrent(t *testing.T) {
	root := testenv.RepoRoot(t)
	files, err := bazelgen.Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range bazelgen.Stale(root, files) {
		t.Errorf("stale generated file (run infradev gen): %s", f.Path)
	}
}

// TestGenerateFollowsTheSpec: a task's BUILD file carries what its task.yaml says, and a
// change to the spec or to a harness source makes the checked-in files stale.
func TestGenerateFollowsTheSpec(t *testing.T) {
	root := testenv.RepoRoot(t)
	work := t.TempDir()
	for _, d := range []string{"tasks/demo/minitron-0002", "probes/demo/minitron-0002", "harness/digest"} {
		if err := os.CopyFS(filepath.Join(work, d), os.DirFS(filepath.Join(root, d))); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		data, _ := os.ReadFile(filepath.Join(root, f))
		os.WriteFile(filepath.Join(work, f), data, 0o644)
	}
	spec := filepath.Join(work, "tasks/demo/minitron-0002/task.yaml")
	data, _ := os.ReadFile(spec)
	os.WriteFile(spec, []byte(strings.Replace(string(data), "gpus: {count: 0}", "gpus: {count: 2}", 1)), 0o644)

	files, err := bazelgen.Generate(work)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]string{}
	for _, f := range files {
		byPath[f.Path] = string(f.Data)
	}
	build := byPath["tasks/demo/minitron-0002/BUILD.bazel"]
	for _, want := range []string{
		`name = "minitron-0002"`, `gpus = 2`, `memory = "1GiB"`, `probes = "//probes/demo/minitron-0002"`,
		`submission = "@infradev_predictions//:minitron-0002.patch"`, `environment = "//environments/demo"`,
		`timeout_seconds = 780`, // apply 60s + tests 300s + probes 300s + 120s start-up
	} {
		if !strings.Contains(build, want) {
			t.Errorf("task BUILD lacks %s:\n%s", want, build)
		}
	}
	if p := byPath["probes/demo/minitron-0002/BUILD.bazel"]; !strings.Contains(p, `visibility = ["//tasks/demo/minitron-0002:__pkg__"]`) {
		t.Errorf("probes BUILD is not private to the task's test:\n%s", p)
	}
	if s := byPath["tools/private/suite.bzl"]; !strings.Contains(s, `"minitron-0002": "//tasks/demo/minitron-0002:gold.patch"`) {
		t.Errorf("suite.bzl lacks the task:\n%s", s)
	}
	for _, f := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(work, f.Path)), 0o755)
		os.WriteFile(filepath.Join(work, f.Path), f.Data, 0o644)
	}
	if stale := bazelgen.Stale(work, files); len(stale) != 0 {
		t.Fatalf("just written, yet stale: %s", stale[0].Path)
	}
	os.WriteFile(filepath.Join(work, "harness/digest/extra.go"), []byte("package digest\n"), 0o644)
	again, err := bazelgen.Generate(work)
	if err != nil {
		t.Fatal(err)
	}
	if stale := bazelgen.Stale(work, again); len(stale) != 1 || stale[0].Path != "tools/private/suite.bzl" {
		t.Errorf("after a harness change, %d stale files, want only tools/private/suite.bzl", len(stale))
	}
}
