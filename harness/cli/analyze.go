package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/analyze"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/upstream"
)

func newAnalyzeCmd(g *globals) *cobra.Command {
	var o struct {
		tasks string
		json  bool
	}
	cmd := &cobra.Command{
		Use:   "analyze RUN_DIR",
		Short: "Failure analysis of a run: taxonomy, the agents' own tests, contamination",
		Long: `Read a run folder's stored results and submissions (nothing runs) and write
RUN_DIR/analysis.json and analysis.md: the failure taxonomy per model, prompt variant, project and
probe category, with examples linked to their folders; pass@k and prompt variants compared, for
agents' runs; which submissions added tests and whether those tests measure memory, time or
traffic; and the submissions whose non-test code reproduces the upstream change near-verbatim
(token similarity to gold), with resolution rates with and without them. Upstream tasks' gold
comes from the store (or a mirror).

Exit codes: 0 written; 2 bad usage or an empty run folder; 3 a file could not be read or written.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := analyze.Run(analyze.Config{RunDir: args[0], Gold: g.goldReader(cmd.Context(), o.tasks)})
			if err != nil {
				return err
			}
			if err := analyze.Write(args[0], a); err != nil {
				return err
			}
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(a)
			}
			fmt.Fprint(cmd.OutOrStdout(), analyze.Markdown(a))
			fmt.Fprintf(cmd.OutOrStdout(), "\nwritten: %s (and analysis.md)\n", filepath.Join(args[0], "analysis.json"))
			return nil
		},
	}
	cmd.Flags().StringVar(&o.tasks, "tasks", "tasks", "tasks root, for the gold patches")
	cmd.Flags().BoolVar(&o.json, "json", false, "print analysis.json instead of the Markdown")
	return cmd
}

// goldReader reads a task's gold patch by instance id: the task's own file, or an upstream
// task's derivation (from the store, or derived through a mirror).
func (g *globals) goldReader(ctx context.Context, root string) func(string) ([]byte, error) {
	var dirs map[string]string
	return func(id string) ([]byte, error) {
		if dirs == nil {
			d, err := task.Find(root)
			if err != nil {
				return nil, err
			}
			dirs = d
		}
		dir, ok := dirs[id]
		if !ok {
			return nil, fmt.Errorf("no task %q under %s", id, root)
		}
		t, err := task.Load(dir)
		if err != nil {
			return nil, err
		}
		if t.Upstream() {
			m, err := g.mirrorMap()
			if err != nil {
				return nil, err
			}
			if err := upstream.Attach(ctx, g.store, t, m); err != nil {
				return nil, err
			}
		}
		return os.ReadFile(t.GoldFile())
	}
}
