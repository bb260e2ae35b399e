package task_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/specfile"
	"github.com/infradev/infradev/harness/task"
)

const goodYAML = `schema: infradev.task/v1
id: demo-0001
project: demo
kind: "checkpointing"
repo:
  path: /workspace/demo
  base_commit: 327d98af9150e1fa4a79b514932950b3ed436749
environment: demo
instruction: instruction.md
pr_description: pr.md
gold: gold.patch
tests:
  runner: pytest
  patch: tests.patch
  fail_to_pass: [tests/test_a.py::test_new]
  pass_to_pass: [tests/test_a.py::TestOld::test_kept]
resources: {cpus: 2, memory: 1GiB, gpus: {count: 0}}
timeouts: {apply: 60s, tests: 5m, probes: 5m}
`

func writeTask(t *testing.T, yaml string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "demo-0001")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"instruction.md", "pr.md", "gold.patch", "tests.patch"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "task.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadGood(t *testing.T) {
	tk, err := task.Load(writeTask(t, goodYAML))
	if err != nil {
		t.Fatalf("Load() error: %v", err)
	}
	if tk.Resources.MemoryBytes != 1<<30 || tk.Timeouts.TestsD.Minutes() != 5 || tk.Resources.Pids != task.DefaultPids {
		t.Errorf("parsed resources/timeouts wrong: %+v %+v", tk.Resources, tk.Timeouts)
	}
	if got := strings.Join(tk.Tests.IDs(), ","); got != "tests/test_a.py::test_new,tests/test_a.py::TestOld::test_kept" {
		t.Errorf("IDs() = %s", got)
	}
}

func TestLoadReportsEveryBadField(t *testing.T) {
	bad := `schema: infradev.task/v0
id: Demo_1
project: demo
kind: ""
colour: blue
repo:
  path: workspace/demo
  base_commit: abc
environment: demo
instruction: instruction.md
pr_description: ../outside.md
gold: missing.patch
tests:
  runner: unittest
  patch: tests.patch
  fail_to_pass: [not a test id]
  pass_to_pass: [tests/test_a.py::t, tests/test_a.py::t]
resources: {cpus: 0, memory: 64GB, gpus: {count: -1}}
timeouts: {apply: soon, tests: 5m}
`
	_, err := task.Load(writeTask(t, bad))
	var errs specfile.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Load() error = %v, want specfile.Errors", err)
	}
	// field -> line it is on in the file above
	want := map[string]int{
		"schema": 1, "id": 2, "kind": 4, "colour": 5, "repo.path": 7, "repo.base_commit": 8,
		"pr_description": 11, "gold": 12, "tests.runner": 14, "tests.fail_to_pass[0]": 16,
		"tests.pass_to_pass[1]": 17, "resources.cpus": 18, "resources.memory": 18,
		"resources.gpus.count": 18, "timeouts.apply": 19, "timeouts.probes": 19,
	}
	got := map[string]int{}
	for _, e := range errs {
		if !strings.HasSuffix(e.File, "task.yaml") {
			t.Errorf("error %q does not name task.yaml", e)
		}
		got[e.Field] = e.Line
	}
	for field, line := range want {
		if l, ok := got[field]; !ok {
			t.Errorf("no error for field %s; got:\n%v", field, err)
		} else if l != line {
			t.Errorf("field %s reported on line %d, want %d", field, l, line)
		}
	}
	if msg := err.Error(); !strings.Contains(msg, "task.yaml:18: resources.memory: \"64GB\" is not a size") {
		t.Errorf("message lacks file:line: field: detail form:\n%s", msg)
	}
}

func TestLoadUnreadable(t *testing.T) {
	for name, content := range map[string]string{
		"syntax": "schema: [unclosed\n",
		"empty":  "",
		"list":   "- a\n- b\n",
	} {
		_, err := task.Load(writeTask(t, content))
		if err == nil || !strings.Contains(err.Error(), "task.yaml") {
			t.Errorf("%s: error = %v, want one naming task.yaml", name, err)
		}
	}
	if _, err := task.Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "task.yaml") {
		t.Errorf("missing file: error = %v", err)
	}
}

func TestTypeErrorsNameTheField(t *testing.T) {
	y := strings.Replace(goodYAML, "cpus: 2", "cpus: two", 1)
	_, err := task.Load(writeTask(t, y))
	if err == nil || !strings.Contains(err.Error(), "task.yaml:17: resources.cpus") {
		t.Errorf("error = %v, want it at task.yaml:17: resources.cpus", err)
	}
}

func TestRanks(t *testing.T) {
	withRanks := func(ranks, gpus string) string {
		y := strings.Replace(goodYAML, "  pass_to_pass: [tests/test_a.py::TestOld::test_kept]\n",
			"  pass_to_pass: [tests/test_a.py::TestOld::test_kept]\n  ranks: "+ranks+"\n", 1)
		return strings.Replace(y, "gpus: {count: 0}", "gpus: {count: "+gpus+"}", 1)
	}
	for _, c := range []struct{ ranks, gpus, err string }{
		{"4", "4", ""},
		{"2", "0", ""}, // CPU ranks (gloo)
		{"8", "4", "task.yaml:17: tests.ranks: 8 ranks need a GPU each, but resources.gpus.count is 4"},
		{"-1", "0", "task.yaml:17: tests.ranks: must be between 1 and 64 (absent: one process), got -1"},
		{"65", "0", "task.yaml:17: tests.ranks: must be between 1 and 64"},
	} {
		tk, err := task.Load(writeTask(t, withRanks(c.ranks, c.gpus)))
		switch {
		case c.err == "" && err != nil:
			t.Errorf("ranks %s, gpus %s: %v", c.ranks, c.gpus, err)
		case c.err == "" && tk.Tests.Ranks != atoi(c.ranks):
			t.Errorf("ranks %s read as %d", c.ranks, tk.Tests.Ranks)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ranks %s, gpus %s: error %v, want %q", c.ranks, c.gpus, err, c.err)
		}
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}
