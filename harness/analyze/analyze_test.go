package analyze_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/infradev/infradev/harness/analyze"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/skill"
)

const gold = `diff --git a/pkg/buffer.py b/pkg/buffer.py
--- a/pkg/buffer.py
+++ b/pkg/buffer.py
@@ -1,2 +1,5 @@
 def make(n):
-    return [0] * n
+    if n < 0:
+        raise ValueError("n must not be negative")
+    data = bytearray(n)
+    return memoryview(data)
`

// The same change plus a test that measures memory.
const copied = gold + `diff --git a/tests/test_buffer.py b/tests/test_buffer.py
new file mode 100644
--- /dev/null
+++ b/tests/test_buffer.py
@@ -0,0 +3 @@
+import tracemalloc
+def test_make_is_small():
+    tracemalloc.start(); make(10); assert tracemalloc.get_traced_memory()[1] < 1 << 20
`

const own = `diff --git a/pkg/buffer.py b/pkg/buffer.py
--- a/pkg/buffer.py
+++ b/pkg/buffer.py
@@ -1,2 +1,2 @@
 def make(n):
-    return [0] * n
+    return list(range(n))
diff --git a/tests/test_buffer.py b/tests/test_buffer.py
new file mode 100644
--- /dev/null
+++ b/tests/test_buffer.py
@@ -0,0 +2 @@
+def test_make():
+    assert len(make(3)) == 3
`

func writeResult(t *testing.T, run, model, id, class, patch string, cats ...string) {
	t.Helper()
	dir := filepath.Join(run, model, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &result.Result{Schema: result.Schema, Model: model, InstanceID: id, Project: "demo", PromptVariant: "instruction",
		Resolved: class == "", FailureClass: class, FailedProbeCategories: cats, Reason: "secret reason " + id, EmptyPatch: patch == ""}
	if class == result.ProbesFailed {
		r.Phases = []result.Phase{{Name: "tests", Status: "passed"}, {Name: "probes", Status: "failed",
			Tests: []result.TestOutcome{{ID: "test_probes.py::test_x", Outcome: "failed", Probe: "secret-probe-id", Category: cats[0]}}}}
	}
	if err := result.Write(filepath.Join(dir, "result.json"), r); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "submission.patch"), []byte(patch), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestAnalyzeAndDistil(t *testing.T) {
	run := t.TempDir()
	writeResult(t, run, "m", "t1", "", copied)
	writeResult(t, run, "m", "t2", result.ProbesFailed, own, "state")
	writeResult(t, run, "m", "t3", result.OfficialTestsFailed, own)
	writeResult(t, run, "m", "t4", result.InfraError, own) // not graded: left out everywhere
	golds := map[string]string{"t1": gold, "t2": gold}
	a, err := analyze.Run(analyze.Config{RunDir: run, Gold: func(id string) ([]byte, error) {
		if g, ok := golds[id]; ok {
			return []byte(g), nil
		}
		return nil, errors.New("no mirror")
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Contamination) != 1 {
		t.Fatalf("contamination = %+v", a.Contamination)
	}
	c := a.Contamination[0]
	if len(c.NearVerbatim) != 1 || c.NearVerbatim[0].InstanceID != "t1" || c.NearVerbatim[0].Value != 1 || c.Compared != 2 {
		t.Errorf("near-verbatim = %+v (compared %d), want t1 at 1.0 of 2 compared", c.NearVerbatim, c.Compared)
	}
	if c.Graded != 3 || c.Resolved != 1 || c.GradedWithout != 2 || c.ResolvedWithout != 0 || c.ResolutionRateWithout != 0 {
		t.Errorf("rates = %+v, want 1/3 with, 0/2 without", c)
	}
	if diff := cmp.Diff([]string{"t3"}, c.Unavailable); diff != "" {
		t.Errorf("gold unavailable (-want +got):\n%s", diff)
	}
	o := a.OwnTests[0]
	if o.Submissions != 3 || o.WithTests != 3 || o.Checks["memory"] != 1 || o.CheckShares["memory"] != 1.0/3 || o.Checks["time"] != 0 {
		t.Errorf("own tests = %+v, want 3 of 3 with tests, 1 measuring memory", o)
	}
	var probeExample *analyze.Example
	for i, e := range a.Examples {
		if e.Failure == "probe: state" {
			probeExample = &a.Examples[i]
		}
		if e.InstanceID == "t4" {
			t.Errorf("an infrastructure error is an example: %+v", e)
		}
	}
	if probeExample == nil || probeExample.Dir != filepath.Join("m", "t2") || len(probeExample.FailedProbes) != 1 {
		t.Errorf("probe example = %+v, want t2 linked to m/t2 naming its probe", probeExample)
	}
	if err := analyze.Write(run, a); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(run, "analysis.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Failure taxonomy", "## The agents' own tests", "## Contamination", "t1 1.00", "[result](m/t2)"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("analysis.md lacks %q:\n%s", want, md)
		}
	}

	dir := filepath.Join(t.TempDir(), "skill")
	s := skill.Distill(a)
	if err := s.Write(dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "SKILL.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if !strings.HasPrefix(text, "---\nname: "+skill.Name+"\ndescription: ") || !strings.Contains(text, "\n---\n") {
		t.Errorf("SKILL.md lacks the front matter:\n%s", text)
	}
	// The checklist for the project: what was caught, most often first; time and traffic were
	// measured by few of the agents' tests, so the skill asks for such a test.
	for _, want := range []string{"## demo", "**official_tests_failed**", "**state**", "measures memory, time, traffic"} {
		if !strings.Contains(text, want) {
			t.Errorf("SKILL.md lacks %q:\n%s", want, text)
		}
	}
	// Nothing of the hidden checks or of failures' messages leaks into the skill.
	for _, secret := range []string{"secret-probe-id", "secret reason", "test_probes.py", "ValueError"} {
		if strings.Contains(text, secret) {
			t.Errorf("SKILL.md leaks %q", secret)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "references", "demo.md")); err != nil {
		t.Error(err)
	}
}

func TestAnalyzeEmptyRun(t *testing.T) {
	if _, err := analyze.Run(analyze.Config{RunDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "no results") {
		t.Errorf("empty run: %v, want an error saying it holds no results", err)
	}
}
