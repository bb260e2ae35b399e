package resultstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/resultstore"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/task"
)

// fakeAttempter counts runs and writes a result whose class it is told.
type fakeAttempter struct {
	runs  int
	class string
}

func (f *fakeAttempter) Digests(in runner.Inputs) (result.Inputs, error) {
	return result.Inputs{Task: "sha256:task", Patch: "sha256:" + string(in.Patch)}, nil
}

func (f *fakeAttempter) Run(_ context.Context, in runner.Inputs, out string) (*result.Result, error) {
	f.runs++
	keys, _ := f.Digests(in)
	r := &result.Result{Schema: result.Schema, InstanceID: in.Task.ID, Model: in.Model, Inputs: keys,
		Resolved: f.class == "", FailureClass: f.class}
	return r, result.Write(filepath.Join(out, "result.json"), r)
}

func TestCachedRunsEachInputOnce(t *testing.T) {
	dir := t.TempDir()
	f := &fakeAttempter{}
	var log bytes.Buffer
	c := resultstore.Cached{Attempter: f, Store: resultstore.Store{Dir: filepath.Join(dir, "store")}, Log: &log}
	in := runner.Inputs{Task: &task.Task{ID: "t-1"}, Patch: []byte("p1"), Model: "a"}
	run := func(in runner.Inputs, out string) *result.Result {
		t.Helper()
		os.MkdirAll(out, 0o755)
		r, err := c.Run(context.Background(), in, out)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	run(in, filepath.Join(dir, "1"))
	in.Model = "b"
	r := run(in, filepath.Join(dir, "2"))
	if f.runs != 1 || r.Model != "b" || !strings.Contains(log.String(), "t-1: result from the results store") {
		t.Errorf("same inputs: %d runs, model %q, log %q; want 1 run, the stored result as model b", f.runs, r.Model, log.String())
	}
	if got, err := result.Read(filepath.Join(dir, "2", "result.json")); err != nil || got.Model != "b" {
		t.Errorf("run folder 2: %+v, %v", got, err)
	}
	in.Patch = []byte("p2")
	run(in, filepath.Join(dir, "3"))
	if f.runs != 2 {
		t.Errorf("a new patch: %d runs, want 2", f.runs)
	}
	// A directory store without the entry says so.
	if _, err := (resultstore.Store{Dir: filepath.Join(dir, "store")}).CopyOut("0000", filepath.Join(dir, "x"), result.Identity{Model: "m", InstanceID: "t-1"}); !errors.Is(err, resultstore.ErrNotStored) {
		t.Errorf("Store.CopyOut of a missing key: %v, want ErrNotStored", err)
	}
	// Infrastructure errors are not stored: the next attempt runs.
	f.class = result.InfraError
	in.Patch = []byte("p3")
	run(in, filepath.Join(dir, "4"))
	run(in, filepath.Join(dir, "5"))
	if f.runs != 4 {
		t.Errorf("after an infra error: %d runs, want 4 (nothing stored)", f.runs)
	}
	// Without a store every attempt runs.
	c.Store = nil
	in.Patch = []byte("p1")
	run(in, filepath.Join(dir, "6"))
	if f.runs != 5 {
		t.Errorf("no store: %d runs, want 5", f.runs)
	}
}
