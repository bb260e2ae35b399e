package validate_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/validate"
)

// A probe that draws fresh inputs but compares two values its own child sent: the empty patch
// passes it under every forgery, and only the forgery check can tell.
const trustingProbe = `from infradev_probe import fresh, run


def test_the_child_agrees_with_itself():
    x = int(fresh().integers(1 << 30))
    out = run("""
        from minitron.checkpoint import save_checkpoint
        emit(a=ARGS["x"], b=ARGS["x"], saved=callable(save_checkpoint))
    """, {"x": x})
    assert out["a"] == out["b"] and out["saved"]
`

// TestForgeryCheckRefusesAProbeThatDecidesFromTheChild validates minitron-0003 with one more
// probe, which compares child data with child data, through the real runner: its own samples
// cannot show the flaw (the probe passes gold and is failed by no sample), the forgery check
// refuses it with its file and line, and the task's own probes withstand every forgery.
func TestForgeryCheckRefusesAProbeThatDecidesFromTheChild(t *testing.T) {
	testenv.RequireSandbox(t)
	tk, ps := testenv.Task(t, "demo", "minitron-0003")
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-a", ps.Dir+"/.", dir).CombinedOutput(); err != nil {
		t.Fatalf("copying the probes: %v %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "test_trusting.py"), []byte(trustingProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	yaml, _ := os.ReadFile(filepath.Join(dir, "probes.yaml"))
	yaml = append(yaml, []byte(`  - id: trusts-the-child
    category: interface
    test: test_trusting.py::test_the_child_agrees_with_itself
    description: compares two values of one child.
`)...)
	if err := os.WriteFile(filepath.Join(dir, "probes.yaml"), yaml, 0o644); err != nil {
		t.Fatal(err)
	}
	weak, err := probe.Load(dir, tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	r := testenv.Runner(t, nil)
	in := testenv.Inputs(t, tk, weak, nil)
	gold, err := os.ReadFile(tk.GoldFile())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := validate.Task(context.Background(), r, in, nil, gold, validate.Options{Runs: 1, Out: t.TempDir(), Tamper: true})
	if err != nil {
		t.Fatal(err)
	}
	var refused []string
	for _, p := range rep.Problems {
		if strings.Contains(p, "decides from data the child reports") {
			refused = append(refused, p)
		}
	}
	want := "probes/test_trusting.py:4: probe trusts-the-child passes over the empty patch when its children forge their messages (gold's messages replayed verbatim)"
	if len(refused) == 0 || !strings.HasPrefix(refused[0], want) {
		t.Fatalf("the forgery check's findings %q, want one starting %q (all problems: %q)", refused, want, rep.Problems)
	}
	for _, p := range refused {
		if !strings.Contains(p, "trusts-the-child") {
			t.Errorf("a probe of the task's own was refused: %s", p)
		}
	}
	if rep.Forgeries < 3 || rep.ForgeriesOK == rep.Forgeries {
		t.Errorf("forgeries %d/%d withstood, want at least 3 runs and some not withstood", rep.ForgeriesOK, rep.Forgeries)
	}
}
