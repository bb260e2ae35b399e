package upstream_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/fixture"
	"github.com/infradev/infradev/harness/mirror"
	"github.com/infradev/infradev/harness/upstream"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		glob, path string
		want       bool
	}{
		{"tests/**", "tests/unit/test_a.py", true},
		{"tests/**", "megatron/tests.py", false},
		{"**/tests/**", "pkg/sub/tests/helpers.py", true},
		{"**/test_*.py", "test_top.py", true},
		{"**/test_*.py", "pkg/test_x.py", true},
		{"**/test_*.py", "pkg/attest_x.py", false},
		{"**/conftest.py", "conftest.py", true},
		{"docs/*.md", "docs/a/b.md", false},
	}
	for _, c := range cases {
		if got := upstream.Match(c.glob, c.path); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.glob, c.path, got, c.want)
		}
	}
}

func TestMaterialize(t *testing.T) {
	u := fixture.New(t)
	store := t.TempDir()
	m, _ := mirror.Parse(fixture.URL+"="+u.GitDir, "test")
	c := upstream.Change{URL: fixture.URL, BaseCommit: u.Base, MergeCommit: u.Merge}
	d, err := upstream.Materialize(context.Background(), store, c, m)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(d.GoldFiles, " ") != "calc/__init__.py calc/ops.py" || strings.Join(d.TestFiles, " ") != "tests/test_ops.py tests/test_util.py" {
		t.Errorf("gold %v, tests %v", d.GoldFiles, d.TestFiles)
	}
	gold, _ := os.ReadFile(filepath.Join(d.Dir, upstream.GoldFile))
	tests, _ := os.ReadFile(filepath.Join(d.Dir, upstream.TestFile))
	pr, _ := os.ReadFile(filepath.Join(d.Dir, upstream.PRFile))
	if !strings.Contains(string(gold), "+def mul(a, b):") || strings.Contains(string(gold), "tests/") {
		t.Errorf("gold patch:\n%s", gold)
	}
	if !strings.Contains(string(tests), "+def test_mul():") || strings.Contains(string(tests), "calc/ops.py") {
		t.Errorf("test patch:\n%s", tests)
	}
	if strings.TrimSpace(string(pr)) != strings.TrimSpace(fixture.Message) {
		t.Errorf("PR description %q", pr)
	}
	// A stored derivation needs no mirror; a tampered one is refused.
	again, err := upstream.Materialize(context.Background(), store, c, nil)
	if err != nil || again.Gold != d.Gold {
		t.Fatalf("from the store without a mirror: %v, %v", again, err)
	}
	os.WriteFile(filepath.Join(d.Dir, upstream.GoldFile), []byte("tampered"), 0o644)
	if _, err := upstream.Read(d.Dir); err == nil || !strings.Contains(err.Error(), "recorded") {
		t.Errorf("a changed gold.patch was read back: %v", err)
	}
	// Other rules, other derivation: with tests/** only, test_ops.py is still a test.
	c2 := c
	c2.Tests = []string{"tests/**"}
	if c2.Key() == c.Key() {
		t.Error("the rules are not part of the key")
	}
	// A change with no test file under the rules is refused.
	c3 := c
	c3.Tests = []string{"nothing/**"}
	if _, err := upstream.Materialize(context.Background(), t.TempDir(), c3, m); err == nil || !strings.Contains(err.Error(), "no test files") {
		t.Errorf("no official tests: %v", err)
	}
}

// TestProvenance: a task directory holding a copy of an upstream file, or a patch file, is
// named; one holding only its own text is not.
func TestProvenance(t *testing.T) {
	u := fixture.New(t)
	taskDir, probesDir := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(taskDir, "task.yaml"), []byte("schema: infradev.task/v1\nid: calc-0001\n# written here, long enough to be compared with the blobs\n"), 0o644)
	os.WriteFile(filepath.Join(taskDir, "instruction.md"), []byte("Add mul and power to calc, with the interfaces below, written here.\n"), 0o644)
	clean, err := upstream.Provenance(context.Background(), []string{taskDir, probesDir}, u.GitDir)
	if err != nil || len(clean) != 0 {
		t.Fatalf("a clean task: %v %v", clean, err)
	}
	ops, _ := os.ReadFile(filepath.Join(u.Work, "calc", "ops.py"))
	os.WriteFile(filepath.Join(probesDir, "reference_ops.py"), ops, 0o644)
	os.WriteFile(filepath.Join(taskDir, "gold.patch"), []byte("diff --git a/x b/x\n"), 0o644)
	got, err := upstream.Provenance(context.Background(), []string{taskDir, probesDir}, u.GitDir)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(got, "\n")
	if len(got) != 2 || !strings.Contains(text, "reference_ops.py: its bytes are blob") || !strings.Contains(text, "gold.patch: an upstream task carries no patch files") {
		t.Errorf("Provenance() =\n%s", text)
	}
	// Offline (no mirror): the patch file is still named.
	if got, _ := upstream.Provenance(context.Background(), []string{taskDir}, ""); len(got) != 1 {
		t.Errorf("offline: %v", got)
	}
}

// TestOnGold: a diff written over the gold tree becomes one submission against the base, which
// git applies there and which holds both the change and the diff.
func TestOnGold(t *testing.T) {
	u := fixture.New(t)
	m, _ := mirror.Parse(fixture.URL+"="+u.GitDir, "test")
	d, err := upstream.Materialize(context.Background(), t.TempDir(), upstream.Change{URL: fixture.URL, BaseCommit: u.Base, MergeCommit: u.Merge}, m)
	if err != nil {
		t.Fatal(err)
	}
	gold, _ := os.ReadFile(filepath.Join(d.Dir, upstream.GoldFile))
	wrong := []byte("--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -5,3 +5,3 @@\n def mul(a, b):\n-    return a * b\n+    return a * b if a else b\n \n")
	sub, err := upstream.OnGold(context.Background(), u.GitDir, u.Base, gold, wrong)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sub), "+    return a * b if a else b") || !strings.Contains(string(sub), "+def power(a, n):") {
		t.Errorf("composed submission:\n%s", sub)
	}
	if _, err := upstream.OnGold(context.Background(), u.GitDir, u.Base, gold, []byte("--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n")); err == nil ||
		!strings.Contains(err.Error(), "does not apply over gold") {
		t.Errorf("a diff that does not apply over gold: %v", err)
	}
}
