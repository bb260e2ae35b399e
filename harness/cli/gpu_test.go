package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/report"
)

// TestGPUTaskWithoutDriverIsNotRun: on a machine without an NVIDIA driver, a task declaring 2
// GPUs is reported "not run: needs 2 GPUs, 0 available", counted apart from model failures.
func TestGPUTaskWithoutDriverIsNotRun(t *testing.T) {
	testenv.RequireSandbox(t)
	if _, err := gpu.Discover(nvml.New()); err == nil {
		t.Skip("this machine has an NVIDIA driver: the no-driver path cannot be shown here")
	}
	root := testenv.RepoRoot(t)
	work := t.TempDir()
	tasks, probes := filepath.Join(work, "tasks", "demo", "gpu-0001"), filepath.Join(work, "probes", "demo", "gpu-0001")
	for src, dst := range map[string]string{filepath.Join(root, "tasks/demo/minitron-0001"): tasks, filepath.Join(root, "probes/demo/minitron-0001"): probes} {
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
	}
	spec, _ := os.ReadFile(filepath.Join(tasks, "task.yaml"))
	spec = []byte(strings.Replace(strings.Replace(string(spec), "id: minitron-0001", "id: gpu-0001", 1), "gpus: {count: 0}", "gpus: {count: 2, connected: true}", 1))
	os.WriteFile(filepath.Join(tasks, "task.yaml"), spec, 0o644)
	ps, _ := os.ReadFile(filepath.Join(probes, "probes.yaml"))
	os.WriteFile(filepath.Join(probes, "probes.yaml"), []byte(strings.Replace(string(ps), "task: minitron-0001", "task: gpu-0001", 1)), 0o644)
	gold, _ := os.ReadFile(filepath.Join(tasks, "gold.patch"))
	line, _ := json.Marshal(map[string]string{"instance_id": "gpu-0001", "model_name_or_path": "m", "model_patch": string(gold)})
	preds := filepath.Join(work, "preds.jsonl")
	os.WriteFile(preds, append(line, '\n'), 0o644)

	out := filepath.Join(work, "runs")
	code, stdout, stderr := infradev(t, append(storeFlags(t), "eval", "--predictions", preds, "--run-id", "g", "--out", out,
		"--results", "", "--tasks", filepath.Join(work, "tasks"), "--probes", filepath.Join(work, "probes"),
		"--environments", filepath.Join(root, "environments"))...)
	if code != 0 {
		t.Fatalf("eval exit %d\n%s%s", code, stdout, stderr)
	}
	var s report.Summary
	data, _ := os.ReadFile(filepath.Join(out, "g", "report.json"))
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	m := s.Models[0]
	if got := m.Instances[0].Verdict; got != "not run: needs 2 GPUs, 0 available" {
		t.Errorf("verdict %q", got)
	}
	if m.ErrorInstances != 1 || m.UnresolvedInstances != 0 || m.CompletedInstances != 0 {
		t.Errorf("counted %+v; a machine without GPUs must not count against the model", m)
	}
	if !strings.Contains(stdout, "not run: needs 2 GPUs, 0 available") || !strings.Contains(stderr, "no GPUs") {
		t.Errorf("printed report or log lacks the reason:\n%s\n%s", stdout, stderr)
	}
}
