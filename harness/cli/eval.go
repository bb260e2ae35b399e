package cli

import (
	"bytes"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/eval"
	"github.com/infradev/infradev/harness/report"
)

func newEvalCmd(g *globals) *cobra.Command {
	var o struct {
		preds                []string
		runID, tasks, probes string
		envs, out            string
	}
	cmd := &cobra.Command{
		Use:   "eval --predictions FILE.jsonl [--predictions ...]",
		Short: "Evaluate predictions (SWE-bench fields) and print the report",
		Long: `Evaluate every prediction (instance_id, model_name_or_path, model_patch) on its task.
Results go to OUT/RUN_ID/<model>/<instance>/; an attempt whose inputs (task, environment,
probes, patch, harness, hardware) are unchanged is not run again, so an interrupted evaluation
resumes. Prints a table and writes OUT/RUN_ID/report.json and report.junit.xml.

Exit codes: 0 the evaluation completed (whatever the verdicts); 2 bad usage or input;
3 infrastructure fault.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := g.runner()
			if err != nil {
				return err
			}
			results, err := eval.Run(cmd.Context(), eval.Config{
				Predictions: o.preds, RunID: o.runID,
				TasksRoot: o.tasks, ProbesRoot: o.probes, EnvsRoot: o.envs,
				Store: g.imageStore(), Out: o.out, Runner: r, Log: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			s := report.Summarize(o.runID, results)
			dir := filepath.Join(o.out, o.runID)
			if err := report.WriteJSON(filepath.Join(dir, "report.json"), s); err != nil {
				return exitf(ExitInfra, "%v", err)
			}
			var junit bytes.Buffer
			if err := report.WriteJUnit(&junit, results); err != nil {
				return err
			}
			if err := atomicfile.Write(filepath.Join(dir, "report.junit.xml"), junit.Bytes()); err != nil {
				return exitf(ExitInfra, "%v", err)
			}
			if err := report.WriteTable(cmd.OutOrStdout(), s); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\nreport: %s\n", filepath.Join(dir, "report.json"))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.preds, "predictions", nil, "predictions file (JSON Lines); repeatable")
	f.StringVar(&o.runID, "run-id", "default", "name of this evaluation run")
	f.StringVar(&o.tasks, "tasks", "tasks", "tasks root (tasks/<project>/<id>)")
	f.StringVar(&o.probes, "probes", "probes", "probes root (probes/<project>/<id>)")
	f.StringVar(&o.envs, "environments", "environments", "environments root (environments/<name>)")
	f.StringVar(&o.out, "out", "runs", "results root")
	_ = cmd.MarkFlagRequired("predictions")
	return cmd
}
