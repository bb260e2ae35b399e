// Package submissions owns the files the Bazel face scores: one patch per task, written byte
// for byte from a predictions file (or each task's gold patch) by the CLI itself, with the
// digest of the submission as the user gave it. Patches never pass through Starlark strings,
// which Bazel 4 holds as Latin-1 and writes back as UTF-8 (an em dash would become three
// characters and the patch would no longer apply), so a repository rule only runs Write.
package submissions

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/predictions"
)

// Task is one task to write a submission for.
type Task struct {
	ID string
	// Gold gives the task's gold patch, its submission when no predictions file is given; an
	// error is the reason it cannot be had here (an upstream task without a mirror), which
	// only that task's target reports.
	Gold func(ctx context.Context) ([]byte, error)
}

// Options say where submissions come from.
type Options struct {
	// Predictions is a predictions file (SWE-bench fields); empty: every task's gold.
	Predictions string
	// Model keeps only that model's predictions; empty: any, but one per task.
	Model string
}

// Written is what Write put in the folder for one task.
type Written struct {
	ID string
	// Digest is the submission's digest (sha256:...), as the run-task result's patch digest
	// will be; empty when the patch could not be had (Why says why).
	Digest string
	Why    string
}

// Write writes, for every task, ID.patch (the submission's bytes: the prediction's
// model_patch, an empty file for a task without one, or gold without a predictions file) and
// ID.digest (its digest), or ID.why when it cannot be had, and a BUILD.bazel exporting them
// (a task whose patch cannot be had gets a rule that fails with the reason). Every file is
// written atomically; a bad predictions file is an input error naming file, line and field.
func Write(ctx context.Context, dir string, tasks []Task, o Options) ([]Written, error) {
	patches := map[string][]byte{}
	if o.Predictions != "" {
		ps, err := predictions.Read(o.Predictions)
		if err != nil {
			return nil, fault.Wrap(fault.Input, err)
		}
		known := map[string]bool{}
		for _, t := range tasks {
			known[t.ID] = true
		}
		lines := map[string]int{}
		for _, p := range ps {
			if o.Model != "" && p.Model != o.Model {
				continue
			}
			if !known[p.InstanceID] {
				return nil, fault.Inputf("%s:%d: instance_id: %q is not a task of this workspace", o.Predictions, p.Line, p.InstanceID)
			}
			if first, dup := lines[p.InstanceID]; dup {
				return nil, fault.Inputf("%s:%d: instance_id: a second prediction for %s (the first is on line %d); set INFRADEV_MODEL to pick one model",
					o.Predictions, p.Line, p.InstanceID, first)
			}
			lines[p.InstanceID] = p.Line
			patches[p.InstanceID] = []byte(p.Patch)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	sort.Slice(tasks, func(i, j int) bool { return tasks[i].ID < tasks[j].ID })
	var out []Written
	for _, t := range tasks {
		var patch []byte
		w := Written{ID: t.ID}
		if o.Predictions != "" {
			patch = patches[t.ID] // a task without a prediction is scored as an empty patch
		} else {
			gold, err := t.Gold(ctx)
			if err != nil {
				w.Why = err.Error()
				if err := atomicfile.Write(filepath.Join(dir, t.ID+".why"), []byte(w.Why+"\n")); err != nil {
					return nil, err
				}
				out = append(out, w)
				continue
			}
			patch = gold
		}
		w.Digest = digest.Bytes(patch)
		if err := atomicfile.Write(filepath.Join(dir, t.ID+".patch"), patch); err != nil {
			return nil, err
		}
		if err := atomicfile.Write(filepath.Join(dir, t.ID+".digest"), []byte(w.Digest+"\n")); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	if err := atomicfile.Write(filepath.Join(dir, "BUILD.bazel"), buildFile(out, o)); err != nil {
		return nil, err
	}
	return out, nil
}

// buildFile exports the patches and digests; a task whose patch could not be had gets rules
// that fail with the reason, so only its target fails.
func buildFile(ws []Written, o Options) []byte {
	var b strings.Builder
	source := o.Predictions
	if source == "" {
		source = "each task's gold patch"
	}
	model := o.Model
	if model == "" {
		model = "any"
	}
	fmt.Fprintf(&b, "# Submissions to score, one patch per task, written by `infradev bazel-submissions`: from %s (model %s).\n", starlarkComment(source), starlarkComment(model))
	b.WriteString("package(default_visibility = [\"//visibility:public\"])\n\nexports_files(glob([\"*.patch\", \"*.digest\"]))\n")
	for _, w := range ws {
		if w.Why == "" {
			continue
		}
		for _, ext := range []string{"patch", "digest"} {
			fmt.Fprintf(&b, `
genrule(
    name = "%[1]s.underived.%[2]s",
    srcs = ["%[1]s.why"],
    outs = ["%[1]s.%[2]s"],
    cmd = "cat $< >&2; exit 1",
)
`, w.ID, ext)
		}
	}
	return []byte(b.String())
}

// starlarkComment keeps a value on one comment line.
func starlarkComment(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}
