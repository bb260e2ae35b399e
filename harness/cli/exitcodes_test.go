package cli_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExitCodes runs the CLI into each class of failure and checks the documented exit code
// and that the message says what went wrong: 1 a check failed, 2 bad usage or input, 3 an
// infrastructure fault, whatever command it surfaced in.
func TestExitCodes(t *testing.T) {
	root := repoRoot(t)
	dir := t.TempDir()
	preds := predictionsFile(t, dir, map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "m", "model_patch": ""})
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"instance_id": "minitron-0001", "model": "m", "model_patch": ""}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	brokenTask := filepath.Join(dir, "tasks", "demo", "broken-0001")
	if err := os.MkdirAll(brokenTask, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(brokenTask, "task.yaml"), []byte("schema: infradev.task/v1\nid: broken-0001\nresources: {memory: lots}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "README.md")
	if err := os.WriteFile(stale, []byte("<!-- catalogue: written by `infradev catalogue --write`; do not edit -->\nold\n<!-- end of catalogue -->\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A port nothing listens on: take one, then close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	for _, tc := range []struct {
		name string
		args []string
		code int
		say  string
	}{
		{"unknown flag", []string{"--no-such-flag"}, 2, "unknown flag"},
		{"unknown command", []string{"no-such-command"}, 2, "unknown command"},
		{"missing required flag", []string{"eval"}, 2, `"predictions" not set`},
		{"wrong argument count", []string{"report", "a", "b"}, 2, "accepts 1 arg"},
		{"bad spec file", []string{"validate", "--schema-only", brokenTask}, 2, "task.yaml:3: resources.memory"},
		{"bad predictions line", evalArgs(t, bad, dir, "x"), 2, "bad.jsonl:1: model"},
		{"bad --match pattern", evalArgs(t, preds, dir, "x", "--match", "tasks/[demo"), 2, "--match"},
		{"no such agent", []string{"agent", "run", "--agent", "nobody", "--agents", dir, "--tasks", "minitron-0001", "--run-id", "x"}, 2, `agent "nobody"`},
		{"empty run folder", []string{"analyze", dir}, 2, "holds no results"},
		{"bad --ranks", []string{"task", "import", "--repo", "https://example.com/x", "--merge-commit", "abc", "--env", "demo", "--id", "x-0001", "--ranks", "65"}, 2, "--ranks: must be between 1 and 64"},
		{"results server unreachable", append(evalArgs(t, preds, dir, "x"), "--results", closed), 3, "the results server " + closed + " cannot be reached"},
		{"catalogue not current", []string{"catalogue", "--tasks", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"), "--check", stale}, 1, "not current"},
		{"version", []string{"version"}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := infradev(t, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.say) {
				t.Errorf("infradev %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(tc.args, " "), code, stderr, tc.code, tc.say)
			}
		})
	}
}

// TestInfrastructureFaultInEvalExits3: when the container runtime is gone every attempt ends in
// an infrastructure fault; the evaluation keeps its (infra_error) results, counts nothing
// against the model and exits 3 saying the same command runs them again.
func TestInfrastructureFaultInEvalExits3(t *testing.T) {
	requireSandbox(t)
	demoImage(t)
	dir := t.TempDir()
	preds := predictionsFile(t, dir, map[string]string{"instance_id": "minitron-0001", "model_name_or_path": "m", "model_patch": ""})
	t.Setenv("INFRADEV_RUNTIME", filepath.Join(dir, "no-such-runtime"))
	code, _, stderr := infradev(t, evalArgs(t, preds, dir, "broken-runtime")...)
	if code != 3 || !strings.Contains(stderr, "infrastructure fault") || !strings.Contains(stderr, "the same command runs them again") {
		t.Errorf("eval with no runtime: exit %d, stderr %q; want 3 naming the infrastructure fault", code, stderr)
	}
}
