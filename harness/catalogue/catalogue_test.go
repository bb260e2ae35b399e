package catalogue_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/catalogue"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/validate"
)

// tree copies one demo task, its probes and its environment's lock into a fresh root.
func tree(t *testing.T) (root string, tk *task.Task) {
	t.Helper()
	src := testenv.RepoRoot(t)
	root = t.TempDir()
	for _, d := range []string{"tasks/demo/minirl-0001", "probes/demo/minirl-0001"} {
		if err := os.CopyFS(filepath.Join(root, d), os.DirFS(filepath.Join(src, d))); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(root, d, validate.RecordFile))
	}
	lock, err := os.ReadFile(filepath.Join(src, "environments/demo", image.LockFile))
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "environments/demo"), 0o755)
	if err := os.WriteFile(filepath.Join(root, "environments/demo", image.LockFile), lock, 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err = task.Load(filepath.Join(root, "tasks/demo/minirl-0001"))
	if err != nil {
		t.Fatal(err)
	}
	return root, tk
}

func rows(t *testing.T, root string) []catalogue.Row {
	t.Helper()
	rs, err := catalogue.Rows(filepath.Join(root, "tasks"), filepath.Join(root, "probes"), filepath.Join(root, "environments"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("rows: %d, want 1", len(rs))
	}
	return rs
}

// record writes the record a passing validation would write.
func record(t *testing.T, root string, tk *task.Task) {
	t.Helper()
	lock, err := image.ReadLock(filepath.Join(root, "environments/demo"))
	if err != nil || lock == nil {
		t.Fatalf("lock: %v", err)
	}
	rep := &validate.Report{Task: tk.ID, GoldRuns: 3, GoldResolved: 3, Empty: "ok", TamperRuns: 2, TamperOK: 2, Forgeries: 2, ForgeriesOK: 2}
	pdir := filepath.Join(root, "probes/demo/minirl-0001")
	td, pd, err := validate.Digests(tk, pdir)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := validate.NewRecord(rep, tk, pdir, td, pd, lock.Manifest, "harness", "cpu", time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.WriteRecord(pdir, rec); err != nil {
		t.Fatal(err)
	}
}

// TestStatusComesFromTheRecord: no record is unvalidated; a record written for the task as it is
// makes it cpu; any later change to the task, its probes or samples, or its environment's lock
// makes it stale, naming what changed.
func TestStatusComesFromTheRecord(t *testing.T) {
	root, tk := tree(t)
	if s := rows(t, root)[0].Status; s != "unvalidated" {
		t.Fatalf("no record: status %q", s)
	}
	record(t, root, tk)
	r := rows(t, root)[0]
	if r.Status != "cpu" || r.ID != "minirl-0001" || r.Project != "minirl" || r.Probes == 0 || len(r.Categories) == 0 {
		t.Fatalf("fresh record: %+v", r)
	}
	for _, c := range []struct{ file, want string }{
		{"tasks/demo/minirl-0001/instruction.md", "stale (task)"},
		{"probes/demo/minirl-0001/samples.yaml", "stale (probes)"},
		{"environments/demo/" + image.LockFile, "stale (environment)"},
	} {
		t.Run(c.file, func(t *testing.T) {
			record(t, root, tk)
			p := filepath.Join(root, c.file)
			old, _ := os.ReadFile(p)
			edit := append(append([]byte{}, old...), '\n')
			if strings.HasSuffix(c.file, image.LockFile) {
				edit = []byte(strings.Replace(string(old), `"manifest": "sha256:`, `"manifest": "sha256:0`, 1))
			}
			os.WriteFile(p, edit, 0o644)
			defer os.WriteFile(p, old, 0o644)
			if s := rows(t, root)[0].Status; s != c.want {
				t.Fatalf("after editing %s: status %q, want %q", c.file, s, c.want)
			}
		})
	}
	// A record made before the forgery check is shown as such.
	record(t, root, tk)
	p := filepath.Join(root, "probes/demo/minirl-0001", validate.RecordFile)
	data, _ := os.ReadFile(p)
	os.WriteFile(p, []byte(strings.Replace(string(data), validate.RecordSchema, validate.LegacySchema, 1)), 0o644)
	if s := rows(t, root)[0].Status; s != "cpu (before the forgery check)" {
		t.Fatalf("legacy record: status %q", s)
	}
	// A Bazel file beside the task is not part of what was validated.
	record(t, root, tk)
	os.WriteFile(filepath.Join(root, "tasks/demo/minirl-0001/BUILD.bazel"), []byte("# edited\n"), 0o644)
	if s := rows(t, root)[0].Status; s != "cpu" {
		t.Fatalf("after editing BUILD.bazel: %q", s)
	}
}

// TestBadRecordsAreNamed: a record that is not JSON, has another schema, an unknown field or a
// status other than cpu/gpu is an error naming the file and field, never a status.
func TestBadRecordsAreNamed(t *testing.T) {
	root, _ := tree(t)
	p := filepath.Join(root, "probes/demo/minirl-0001", validate.RecordFile)
	for name, c := range map[string]struct{ data, want string }{
		"not json":      {`{"schema":`, "validation.json"},
		"schema":        {`{"schema":"infradev.validation/v0","status":"cpu"}`, "field schema"},
		"unknown field": {`{"schema":"infradev.validation/v1","status":"cpu","passed":true}`, `unknown field "passed"`},
		"status":        {`{"schema":"infradev.validation/v2","status":"resolved"}`, "field status"},
	} {
		t.Run(name, func(t *testing.T) {
			os.WriteFile(p, []byte(c.data), 0o644)
			_, err := catalogue.Rows(filepath.Join(root, "tasks"), filepath.Join(root, "probes"), filepath.Join(root, "environments"))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) && name != "unknown field" {
				t.Fatalf("got %v, want an error naming %s and %q", err, p, c.want)
			}
		})
	}
	// No record is written for a validation that failed, nor for one during which the task or
	// its probes changed.
	os.Remove(p)
	tk, _ := task.Load(filepath.Join(root, "tasks/demo/minirl-0001"))
	td, pd, err := validate.Digests(tk, filepath.Dir(p))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := validate.NewRecord(&validate.Report{Task: tk.ID, GoldRuns: 3, GoldResolved: 2, Empty: "ok"}, tk,
		filepath.Dir(p), td, pd, "", "h", "cpu", time.Now()); err == nil {
		t.Fatal("a record for a failed validation")
	}
	ok := &validate.Report{Task: tk.ID, GoldRuns: 3, GoldResolved: 3, Empty: "ok", TamperRuns: 2, TamperOK: 2, Forgeries: 2, ForgeriesOK: 2}
	if _, err := validate.NewRecord(ok, tk, filepath.Dir(p), td, pd, "", "h", "cpu", time.Now()); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(filepath.Dir(p), "test_probes.py"), []byte("# edited while validating\n"), 0o644)
	if _, err := validate.NewRecord(ok, tk, filepath.Dir(p), td, pd, "", "h", "cpu", time.Now()); err == nil || !strings.Contains(err.Error(), "changed while it was validated") {
		t.Fatalf("a record for probes edited during validation: %v", err)
	}
}

// TestSplice: the table replaces what lies between the markers and nothing else; a document
// without markers is an error; Markdown cells cannot be broken by a pipe or a line break.
func TestSplice(t *testing.T) {
	doc := []byte("# T\n\nbefore\n" + catalogue.Begin + "old table\n" + catalogue.End + "after\n")
	out, err := catalogue.Splice(doc, []byte("new\n"), "README.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# T\n\nbefore\n" + catalogue.Begin + "new\n" + catalogue.End + "after\n"; string(out) != want {
		t.Fatalf("spliced:\n%s", out)
	}
	if _, err := catalogue.Splice([]byte("no markers\n"), []byte("x"), "README.md"); err == nil || !strings.Contains(err.Error(), "README.md") {
		t.Fatalf("no markers: %v", err)
	}
	md := string(catalogue.Markdown([]catalogue.Row{{ID: "x-0001", Project: "x", Kind: "a | b\nc", Status: "cpu"}}))
	if !strings.Contains(md, `| a \| b c |`) || strings.Count(md, "\n| x-0001") != 1 {
		t.Fatalf("cell escaping:\n%s", md)
	}
	if !strings.Contains(md, "Demo tasks: 1. By project: x 1.") || strings.Contains(md, "Upstream tasks") {
		t.Fatalf("summary:\n%s", md)
	}
	md = string(catalogue.Markdown([]catalogue.Row{
		{ID: "u-0001", Project: "u", Upstream: "o/u@0123456789ab", GPUs: 2, PoolGPUs: 4, Categories: []string{"state", "time"}, Status: "gpu-pending"},
		{ID: "u-0002", Project: "u", Upstream: "o/u@ba9876543210", PoolGPUs: 1, Categories: []string{"state"}, Status: "cpu"},
		{ID: "x-0001", Project: "x", Categories: []string{"time"}, Status: "stale (probes)"},
	}))
	for _, want := range []string{
		"Upstream tasks: 2. By project: u 2. By GPUs here: 0 1, 2 1. By GPUs on a pool: 1 1, 4 1. Probe categories (tasks with one): state 2, time 1. Status: cpu 1, gpu-pending 1.\n",
		"Demo tasks: 1. By project: x 1. By GPUs here: 0 1. By GPUs on a pool: 0 1. Probe categories (tasks with one): time 1. Status: stale 1.\n",
	} {
		if !strings.Contains(md, want) {
			t.Fatalf("summary lacks %q:\n%s", want, md)
		}
	}
}

// TestREADMECatalogueIsCurrent: the table in the README is what the tasks and their records say
// (run `infradev catalogue --write README.md` when this fails).
func TestREADMECatalogueIsCurrent(t *testing.T) {
	root := testenv.RepoRoot(t)
	rs, err := catalogue.Rows(filepath.Join(root, "tasks"), filepath.Join(root, "probes"), filepath.Join(root, "environments"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := catalogue.Splice(doc, catalogue.Markdown(rs), "README.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != string(doc) {
		t.Fatal("README.md catalogue is not current: run infradev catalogue --write README.md")
	}
}
