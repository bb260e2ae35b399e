package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/result"
)

// TestKilledEvalResumes kills `infradev eval` with SIGKILL after some attempts have finished
// and runs the same command again: every prediction ends with exactly one result, and the
// attempts finished before the kill are not run again.
func TestKilledEvalResumes(t *testing.T) {
	testenv.RequireSandbox(t)
	testenv.DemoImage(t)
	root := testenv.RepoRoot(t)
	gold, err := os.ReadFile(filepath.Join(root, "tasks/demo/minitron-0001/gold.patch"))
	if err != nil {
		t.Fatal(err)
	}
	// Distinct patches (gold plus a note of its own), so that no two share a result.
	const n = 4
	var lines []string
	for i := 0; i < n; i++ {
		note := fmt.Sprintf("diff --git a/NOTES-%d.md b/NOTES-%d.md\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES-%d.md\n@@ -0,0 +1 @@\n+attempt %d\n", i, i, i, i)
		line, _ := json.Marshal(map[string]string{"instance_id": "minitron-0001", "model_name_or_path": fmt.Sprintf("m%d", i), "model_patch": string(gold) + note})
		lines = append(lines, string(line))
	}
	work := t.TempDir()
	preds := filepath.Join(work, "preds.jsonl")
	os.WriteFile(preds, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	bin := filepath.Join(work, "infradev")
	build := exec.Command("go", "build", "-o", bin, "./harness/cmd/infradev")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out := filepath.Join(work, "runs")
	args := append(storeFlags(t), "eval", "--jobs", "1", "--predictions", preds, "--run-id", "k", "--out", out,
		"--results", filepath.Join(work, "results"), "--tasks", filepath.Join(root, "tasks"),
		"--probes", filepath.Join(root, "probes"), "--environments", filepath.Join(root, "environments"))
	finished := func() []string {
		f, _ := filepath.Glob(filepath.Join(out, "k", "*", "*", "result.json"))
		return f
	}

	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for len(finished()) < 2 {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("no attempt finished in time")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	before := map[string]time.Time{}
	for _, f := range finished() {
		r, err := result.Read(f)
		if err != nil {
			t.Fatalf("%s after the kill: %v", f, err)
		}
		before[f] = r.StartedAt
	}
	if len(before) >= n {
		t.Fatalf("every attempt finished before the kill (%d); the test needs a slower machine or more attempts", len(before))
	}

	rerun := exec.Command(bin, args...)
	log, err := rerun.CombinedOutput()
	if err != nil {
		t.Fatalf("rerun: %v\n%s", err, log)
	}
	after := finished()
	if len(after) != n {
		t.Fatalf("%d results after the rerun, want %d:\n%s", len(after), n, log)
	}
	seen := map[string]bool{}
	for _, f := range after {
		r, err := result.Read(f)
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.Model] {
			t.Errorf("model %s has two results", r.Model)
		}
		seen[r.Model] = true
		if !r.Resolved {
			t.Errorf("%s: %s (%s)", r.Model, r.FailureClass, r.Reason)
		}
		if started, ok := before[f]; ok && !r.StartedAt.Equal(started) {
			t.Errorf("%s finished before the kill but was run again", r.Model)
		}
	}
	if got := strings.Count(string(log), "(resumed)"); got != len(before) {
		t.Errorf("rerun resumed %d attempts, want the %d finished before the kill:\n%s", got, len(before), log)
	}
	var report struct {
		Models []struct{ Model string } `json:"models"`
	}
	data, _ := os.ReadFile(filepath.Join(out, "k", "report.json"))
	if json.Unmarshal(data, &report) != nil || len(report.Models) != n {
		t.Errorf("report.json lists %d models, want %d", len(report.Models), n)
	}
}
