package submissions_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/submissions"
)

// Patches a path that re-encodes, normalizes or trims text would change.
var crafted = map[string]string{
	"non-ascii":  "diff --git a/r\u00e9sum\u00e9.md b/r\u00e9sum\u00e9.md\n+R\u00e9sum\u00e9 \u2014 caf\u00e9 \u6570\u636e\n",
	"crlf":       "diff --git a/a b/a\n+one\r\n+two\r\n",
	"no-newline": "diff --git a/a b/a\n+x\n\\ No newline at end of file",
	"empty":      "",
	"large":      strings.Repeat("+a line of a large patch\n", 200000),
}

func predictionsFile(t *testing.T, lines ...map[string]any) string {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		data, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
		b.WriteByte('\n')
	}
	p := filepath.Join(t.TempDir(), "preds.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func noGold(context.Context) ([]byte, error) { return nil, errors.New("unused") }

func TestPatchesAreWrittenByteForByte(t *testing.T) {
	var lines []map[string]any
	var tasks []submissions.Task
	for id, patch := range crafted {
		lines = append(lines, map[string]any{"instance_id": id, "model_name_or_path": "m", "model_patch": patch})
		tasks = append(tasks, submissions.Task{ID: id, Gold: noGold})
	}
	tasks = append(tasks, submissions.Task{ID: "no-prediction", Gold: noGold})
	dir := t.TempDir()
	ws, err := submissions.Write(context.Background(), dir, tasks, submissions.Options{Predictions: predictionsFile(t, lines...)})
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != len(tasks) {
		t.Fatalf("wrote %d, want %d", len(ws), len(tasks))
	}
	for id, want := range crafted {
		got, err := os.ReadFile(filepath.Join(dir, id+".patch"))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s.patch differs from the prediction's model_patch (%d bytes, want %d)", id, len(got), len(want))
		}
		d, _ := os.ReadFile(filepath.Join(dir, id+".digest"))
		if strings.TrimSpace(string(d)) != digest.Bytes([]byte(want)) {
			t.Errorf("%s.digest = %q, want %s", id, d, digest.Bytes([]byte(want)))
		}
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "no-prediction.patch")); len(got) != 0 {
		t.Errorf("a task without a prediction got %d bytes, want an empty patch", len(got))
	}
	build, _ := os.ReadFile(filepath.Join(dir, "BUILD.bazel"))
	if !strings.Contains(string(build), `exports_files(glob(["*.patch", "*.digest"]))`) {
		t.Errorf("BUILD.bazel exports nothing:\n%s", build)
	}
}

func TestGoldAndTheTasksWhoseGoldCannotBeHad(t *testing.T) {
	dir := t.TempDir()
	tasks := []submissions.Task{
		{ID: "local", Gold: func(context.Context) ([]byte, error) { return []byte(crafted["non-ascii"]), nil }},
		{ID: "upstream", Gold: func(context.Context) ([]byte, error) { return nil, errors.New("no mirror has commit abc") }},
	}
	if _, err := submissions.Write(context.Background(), dir, tasks, submissions.Options{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "local.patch")); string(got) != crafted["non-ascii"] {
		t.Errorf("gold written as %q", got)
	}
	why, _ := os.ReadFile(filepath.Join(dir, "upstream.why"))
	build, _ := os.ReadFile(filepath.Join(dir, "BUILD.bazel"))
	if !strings.Contains(string(why), "no mirror has commit abc") || !strings.Contains(string(build), `outs = ["upstream.patch"]`) ||
		!strings.Contains(string(build), `outs = ["upstream.digest"]`) {
		t.Errorf("an underivable gold: why %q, BUILD.bazel:\n%s", why, build)
	}
	if _, err := os.Stat(filepath.Join(dir, "upstream.patch")); err == nil {
		t.Error("upstream.patch written for a gold that could not be had")
	}
}

func TestBadPredictionsNameFileAndLine(t *testing.T) {
	tasks := []submissions.Task{{ID: "a", Gold: noGold}}
	cases := map[string][]map[string]any{
		"is not a task":       {{"instance_id": "b", "model_name_or_path": "m", "model_patch": ""}},
		"a second prediction": {{"instance_id": "a", "model_name_or_path": "m", "model_patch": ""}, {"instance_id": "a", "model_name_or_path": "n", "model_patch": ""}},
	}
	for want, lines := range cases {
		file := predictionsFile(t, lines...)
		_, err := submissions.Write(context.Background(), t.TempDir(), tasks, submissions.Options{Predictions: file})
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), file+":") || fault.ClassOf(err) != fault.Input {
			t.Errorf("Write() = %v, want an input error naming %s and a line, %q", err, file, want)
		}
	}
	// One model's lines, picked by name, are one per task.
	file := predictionsFile(t, cases["a second prediction"]...)
	if _, err := submissions.Write(context.Background(), t.TempDir(), tasks, submissions.Options{Predictions: file, Model: "n"}); err != nil {
		t.Errorf("with Model set: %v", err)
	}
}
