package validate_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/validate"
)

// fakeRunner records what validation asked of it.
type fakeRunner struct {
	checks int
	runs   []string
	fault  string
}

func (f *fakeRunner) CheckTask(context.Context, runner.Inputs) (string, error) {
	f.checks++
	return f.fault, nil
}

func (f *fakeRunner) Run(_ context.Context, in runner.Inputs, out string) (*result.Result, error) {
	f.runs = append(f.runs, filepath.Base(out))
	return &result.Result{Resolved: in.Patch != nil, FailureClass: result.OfficialTestsFailed}, nil
}

// gpuTask copies a demo task and its probes into a fresh root, asking for gpus GPUs.
func gpuTask(t *testing.T, gpus int) (*task.Task, *probe.Set) {
	t.Helper()
	src := testenv.RepoRoot(t)
	root := t.TempDir()
	for _, d := range []string{"tasks/demo/minirl-0001", "probes/demo/minirl-0001"} {
		if err := os.CopyFS(filepath.Join(root, d), os.DirFS(filepath.Join(src, d))); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(root, d, validate.RecordFile))
	}
	tf := filepath.Join(root, "tasks/demo/minirl-0001/task.yaml")
	data, _ := os.ReadFile(tf)
	edited := strings.Replace(string(data), "gpus: {count: 0", "gpus: {count: "+string(rune('0'+gpus)), 1)
	if edited == string(data) && gpus > 0 {
		t.Fatalf("%s: no gpus line to edit", tf)
	}
	os.WriteFile(tf, []byte(edited), 0o644)
	tk, err := task.Load(filepath.Dir(tf))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := probe.Load(filepath.Join(root, "probes/demo/minirl-0001"), tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	return tk, ps
}

// A task needing more GPUs than validation has gets the task check and nothing else; its
// record says gpu-pending, which a stale or missing record, or a cpu one, is not.
func TestTaskNeedingGPUsIsPendingWithoutThem(t *testing.T) {
	tk, ps := gpuTask(t, 2)
	in := runner.Inputs{Task: tk, Probes: ps}
	f := &fakeRunner{}
	rep, err := validate.Task(context.Background(), f, in, nil, []byte("gold"), validate.Options{Out: t.TempDir(), GPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Pending || !rep.OK() || f.checks != 1 || len(f.runs) != 0 {
		t.Fatalf("2 GPUs needed, 1 given: pending %v ok %v checks %d runs %v; want pending after the task check alone", rep.Pending, rep.OK(), f.checks, f.runs)
	}
	td, pd, _ := validate.Digests(tk, ps.Dir)
	rec, err := validate.NewRecord(rep, tk, ps.Dir, td, pd, "sha256:env", "h", "cpu", time.Unix(0, 0))
	if err != nil || rec.Status != "gpu-pending" {
		t.Fatalf("record of a pending validation: %+v, %v; want status gpu-pending", rec, err)
	}
	if err := validate.WriteRecord(ps.Dir, rec); err != nil {
		t.Fatal(err)
	}
	if p, _, err := validate.CheckRecord(tk, ps.Dir, "sha256:env"); err != nil || p != "" {
		t.Fatalf("current gpu-pending record: %q, %v", p, err)
	}
	if p, _, _ := validate.CheckRecord(tk, ps.Dir, "sha256:other"); !strings.Contains(p, "stale: environment") {
		t.Errorf("record for another environment: %q; want stale naming the environment", p)
	}

	// The task check's fault is a fault, not a pending task.
	f = &fakeRunner{fault: "task minirl-0001: the gold patch does not apply"}
	rep, _ = validate.Task(context.Background(), f, in, nil, []byte("gold"), validate.Options{Out: t.TempDir()})
	if rep.OK() {
		t.Fatalf("task check fault: report OK")
	}
	if _, err := validate.NewRecord(rep, tk, ps.Dir, td, pd, "sha256:env", "h", "cpu", time.Unix(0, 0)); err == nil {
		t.Error("a task whose check failed got a record")
	}

	// With enough GPUs the validation runs in full.
	f = &fakeRunner{}
	rep, _ = validate.Task(context.Background(), f, in, nil, []byte("gold"), validate.Options{Out: t.TempDir(), GPUs: 2, Runs: 1})
	if rep.Pending || len(f.runs) == 0 || f.runs[0] != "gold-1" {
		t.Fatalf("2 GPUs needed, 2 given: pending %v runs %v; want gold run", rep.Pending, f.runs)
	}
	// A full validation of a GPU task without a GPU class is refused; with one it says gpu.
	full := &validate.Report{Task: tk.ID, GoldRuns: 3, GoldResolved: 3, TamperRuns: 3, TamperOK: 3, Forgeries: 3, ForgeriesOK: 3}
	if _, err := validate.NewRecord(full, tk, ps.Dir, td, pd, "sha256:env", "h", "cpu", time.Unix(0, 0)); err == nil {
		t.Error("a GPU task validated on hardware \"cpu\" got a record")
	}
	rec, err = validate.NewRecord(full, tk, ps.Dir, td, pd, "sha256:env", "h", "gpu:NVIDIA H200 x1", time.Unix(0, 0))
	if err != nil || rec.Status != "gpu" || rec.Hardware != "gpu:NVIDIA H200 x1" {
		t.Fatalf("full GPU validation: %+v, %v; want status gpu with the machine class", rec, err)
	}
}

// CheckRecord names a missing record and a status the task's GPU needs do not allow.
func TestCheckRecordNamesTheProblem(t *testing.T) {
	tk, ps := gpuTask(t, 0)
	if p, _, _ := validate.CheckRecord(tk, ps.Dir, "sha256:env"); !strings.Contains(p, "no validation record") {
		t.Errorf("no record: %q", p)
	}
	td, pd, _ := validate.Digests(tk, ps.Dir)
	// A pending report for a task that needs no GPU is no record.
	if _, err := validate.NewRecord(&validate.Report{Task: tk.ID, Pending: true}, tk, ps.Dir, td, pd, "sha256:env", "h", "cpu", time.Unix(0, 0)); err == nil {
		t.Error("a CPU task got a gpu-pending record")
	}
	// A validation that ran no tamper or forgery check is not a full one.
	for _, partial := range []*validate.Report{
		{Task: tk.ID, GoldRuns: 3, GoldResolved: 3},
		{Task: tk.ID, GoldRuns: 3, GoldResolved: 3, TamperRuns: 3, TamperOK: 3},
		{Task: tk.ID, GoldRuns: 3, GoldResolved: 3, TamperRuns: 3, TamperOK: 3, Forgeries: 3, ForgeriesOK: 2},
	} {
		if _, err := validate.NewRecord(partial, tk, ps.Dir, td, pd, "sha256:env", "h", "cpu", time.Unix(0, 0)); err == nil {
			t.Errorf("a validation with tamper %d/%d and forgeries %d/%d got a record", partial.TamperOK, partial.TamperRuns, partial.ForgeriesOK, partial.Forgeries)
		}
	}
	rec, err := validate.NewRecord(&validate.Report{Task: tk.ID, GoldRuns: 3, GoldResolved: 3, TamperRuns: 3, TamperOK: 3, Forgeries: 3, ForgeriesOK: 3},
		tk, ps.Dir, td, pd, "sha256:env", "h", "cpu", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if rec.ForgeryRuns != 3 {
		t.Errorf("record forgery_runs %d, want 3", rec.ForgeryRuns)
	}
	rec.Status = "gpu-pending" // as a hand edit would
	validate.WriteRecord(ps.Dir, rec)
	if p, _, _ := validate.CheckRecord(tk, ps.Dir, "sha256:env"); !strings.Contains(p, `field status: "gpu-pending", but the task needs 0 GPU(s)`) {
		t.Errorf("gpu-pending record of a CPU task: %q", p)
	}
}

func (f *fakeRunner) Digests(runner.Inputs) (result.Inputs, error) { return result.Inputs{}, nil }

// A record written before the forgery check is still current while its digests are, but it
// comes with a note saying so, is shown marked, and is never written again as such.
func TestLegacyRecordIsCurrentButMarked(t *testing.T) {
	tk, ps := gpuTask(t, 0)
	td, pd, _ := validate.Digests(tk, ps.Dir)
	legacy := fmt.Sprintf(`{"schema": %q, "task": %q, "status": "cpu", "hardware": "cpu", "task_digest": %q, "probes_digest": %q, "environment": "sha256:env"}`,
		validate.LegacySchema, tk.ID, td, pd)
	if err := os.WriteFile(filepath.Join(ps.Dir, validate.RecordFile), []byte(legacy), 0o644); err != nil {
		t.Fatal(err)
	}
	p, note, err := validate.CheckRecord(tk, ps.Dir, "sha256:env")
	if err != nil || p != "" || !strings.Contains(note, "validated before the forgery check") {
		t.Fatalf("current legacy record: problem %q note %q err %v; want no problem and a note", p, note, err)
	}
	rec, err := validate.ReadRecord(ps.Dir)
	if err != nil || !rec.Legacy || rec.StatusText() != "cpu (before the forgery check)" {
		t.Fatalf("legacy record read as %+v (%v)", rec, err)
	}
	if err := validate.WriteRecord(ps.Dir, rec); err == nil {
		t.Error("a legacy record was written back")
	}
	// Stale is stale whatever the schema.
	if p, _, _ := validate.CheckRecord(tk, ps.Dir, "sha256:other"); !strings.Contains(p, "stale: environment") {
		t.Errorf("stale legacy record: %q", p)
	}
	// A schema it does not know is an error naming the file and field.
	os.WriteFile(filepath.Join(ps.Dir, validate.RecordFile), []byte(`{"schema": "infradev.validation/v0", "status": "cpu"}`), 0o644)
	if _, err := validate.ReadRecord(ps.Dir); err == nil || !strings.Contains(err.Error(), "field schema") || !strings.Contains(err.Error(), validate.RecordFile) {
		t.Errorf("unknown schema: %v", err)
	}
}

// A task needing no GPU validated with GoldOnly runs the task check and gold alone; its record
// says cpu-pending (current, with a note), which never replaces a full cpu record.
func TestGoldOnlyIsCPUPending(t *testing.T) {
	tk, ps := gpuTask(t, 0)
	in := runner.Inputs{Task: tk, Probes: ps}
	f := &fakeRunner{}
	rep, err := validate.Task(context.Background(), f, in, nil, []byte("gold"), validate.Options{Out: t.TempDir(), Runs: 2, GoldOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.GoldOnly || !rep.OK() || f.checks != 1 || strings.Join(f.runs, ",") != "gold-1,gold-2" {
		t.Fatalf("gold only: report %+v, checks %d, runs %v; want the task check and two gold runs", rep, f.checks, f.runs)
	}
	td, pd, _ := validate.Digests(tk, ps.Dir)
	rec, err := validate.NewRecord(rep, tk, ps.Dir, td, pd, "sha256:env", "h", "cpu", time.Unix(0, 0))
	if err != nil || rec.Status != "cpu-pending" || rec.GoldRuns != 2 || rec.GoldResolved != 2 {
		t.Fatalf("record of a gold-only validation: %+v, %v; want cpu-pending with gold 2/2", rec, err)
	}
	// Gold that did not resolve every time earns nothing.
	if _, err := validate.NewRecord(&validate.Report{Task: tk.ID, GoldOnly: true, GoldRuns: 2, GoldResolved: 1}, tk, ps.Dir, td, pd, "sha256:env", "h", "cpu", time.Unix(0, 0)); err == nil {
		t.Error("gold 1/2 got a cpu-pending record")
	}

	envDir := t.TempDir()
	if err := image.WriteLock(envDir, &image.Lock{Schema: image.LockSchema, Name: "demo", Manifest: "sha256:env"}); err != nil {
		t.Fatal(err)
	}
	it := validate.Item{Task: tk, Probes: ps, TaskDigest: td, ProbesDigest: pd}
	if err := validate.RecordPinned(it, envDir, "sha256:env", "h", "cpu", rep, time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	p, note, err := validate.CheckRecord(tk, ps.Dir, "sha256:env")
	if err != nil || p != "" || !strings.Contains(note, "cpu-pending: gold resolves 2/2") {
		t.Fatalf("current cpu-pending record: problem %q note %q err %v", p, note, err)
	}
	// A full validation replaces it; a later gold-only one does not undo the full one.
	full := &validate.Report{Task: tk.ID, GoldRuns: 3, GoldResolved: 3, TamperRuns: 3, TamperOK: 3, Forgeries: 3, ForgeriesOK: 3}
	if err := validate.RecordPinned(it, envDir, "sha256:env", "h", "cpu", full, time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	if err := validate.RecordPinned(it, envDir, "sha256:env", "h", "cpu", rep, time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	if got, _ := validate.ReadRecord(ps.Dir); got == nil || got.Status != "cpu" {
		t.Fatalf("after a gold-only run over a full record: %+v, want the full cpu record kept", got)
	}
	// A GPU task's record is never cpu-pending.
	gk, gs := gpuTask(t, 1)
	grep, _ := validate.Task(context.Background(), &fakeRunner{}, runner.Inputs{Task: gk, Probes: gs}, nil, []byte("gold"), validate.Options{Out: t.TempDir(), GoldOnly: true})
	gtd, gpd, _ := validate.Digests(gk, gs.Dir)
	if grec, err := validate.NewRecord(grep, gk, gs.Dir, gtd, gpd, "sha256:env", "h", "cpu", time.Unix(0, 0)); err != nil || grec.Status != "gpu-pending" {
		t.Errorf("GPU task under --gold-only: %+v, %v; want gpu-pending", grec, err)
	}
}
