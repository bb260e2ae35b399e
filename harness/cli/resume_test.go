package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	scratch := filepath.Join(testenv.Cache(t), "scratch")
	inFlight := func() bool {
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		return strings.Contains(string(mounts), scratch)
	}
	// Kill after 2 attempts finished, while the next one is mounted if it gets that far.
	deadline := time.Now().Add(3 * time.Minute)
	for !(len(finished()) >= 2 && (inFlight() || len(finished()) == n)) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("no attempt finished in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	leftovers := inFlight()
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
	if leftovers && !strings.Contains(string(log), "cleaned up") {
		t.Errorf("the killed evaluation left a mounted attempt and the rerun did not clean it up:\n%s", log)
	}
	if inFlight() {
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		t.Errorf("scratch mounts are left after the rerun:\n%s", mounts)
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

// TestIdenticalPatchesRunOnce: two models submitting the same patch get one attempt, and a
// second run id is served from the results store without running anything.
func TestIdenticalPatchesRunOnce(t *testing.T) {
	testenv.RequireSandbox(t)
	root := testenv.RepoRoot(t)
	gold, _ := os.ReadFile(filepath.Join(root, "tasks/demo/minitron-0001/gold.patch"))
	work := t.TempDir()
	preds := filepath.Join(work, "preds.jsonl")
	var lines []string
	for _, m := range []string{"model-x", "model-y"} {
		line, _ := json.Marshal(map[string]string{"instance_id": "minitron-0001", "model_name_or_path": m, "model_patch": string(gold)})
		lines = append(lines, string(line))
	}
	os.WriteFile(preds, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	args := func(runID string) []string {
		return append(storeFlags(t), "eval", "--predictions", preds, "--run-id", runID, "--out", filepath.Join(work, "runs"),
			"--results", filepath.Join(work, "results"), "--tasks", filepath.Join(root, "tasks"),
			"--probes", filepath.Join(root, "probes"), "--environments", filepath.Join(root, "environments"))
	}
	code, _, log := infradev(t, args("one")...)
	if code != 0 || strings.Count(log, "(ran)") != 1 || strings.Count(log, "(shared)") != 1 {
		t.Errorf("exit %d; want one attempt run and shared with the other model:\n%s", code, log)
	}
	code, _, log = infradev(t, args("two")...)
	if code != 0 || strings.Count(log, "(stored)") != 2 || strings.Contains(log, "(ran)") {
		t.Errorf("exit %d; want both served from the results store:\n%s", code, log)
	}
	for _, m := range []string{"model-x", "model-y"} {
		r, err := result.Read(filepath.Join(work, "runs", "two", m, "minitron-0001", "result.json"))
		if err != nil || r.Model != m || !r.Resolved {
			t.Errorf("%s: %+v, %v", m, r, err)
		}
	}
}

// TestInterruptStopsCleanly sends SIGINT to a running evaluation: it exits 130, keeps the
// results it finished, and leaves no container running.
func TestInterruptStopsCleanly(t *testing.T) {
	testenv.RequireSandbox(t)
	testenv.DemoImage(t)
	root := testenv.RepoRoot(t)
	work := t.TempDir()
	bin := filepath.Join(work, "infradev")
	build := exec.Command("go", "build", "-o", bin, "./harness/cmd/infradev")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out := filepath.Join(work, "runs")
	cmd := exec.Command(bin, append(storeFlags(t), "eval", "--jobs", "1", "--run-id", "i", "--out", out,
		"--predictions", filepath.Join(root, "tasks/demo/predictions/skeleton.jsonl"), "--results", "",
		"--tasks", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
		"--environments", filepath.Join(root, "environments"))...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		f, _ := filepath.Glob(filepath.Join(out, "i", "*", "*", "result.json"))
		if len(f) >= 1 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("no attempt finished in time")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // let the next attempt's sandbox start
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit %d (%v), want 130:\n%s", code, err, stderr.String())
	}
	f, _ := filepath.Glob(filepath.Join(out, "i", "*", "*", "result.json"))
	if len(f) == 0 || len(f) == 5 {
		t.Errorf("%d results kept after the interrupt, want the finished ones (1 to 4)", len(f))
	}
	for _, p := range f {
		if _, err := result.Read(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	// No container owned by the interrupted process may be left (other tests may run their own).
	data, _ := exec.Command("runc", "--root", filepath.Join(testenv.Cache(t), "sandbox", "runc"), "list", "--format", "json").Output()
	var list []struct {
		ID     string `json:"id"`
		Bundle string `json:"bundle"`
	}
	json.Unmarshal(data, &list)
	for _, c := range list {
		owner, _ := os.ReadFile(filepath.Join(c.Bundle, "owner"))
		if strings.TrimSpace(string(owner)) == strconv.Itoa(cmd.Process.Pid) {
			t.Errorf("container %s of the interrupted evaluation is still there", c.ID)
		}
	}
}
