package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/infradev/infradev/harness/cli"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/samples"
)

func repoRoot(t testing.TB) string { return testenv.RepoRoot(t) }

func requireSandbox(t testing.TB) { testenv.RequireSandbox(t) }

// storeFlags point the CLI at the store and cache the end-to-end tests share.
func storeFlags(t testing.TB) []string {
	return []string{"--store", testenv.Store(t), "--cache", testenv.Cache(t)}
}

func infradev(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Execute(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func demoImage(t *testing.T) string {
	t.Helper()
	code, out, errs := infradev(t, append(storeFlags(t), "env", "build", "--json", filepath.Join(repoRoot(t), "environments", "demo"))...)
	if code != 0 {
		t.Fatalf("env build exit %d: %s", code, errs)
	}
	var b struct{ Manifest string }
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatalf("env build --json output: %v\n%s", err, out)
	}
	return b.Manifest
}

func TestEvalSkeletonPredictions(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	out := t.TempDir()
	args := append(storeFlags(t), "eval",
		"--predictions", filepath.Join(root, "tasks/demo/predictions/skeleton.jsonl"),
		"--run-id", "skeleton", "--out", out, "--results", filepath.Join(out, "store"),
		"--tasks", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
		"--environments", filepath.Join(root, "environments"))
	code, stdout, stderr := infradev(t, args...)
	if code != 0 {
		t.Fatalf("eval exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	data, err := os.ReadFile(filepath.Join(out, "skeleton", "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s report.Summary
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ verdict, class string }{
		"sample/gold":         {"resolved", ""},
		"sample/empty":        {"not resolved (tests)", result.OfficialTestsFailed},
		"sample/breaks-tests": {"not resolved (tests)", result.OfficialTestsFailed},
		"sample/fails-probe":  {"not resolved (probe: state)", result.ProbesFailed},
		// Passes every official test and every functional probe; only the memory budget catches it.
		"sample/wastes-memory": {"not resolved (probe: memory)", result.ProbesFailed},
	}
	if len(s.Models) != len(want) {
		t.Fatalf("report has %d models, want %d:\n%s", len(s.Models), len(want), data)
	}
	for _, m := range s.Models {
		w, ok := want[m.Model]
		if !ok || len(m.Instances) != 1 {
			t.Errorf("unexpected model %q in report", m.Model)
			continue
		}
		in := m.Instances[0]
		if in.Verdict != w.verdict || in.FailureClass != w.class {
			t.Errorf("%s: verdict %q class %q, want %q %q (reason %q)", m.Model, in.Verdict, in.FailureClass, w.verdict, w.class, in.Reason)
		}
	}
	probe := s.Models[indexOf(s, "sample/fails-probe")].Instances[0]
	if !strings.Contains(probe.Reason, "state-dict-is-snapshot (state): failed") {
		t.Errorf("probe failure reason = %q, want it to name the probe", probe.Reason)
	}
	if !strings.Contains(stdout, "sample/fails-probe") || !strings.Contains(stdout, "REJECTION RATE") {
		t.Errorf("printed table lacks rows:\n%s", stdout)
	}

	// The same command again reuses every stored result: nothing runs twice.
	code, _, stderr = infradev(t, args...)
	if code != 0 || strings.Count(stderr, "(resumed)") != 5 {
		t.Errorf("rerun exit %d, log:\n%s\nwant 5 resumed attempts", code, stderr)
	}
}

func indexOf(s report.Summary, model string) int {
	for i, m := range s.Models {
		if m.Model == model {
			return i
		}
	}
	return 0
}

func TestRunTaskExitCodesAndJUnit(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	img := demoImage(t)
	store := storeFlags(t)[1]
	empty := filepath.Join(t.TempDir(), "empty.patch")
	os.WriteFile(empty, nil, 0o644)
	for _, c := range []struct {
		patch string
		code  int
	}{
		{filepath.Join(root, "tasks/demo/minitron-0001/gold.patch"), cli.ExitOK},
		{empty, cli.ExitFailed},
	} {
		out := t.TempDir()
		xml := filepath.Join(t.TempDir(), "bazel", "test.xml")
		t.Setenv("XML_OUTPUT_FILE", xml)
		code, stdout, stderr := infradev(t, append(storeFlags(t), "run-task",
			"--task", filepath.Join(root, "tasks/demo/minitron-0001"),
			"--probes", filepath.Join(root, "probes/demo/minitron-0001"),
			"--layout", filepath.Join(store, "oci"), "--image", img,
			"--patch", c.patch, "--out", out)...)
		if code != c.code {
			t.Errorf("run-task %s: exit %d, want %d\n%s%s", filepath.Base(c.patch), code, c.code, stdout, stderr)
		}
		if r, err := result.Read(filepath.Join(out, "result.json")); err != nil || !regexp.MustCompile(`^infradev/0\.1\.0\+[0-9a-f]{16}$`).MatchString(r.Inputs.Harness) {
			t.Errorf("result keyed by harness %q (%v), want the version plus the binary's digest", r.Inputs.Harness, err)
		}
		for _, f := range []string{filepath.Join(out, "result.json"), filepath.Join(out, "junit.xml"), xml, filepath.Join(out, "logs", "tests.log")} {
			if _, err := os.Stat(f); err != nil {
				t.Errorf("run-task %s: %v", filepath.Base(c.patch), err)
			}
		}
	}
}

// TestValidateDemoTask: a demo task validates, and with --record its validation record makes
// the catalogue call it validated on CPU; a record is refused when the environment's lock does
// not pin the image the validation ran on.
func TestValidateDemoTask(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	tree := t.TempDir()
	for _, d := range []string{"tasks/demo/minitron-0001", "probes/demo/minitron-0001", "environments/demo"} {
		if err := os.CopyFS(filepath.Join(tree, d), os.DirFS(filepath.Join(root, d))); err != nil {
			t.Fatal(err)
		}
	}
	record := filepath.Join(tree, "probes/demo/minitron-0001/validation.json")
	os.Remove(record)
	code, stdout, stderr := infradev(t, append(storeFlags(t), "validate", "--record",
		"--probes", filepath.Join(tree, "probes"), "--environments", filepath.Join(tree, "environments"),
		"--out", t.TempDir(), filepath.Join(tree, "tasks/demo/minitron-0001"))...)
	if code != 0 {
		t.Fatalf("validate exit %d\n%s%s", code, stdout, stderr)
	}
	if m := regexp.MustCompile(`minitron-0001 +3/3 resolved +official_tests_failed +7/7 as built +10/10 rejected +([0-9]+)/([0-9]+) withstood +[0-9]+s +ok`).FindStringSubmatch(stdout); m == nil || m[1] != m[2] {
		t.Errorf("validate table (every forgery withstood):\n%s", stdout)
	}
	catalogue := func() string {
		code, stdout, stderr := infradev(t, "catalogue", "--tasks", filepath.Join(tree, "tasks"),
			"--probes", filepath.Join(tree, "probes"), "--environments", filepath.Join(tree, "environments"))
		if code != 0 {
			t.Fatalf("catalogue exit %d\n%s%s", code, stdout, stderr)
		}
		return stdout
	}
	if out := catalogue(); !strings.Contains(out, "| minitron-0001 | (demo) |") || !strings.Contains(out, " | cpu |") {
		t.Errorf("catalogue after validate --record:\n%s", out)
	}

	// A lock that pins another image: the validation runs (on what env.yaml builds) but no
	// record vouches for it, and the old record reads stale.
	lockFile := filepath.Join(tree, "environments/demo/env.lock")
	lock, _ := os.ReadFile(lockFile)
	os.WriteFile(lockFile, []byte(strings.Replace(string(lock), `"manifest": "sha256:`, `"manifest": "sha256:0`, 1)), 0o644)
	code, stdout, stderr = infradev(t, append(storeFlags(t), "validate", "--record", "--runs", "1", "--no-tamper",
		"--probes", filepath.Join(tree, "probes"), "--environments", filepath.Join(tree, "environments"),
		"--out", t.TempDir(), filepath.Join(tree, "tasks/demo/minitron-0001"))...)
	if code != cli.ExitFailed || !strings.Contains(stderr, "env.lock pins sha256:0") {
		t.Errorf("validate --record with a lock for another image: exit %d\n%s%s", code, stdout, stderr)
	}
	if out := catalogue(); !strings.Contains(out, "stale (environment)") {
		t.Errorf("catalogue with the lock changed:\n%s", out)
	}
}

// TestValidateNamesBrokenProbes: a probe that imports the task's repository in its judging
// process, one with a syntax error, and a declared probe test that does not exist each fail
// the task's own check, named with file and line, before any submission runs; run-task grades
// an attempt on such a task task_error (exit 2), never against the submission.
func TestValidateNamesBrokenProbes(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	cases := []struct {
		name   string
		change func(src string) string
		want   string
	}{
		{"in-process probe", func(src string) string {
			anchor := "from infradev_probe import "
			return strings.Replace(src, anchor, "from minitron.model import MLP  # judged in process\n"+anchor, 1)
		}, `probes/test_probes.py:7: imports 'minitron.model' from the task repository in the judging process`},
		{"syntax error", func(src string) string { return src + "\n\ndef broken(:\n    pass\n" }, `probes/test_probes.py:[0-9]+: syntax error`},
		{"unknown probe test", func(src string) string {
			return strings.Replace(src, "def test_state_dict_is_a_snapshot(", "def test_renamed(", 1)
		}, `probe test test_probes.py::test_state_dict_is_a_snapshot does not exist`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tree := t.TempDir()
			for _, d := range []string{"tasks/demo/minitron-0001", "probes/demo/minitron-0001"} {
				if err := os.CopyFS(filepath.Join(tree, d), os.DirFS(filepath.Join(root, d))); err != nil {
					t.Fatal(err)
				}
			}
			file := filepath.Join(tree, "probes/demo/minitron-0001/test_probes.py")
			src, _ := os.ReadFile(file)
			changed := c.change(string(src))
			if changed == string(src) {
				t.Fatalf("the case's edit of %s changed nothing: the probe file no longer holds what it edits", file)
			}
			if err := os.WriteFile(file, []byte(changed), 0o644); err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := infradev(t, append(storeFlags(t), "validate", "--runs", "1",
				"--probes", filepath.Join(tree, "probes"), "--environments", filepath.Join(root, "environments"),
				"--out", t.TempDir(), filepath.Join(tree, "tasks/demo/minitron-0001"))...)
			if code != 1 || !regexp.MustCompile(`task error: .*`+c.want).MatchString(stdout) {
				t.Fatalf("validate exit %d, want 1 naming %q:\n%s%s", code, c.want, stdout, stderr)
			}
			code, stdout, _ = infradev(t, append(storeFlags(t), "run-task",
				"--task", filepath.Join(tree, "tasks/demo/minitron-0001"), "--probes", filepath.Join(tree, "probes/demo/minitron-0001"),
				"--layout", filepath.Join(testenv.Store(t), "oci"), "--image", demoImage(t),
				"--patch", filepath.Join(root, "tasks/demo/minitron-0001/gold.patch"), "--out", t.TempDir())...)
			if code != 2 || !strings.Contains(stdout, "not run (task error)") {
				t.Errorf("run-task exit %d, want 2 with a task error:\n%s", code, stdout)
			}
		})
	}
}

// TestEvalBucketingPredictions: minitron-0002's sample patches get the verdicts they were
// written for; the two that pass every official test are caught by the traffic and the
// structural probes.
func TestEvalBucketingPredictions(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	out := t.TempDir()
	code, stdout, stderr := infradev(t, append(storeFlags(t), "eval",
		"--predictions", filepath.Join(root, "tasks/demo/predictions/bucketing.jsonl"),
		"--run-id", "bucketing", "--out", out, "--results", "",
		"--tasks", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
		"--environments", filepath.Join(root, "environments"))...)
	if code != 0 {
		t.Fatalf("eval exit %d\n%s%s", code, stdout, stderr)
	}
	var s report.Summary
	data, _ := os.ReadFile(filepath.Join(out, "bucketing", "report.json"))
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"sample/gold":            "resolved",
		"sample/empty":           "not resolved (tests)",
		"sample/breaks-tests":    "not resolved (tests)",
		"sample/doubles-traffic": "not resolved (probe: interface, structural, traffic)",
		"sample/forgets-wiring":  "not resolved (probe: structural)",
	}
	for _, m := range s.Models {
		if got := m.Instances[0].Verdict; got != want[m.Model] {
			t.Errorf("%s: %q, want %q (%s)", m.Model, got, want[m.Model], m.Instances[0].Reason)
		}
	}
	if len(s.Models) != len(want) {
		t.Errorf("%d models in the report, want %d", len(s.Models), len(want))
	}
}

// TestEvalModelFiles: eval over each demo model file reports exactly the figures its picks
// were built to give (resolution rate, probe rejection rate, failure classes, failed probe
// categories), derived from models.yaml and each task's samples.yaml rather than written here.
func TestEvalModelFiles(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	sources, err := samples.Sources(filepath.Join(root, "tasks"), filepath.Join(root, "probes"), nil)
	if err != nil {
		t.Fatal(err)
	}
	models, picks, err := samples.LoadModels(filepath.Join(root, "tasks/demo/predictions/models.yaml"), sources)
	if err != nil {
		t.Fatal(err)
	}
	probes := map[string]*probe.Set{}
	for id, s := range sources {
		probes[id] = s.Probes
	}
	if len(models.Models) < 2 {
		t.Fatalf("%d model files, want at least 2 to compare", len(models.Models))
	}
	for _, m := range models.Models {
		want := samples.Expect(picks[m.Name], probes)
		out := t.TempDir()
		code, stdout, stderr := infradev(t, append(storeFlags(t), "eval",
			"--predictions", filepath.Join(models.Dir, m.File), "--run-id", "models", "--out", out, "--results", "",
			"--tasks", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
			"--environments", filepath.Join(root, "environments"))...)
		if code != 0 {
			t.Fatalf("eval %s: exit %d\n%s%s", m.File, code, stdout, stderr)
		}
		var s report.Summary
		data, _ := os.ReadFile(filepath.Join(out, "models", "report.json"))
		if err := json.Unmarshal(data, &s); err != nil || len(s.Models) != 1 {
			t.Fatalf("%s: report.json: %v\n%s", m.File, err, data)
		}
		got := s.Models[0]
		if got.ErrorInstances != 0 {
			t.Errorf("%s: %d instances hit infrastructure errors: %v", m.Name, got.ErrorInstances, got.ErrorIDs)
		}
		gotFigures := samples.Expected{Submitted: got.SubmittedInstances, Resolved: got.ResolvedInstances,
			PassedOfficialTests: got.PassedOfficialTests, ProbeRejected: got.ProbeRejected,
			FailureClasses: got.FailureClasses, ProbeCategories: got.ProbeCategories}
		if diff := cmp.Diff(want, gotFigures, cmpopts.EquateEmpty()); diff != "" {
			for _, in := range got.Instances {
				t.Logf("%s %s: %s (%s)", m.Name, in.InstanceID, in.Verdict, in.Reason)
			}
			t.Errorf("%s: report figures (-built for +reported):\n%s", m.Name, diff)
		}
		rate, rejection := float64(want.Resolved)/float64(want.Submitted), float64(want.ProbeRejected)/float64(want.PassedOfficialTests)
		if got.ResolutionRate != rate || got.ProbeRejectionRate != rejection {
			t.Errorf("%s: resolution %.3f rejection %.3f, want %.3f %.3f", m.Name, got.ResolutionRate, got.ProbeRejectionRate, rate, rejection)
		}
		t.Logf("%s: resolved %d/%d (%.1f%%), probes rejected %d of %d that passed official tests (%.1f%%), categories %v",
			m.Name, got.ResolvedInstances, got.SubmittedInstances, 100*rate, got.ProbeRejected, got.PassedOfficialTests, 100*rejection, got.ProbeCategories)
	}
}
