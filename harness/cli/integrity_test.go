package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
)

func predictionsFile(t *testing.T, dir string, preds ...map[string]string) string {
	t.Helper()
	var lines []string
	for _, p := range preds {
		line, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(line))
	}
	path := filepath.Join(dir, "preds.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func evalArgs(t *testing.T, preds, out, runID string, extra ...string) []string {
	root := repoRoot(t)
	return append(append(storeFlags(t), "eval", "--predictions", preds, "--run-id", runID, "--out", out, "--results", "",
		"--tasks", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
		"--environments", filepath.Join(root, "environments")), extra...)
}

// newlinePath is a patch whose file name holds a newline: it once broke the harness's setup
// and was graded task_error, which took the attempt out of its model's resolution rate.
const newlinePath = "diff --git \"a/minitron/conftest\\nx.py\" \"b/minitron/conftest\\nx.py\"\nnew file mode 100644\n--- /dev/null\n+++ \"b/minitron/conftest\\nx.py\"\n@@ -0,0 +1 @@\n+x = 1\n"

// TestSubmissionsCannotLeaveTheDenominator: a model that resolves one task and submits a patch
// that once triggered a harness error on another has a resolution rate of 50%, not 100%; and
// models whose names would once have shared a folder ("a/b", "a_b") are reported apart.
func TestSubmissionsCannotLeaveTheDenominator(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	gold, _ := os.ReadFile(filepath.Join(root, "tasks/demo/minitron-0001/gold.patch"))
	work := t.TempDir()
	preds := predictionsFile(t, work,
		map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "m", "model_patch": string(gold)},
		map[string]string{"instance_id": "minitron-0002", "model_name_or_path": "m", "model_patch": newlinePath},
		map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "a/b", "model_patch": string(gold)},
		map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "a_b", "model_patch": ""},
	)
	out := filepath.Join(work, "runs")
	code, stdout, stderr := infradev(t, evalArgs(t, preds, out, "r")...)
	if code != 0 {
		t.Fatalf("eval exit %d:\n%s%s", code, stdout, stderr)
	}
	data, err := os.ReadFile(filepath.Join(out, "r", "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s report.Summary
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	got := map[string]report.ModelSummary{}
	for _, m := range s.Models {
		got[m.Model] = m
	}
	if m := got["m"]; m.ResolutionRate != 0.5 || m.TamperedInstances != 1 || m.ErrorInstances != 0 {
		t.Errorf("model m: rate %.2f, tampered %d, errors %d; want 0.50, 1, 0 (the harness fault the patch once caused counts against it)",
			m.ResolutionRate, m.TamperedInstances, m.ErrorInstances)
	}
	if got["a/b"].ResolvedInstances != 1 || got["a_b"].ResolvedInstances != 0 || got["a_b"].SubmittedInstances != 1 {
		t.Errorf("models a/b and a_b: %+v / %+v, want one resolved and one not, each reported", got["a/b"], got["a_b"])
	}
	for folder, model := range map[string]string{"a%2Fb": "a/b", "a_b": "a_b"} {
		r, err := result.Read(filepath.Join(out, "r", folder, "minitron-0001", "result.json"))
		if err != nil || r.Model != model {
			t.Errorf("folder %s: %v %v, want %s's result", folder, r, err, model)
		}
	}
	md, _ := os.ReadFile(filepath.Join(out, "r", "report.md"))
	junit, _ := os.ReadFile(filepath.Join(out, "r", "report.junit.xml"))
	html, _ := os.ReadFile(filepath.Join(out, "r", "report.html"))
	for name, text := range map[string]string{"report.md": string(md), "report.junit.xml": string(junit), "report.html": string(html)} {
		if !strings.Contains(text, "tampered") {
			t.Errorf("%s does not show tampered", name)
		}
	}
	if !strings.Contains(string(junit), `<property name="tampered" value="1">`) {
		t.Errorf("report.junit.xml lacks model m's tampered count")
	}
}

// TestEvalRefusesBadPredictionsBeforeRunning: bad predictions are an input error (exit 2)
// naming file and line, and nothing is run, written or deleted.
func TestEvalRefusesBadPredictionsBeforeRunning(t *testing.T) {
	requireSandbox(t)
	cases := []struct {
		name string
		pred map[string]string
		want string
	}{
		{"model named ..", map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "..", "model_patch": ""}, `preds.jsonl:1: model_name_or_path`},
		{"misspelled patch field", map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "m", "model_pach": ""}, `preds.jsonl:1: model_pach: json: unknown field`},
		{"missing patch field", map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "m"}, `preds.jsonl:1: model_patch: is required`},
		{"unknown task", map[string]string{"instance_id": "nope-0001", "model_name_or_path": "m", "model_patch": ""}, `line 1: instance_id: no task "nope-0001"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			work := t.TempDir()
			out := filepath.Join(work, "runs")
			os.MkdirAll(out, 0o755)
			sentinel := filepath.Join(work, "minitron-0001")
			os.WriteFile(sentinel, []byte("keep"), 0o644)
			code, _, stderr := infradev(t, evalArgs(t, predictionsFile(t, work, c.pred), out, "r")...)
			if code != 2 || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, want 2 with %q:\n%s", code, c.want, stderr)
			}
			if _, err := os.Stat(sentinel); err != nil {
				t.Errorf("a file outside the run folder was removed: %v", err)
			}
			if entries, _ := os.ReadDir(filepath.Join(out, "r")); len(entries) > 0 {
				t.Errorf("the refused evaluation wrote %d entries", len(entries))
			}
		})
	}
	code, _, stderr := infradev(t, evalArgs(t, predictionsFile(t, t.TempDir(),
		map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "m", "model_patch": ""}), t.TempDir(), "..")...)
	if code != 2 || !strings.Contains(stderr, `run id ".."`) {
		t.Errorf("run id ..: exit %d, want 2:\n%s", code, stderr)
	}
}

// TestConcurrentEvalsOfOneRunRunEachAttemptOnce: two evaluations of the same run at once
// claim attempts across processes; every attempt runs once, the other evaluation takes its
// result.
func TestConcurrentEvalsOfOneRunRunEachAttemptOnce(t *testing.T) {
	requireSandbox(t)
	testenv.DemoImage(t)
	root := repoRoot(t)
	work := t.TempDir()
	var preds []map[string]string
	for _, id := range []string{"minitron-0001", "minitron-0002", "minitron-0003"} {
		gold, _ := os.ReadFile(filepath.Join(root, "tasks/demo", id, "gold.patch"))
		preds = append(preds, map[string]string{"instance_id": id, "model_name_or_path": "m", "model_patch": string(gold)})
	}
	file := predictionsFile(t, work, preds...)
	out := filepath.Join(work, "runs")
	var wg sync.WaitGroup
	logs := make([]string, 2)
	codes := make([]int, 2)
	for i := range logs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			codes[i], _, logs[i] = infradev(t, evalArgs(t, file, out, "same", "--jobs", "1")...)
		}(i)
	}
	wg.Wait()
	ran := strings.Count(logs[0], "(ran)") + strings.Count(logs[1], "(ran)")
	if codes[0] != 0 || codes[1] != 0 || ran != len(preds) {
		t.Errorf("exits %v, %d attempts ran in all, want %d:\n%s\n---\n%s", codes, ran, len(preds), logs[0], logs[1])
	}
}
