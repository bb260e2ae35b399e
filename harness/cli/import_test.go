package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/infradev/infradev/harness/importer"
	"github.com/infradev/infradev/harness/internal/fixture"
	"github.com/infradev/infradev/harness/task"
)

// TestImportFixtureUpstream imports the fixture upstream change through a mirror: the task's
// image is the demo environment with the repository at the base commit on top, the official
// tests run at both sides, and the fail-to-pass and pass-to-pass sets are exactly the ones the
// fixture was written to have; nothing upstream is written into the task directory.
func TestImportFixtureUpstream(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	u := fixture.New(t)
	out := filepath.Join(t.TempDir(), "tasks", "calc", "calc-0001")
	code, stdout, stderr := infradev(t, append(storeFlags(t), "--git-mirror", fixture.URL+"="+u.GitDir,
		"task", "import", "--repo", fixture.URL, "--merge-commit", u.Merge, "--env", "demo", "--id", "calc-0001",
		"--project", "calc", "--path", "/workspace/calc", "--environments", filepath.Join(root, "environments"),
		"--runs", "2", "--out", out, "--json")...)
	if code != 0 {
		t.Fatalf("import exit %d:\n%s%s", code, stdout, stderr)
	}
	var res importer.Result
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if res.Base != u.Base {
		t.Errorf("base %s, want the merge commit's first parent %s", res.Base, u.Base)
	}
	if diff := cmp.Diff(fixture.FailToPass, res.FailToPass); diff != "" {
		t.Errorf("fail-to-pass (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(fixture.PassToPass, res.PassToPass); diff != "" {
		t.Errorf("pass-to-pass (-want +got):\n%s", diff)
	}
	for _, id := range fixture.Dropped {
		if !strings.Contains(res.Dropped[id], "does not pass at the merge commit") {
			t.Errorf("%s dropped as %q", id, res.Dropped[id])
		}
	}
	tk, err := task.Load(out)
	if err != nil {
		t.Fatalf("the written task does not load: %v", err)
	}
	if !tk.Upstream() || tk.Repo.BaseCommit != u.Base || len(tk.Tests.FailToPass) != len(fixture.FailToPass) {
		t.Errorf("task.yaml: %+v", tk)
	}
	entries, _ := os.ReadDir(out)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "instruction.md task.yaml" {
		t.Errorf("the task directory holds %v; upstream files must never be written there", names)
	}
	t.Logf("import took %.0fs", res.Seconds)
}

// TestImportRefusesAChangeWithoutFailToPass: with only the tests that pass at both sides, the
// change is refused.
func TestImportRefusesAChangeWithoutFailToPass(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	u := fixture.New(t)
	code, stdout, stderr := infradev(t, append(storeFlags(t), "--git-mirror", fixture.URL+"="+u.GitDir,
		"task", "import", "--repo", fixture.URL, "--merge-commit", u.Merge, "--env", "demo", "--id", "calc-0002",
		"--project", "calc", "--path", "/workspace/calc", "--environments", filepath.Join(root, "environments"),
		"--runs", "1", "--files", "tests/test_util.py", "--out", filepath.Join(t.TempDir(), "t"))...)
	if code != 1 || !strings.Contains(stderr, "no test fails at the base and passes at the merge commit") {
		t.Errorf("exit %d, want 1 refusing the change:\n%s%s", code, stdout, stderr)
	}
	code, _, stderr = infradev(t, append(storeFlags(t), "task", "import", "--repo", fixture.URL, "--merge-commit", u.Merge,
		"--env", "demo", "--id", "calc-0003", "--environments", filepath.Join(root, "environments"))...)
	if code != 3 || !strings.Contains(stderr, fixture.URL) || !strings.Contains(stderr, u.Merge) {
		t.Errorf("without a mirror: exit %d, want 3 naming the URL and commit:\n%s", code, stderr)
	}
}
