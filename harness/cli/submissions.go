package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/submissions"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/upstream"
)

func newBazelSubmissionsCmd(g *globals) *cobra.Command {
	var o submissions.Options
	var out string
	cmd := &cobra.Command{
		Use:   "bazel-submissions --out DIR [--predictions FILE] [--model M] ID=GOLD...",
		Short: "Write the patches a Bazel run scores, one per task, byte for byte",
		Long: `Write, for each task ID, DIR/ID.patch (the prediction's model_patch from --predictions, an
empty patch for a task it has no prediction for, or without --predictions the task's gold
patch), DIR/ID.digest (the submission's digest, which the task test checks against what it
graded), and DIR/BUILD.bazel exporting them. GOLD is a gold patch file, or upstream:TASK_DIR
for an upstream task whose gold is derived from its commits (store, then mirrors); one that
cannot be derived here gets DIR/ID.why and a target that fails with the reason.

The Bazel face's predictions repository rule runs this command, so patches never pass through
Starlark strings (which would re-encode their non-ASCII bytes).

Exit codes: 0 written; 2 bad usage or a bad predictions file (file, line and field named).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fault.Inputf("--out is required")
			}
			var tasks []submissions.Task
			for _, a := range args {
				id, gold, ok := strings.Cut(a, "=")
				if !ok || id == "" || gold == "" {
					return fault.Inputf("argument %q: want ID=GOLD (a gold patch file, or upstream:TASK_DIR)", a)
				}
				tasks = append(tasks, submissions.Task{ID: id, Gold: goldOf(g, gold)})
			}
			ws, err := submissions.Write(cmd.Context(), out, tasks, o)
			if err != nil {
				return err
			}
			for _, w := range ws {
				if w.Why != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\tnot derived: %s\n", w.ID, firstLine(w.Why))
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", w.ID, w.Digest)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "folder to write the patches into")
	f.StringVar(&o.Predictions, "predictions", "", "predictions file (JSON Lines, SWE-bench fields); without it each task's gold")
	f.StringVar(&o.Model, "model", "", "keep only this model's predictions")
	return cmd
}

// goldOf reads a task's gold patch: a file, or an upstream task's derivation.
func goldOf(g *globals, ref string) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		dir, ok := strings.CutPrefix(ref, "upstream:")
		if !ok {
			return os.ReadFile(ref)
		}
		t, err := task.Load(dir)
		if err != nil {
			return nil, err
		}
		m, err := g.mirrorMap()
		if err != nil {
			return nil, err
		}
		if err := upstream.Attach(ctx, g.store, t, m); err != nil {
			return nil, fmt.Errorf("the gold patch of %s cannot be derived: %w\nPass --repo_env=INFRADEV_GIT_MIRRORS=... (or INFRADEV_STORE holding its derivation), or predictions with --repo_env=INFRADEV_PREDICTIONS", filepath.Clean(dir), err)
		}
		return os.ReadFile(t.GoldFile())
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
