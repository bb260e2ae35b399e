package cli_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/internal/slurmtest"
	"github.com/infradev/infradev/harness/report"
)

// TestEvalOnSlurm evaluates the demo models' predictions with --executor slurm on a real
// single-node cluster on loopback: every verdict is the one the model files were built for (the
// check the local executor's run passes too); Slurm's job completion log holds one job per
// attempt, with the CPUs and memory its task asks for; and the same command again takes every
// result from the run folder, submitting nothing.
func TestEvalOnSlurm(t *testing.T) {
	requireSandbox(t)
	c := cluster(t)
	root := repoRoot(t)
	out := t.TempDir()
	// The jobs run a real infradev binary (a test binary is not one), and so does the
	// evaluation: the harness key in every result key is that binary's.
	bin := slurmBinary(t, root)
	run := func(args ...string) (int, string) {
		cmd := exec.Command(bin, args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "INFRADEV_BINARY="+bin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, stderr.String()
	}
	dir := filepath.Join(root, "tasks", "demo", "predictions")
	args := append(evalArgs(t, filepath.Join(dir, "model-a.jsonl"), out, "slurm"), "--executor", "slurm", "--results", filepath.Join(out, "store"),
		"--predictions", filepath.Join(dir, "model-b.jsonl"), "--predictions", filepath.Join(dir, "model-c.jsonl"))
	code, stderr := run(args...)
	if code != 0 {
		logs, _ := filepath.Glob(filepath.Join(out, "slurm", "*", "*", "slurm", "job-*", "job.log"))
		var first []byte
		if len(logs) > 0 {
			first, _ = os.ReadFile(logs[0])
		}
		sl, _ := os.ReadFile(filepath.Join(c.Dir, "log", "slurmd.log"))
		jl, _ := os.ReadFile(c.JobLog)
		t.Fatalf("eval --executor slurm: exit %d\n%s\nfirst job log (%v):\n%s\nslurmd:\n%s\njobs:\n%s", code, stderr, logs, first, sl[max(0, len(sl)-2500):], jl[:min(len(jl), 1500)])
	}
	if code, se := run("samples", "--verify", filepath.Join(out, "slurm")); code != 0 {
		t.Errorf("samples --verify of the slurm run: exit %d\n%s", code, se)
	}
	stored, err := report.LoadRun(filepath.Join(out, "slurm"))
	if err != nil || len(stored) != 36 {
		t.Fatalf("results: %d, %v", len(stored), err)
	}
	log, err := os.ReadFile(c.JobLog)
	if err != nil {
		t.Fatal(err)
	}
	jobs := regexp.MustCompile(`(?m)^.* Name=infradev-(\S+) .*$`).FindAllStringSubmatch(string(log), -1)
	// One job per distinct submission: identical patches of different models are graded once.
	keys := map[string]bool{}
	for _, st := range stored {
		keys[st.Result.Inputs.Patch+st.Result.InstanceID] = true
	}
	if len(jobs) != len(keys) {
		t.Fatalf("job completion log: %d infradev jobs, want %d (one per distinct attempt)\n%s", len(jobs), len(keys), log)
	}
	for _, j := range jobs {
		// Each demo task asks for 1 CPU and 1GiB: the job for 1 CPU and 1.5GiB (512MiB for the harness).
		if !strings.Contains(j[0], "JobState=COMPLETED") || !strings.Contains(j[0], "Tres=cpu=1,mem=1.50G,") {
			t.Errorf("job of %s: %s; want COMPLETED with the task's 1 CPU and its memory", j[1], j[0])
		}
	}
	// Again: nothing is submitted.
	code, stderr = run(args...)
	after, _ := os.ReadFile(c.JobLog)
	if code != 0 || len(after) != len(log) || strings.Contains(stderr, "(ran)") {
		t.Errorf("rerun: exit %d, %d more bytes of job log; stderr:\n%s\nwant every result resumed", code, len(after)-len(log), stderr)
	}
}

// TestSlurmNodeFailureIsRetried loses the node while an attempt's job runs: Slurm fails the job
// (NODE_FAIL), which is an infrastructure fault, so the attempt is submitted again once the
// node is back, and resolves; the lost job is recorded as a retried infrastructure error,
// never as the submission's failure.
func TestSlurmNodeFailureIsRetried(t *testing.T) {
	requireSandbox(t)
	c := cluster(t)
	root := repoRoot(t)
	out := t.TempDir()
	gold, err := os.ReadFile(filepath.Join(root, "tasks", "demo", "minitron-0001", "gold.patch"))
	if err != nil {
		t.Fatal(err)
	}
	preds := predictionsFile(t, out, map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "m", "model_patch": string(gold)})
	t.Setenv("INFRADEV_BINARY", slurmBinary(t, root))
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Wait for the job to run, lose the node, wait for Slurm to fail the job, bring it back.
		for i := 0; i < 600; i++ {
			if o, _ := c.Output("squeue", "-h", "-t", "RUNNING", "-o", "%i"); strings.TrimSpace(o) != "" {
				c.KillNode()
				for j := 0; j < 600; j++ {
					if o, _ := c.Output("scontrol", "show", "job", "-o", strings.TrimSpace(o)); strings.Contains(o, "JobState=NODE_FAIL") {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				c.RestoreNode()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	code, _, stderr := infradev(t, append(evalArgs(t, preds, out, "lost-node"), "--executor", "slurm")...)
	<-done
	if code != 0 {
		t.Fatalf("eval: exit %d\n%s", code, stderr)
	}
	stored, err := report.LoadRun(filepath.Join(out, "lost-node"))
	if err != nil || len(stored) != 1 {
		t.Fatalf("results: %v %v", stored, err)
	}
	r := stored[0].Result
	if !r.Resolved || len(r.RetriedInfraErrors) != 1 || !strings.Contains(r.RetriedInfraErrors[0], "NODE_FAIL") {
		t.Errorf("resolved %v, retried %q (%s); want resolved after one retry of a NODE_FAIL job", r.Resolved, r.RetriedInfraErrors, r.Reason)
	}
}

// slurmBinary builds the infradev binary jobs run (a test binary is not one).
func slurmBinary(t testing.TB, root string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "infradev")
	build := exec.Command("go", "build", "-o", bin, "./harness/cmd/infradev")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// BenchmarkExecutors evaluates the demo predictions with the local executor and with
// --executor slurm on a loopback cluster, side by side in one run, and reports each one's wall
// time per distinct attempt and their ratio (no results store: every attempt runs):
//
//	go test ./harness/cli -run '^$' -bench Executors -benchtime 1x
func BenchmarkExecutors(b *testing.B) {
	requireSandbox(b)
	c := slurmtest.Start(b)
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		b.Setenv(k, v)
	}
	root := repoRoot(b)
	bin := slurmBinary(b, root)
	dir := filepath.Join(root, "tasks", "demo", "predictions")
	for i := 0; i < b.N; i++ {
		per := map[string]float64{}
		for _, executor := range []string{"local", "slurm"} {
			out := b.TempDir()
			cmd := exec.Command(bin, append(storeFlags(b), "eval", "--run-id", executor, "--out", out, "--results", "",
				"--executor", executor, "--tasks", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
				"--environments", filepath.Join(root, "environments"),
				"--predictions", filepath.Join(dir, "model-a.jsonl"), "--predictions", filepath.Join(dir, "model-b.jsonl"),
				"--predictions", filepath.Join(dir, "model-c.jsonl"))...)
			cmd.Env = append(os.Environ(), "INFRADEV_BINARY="+bin)
			start := time.Now()
			if o, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("eval --executor %s: %v\n%s", executor, err, o)
			}
			stored, err := report.LoadRun(filepath.Join(out, executor))
			if err != nil {
				b.Fatal(err)
			}
			distinct := map[string]bool{}
			for _, st := range stored {
				distinct[st.Result.Inputs.Patch+st.Result.InstanceID] = true
			}
			per[executor] = time.Since(start).Seconds() / float64(len(distinct))
		}
		b.ReportMetric(per["local"], "local-s/attempt")
		b.ReportMetric(per["slurm"], "slurm-s/attempt")
		b.ReportMetric(per["slurm"]/per["local"], "slurm/local")
	}
}

// TestInterruptCancelsSlurmJobs interrupts an evaluation whose attempt runs as a Slurm job:
// the job is cancelled (scancel), nothing is left in the queue, and eval exits 130.
func TestInterruptCancelsSlurmJobs(t *testing.T) {
	requireSandbox(t)
	c := cluster(t)
	root := repoRoot(t)
	bin := slurmBinary(t, root)
	out := t.TempDir()
	preds := predictionsFile(t, out, map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "m", "model_patch": ""})
	cmd := exec.Command(bin, append(evalArgs(t, preds, out, "interrupted"), "--executor", "slurm")...)
	cmd.Env = append(os.Environ(), "INFRADEV_BINARY="+bin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	job := ""
	for i := 0; i < 600 && job == ""; i++ {
		o, _ := c.Output("squeue", "-h", "-o", "%i")
		job = strings.TrimSpace(o)
		time.Sleep(100 * time.Millisecond)
	}
	if job == "" {
		cmd.Process.Kill()
		t.Fatalf("no job was submitted:\n%s", stderr.String())
	}
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
		t.Errorf("eval after an interrupt: %v, want exit 130\n%s", err, stderr.String())
	}
	for i := 0; i < 50; i++ {
		if o, _ := c.Output("squeue", "-h", "-o", "%i"); strings.TrimSpace(o) == "" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if o, _ := c.Output("squeue", "-h", "-o", "%i %T"); strings.TrimSpace(o) != "" {
		t.Errorf("jobs left in the queue after the interrupt: %s", o)
	}
	if o, _ := c.Output("scontrol", "show", "job", "-o", job); !strings.Contains(o, "JobState=CANCELLED") {
		t.Errorf("job %s after the interrupt: %s, want CANCELLED", job, o)
	}
}

// cluster starts a loopback Slurm cluster for a test, points the Slurm commands at it and builds
// the demo image the attempts run on.
func cluster(t *testing.T) *slurmtest.Cluster {
	t.Helper()
	c := slurmtest.Start(t)
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	demoImage(t)
	return c
}
