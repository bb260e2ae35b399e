package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/specfile"
	"github.com/infradev/infradev/harness/task"
)

func newValidateCmd(g *globals) *cobra.Command {
	var o struct {
		probes, envs, out string
		runs              int
		schemaOnly        bool
	}
	cmd := &cobra.Command{
		Use:   "validate [TASK_DIR...]",
		Short: "Check task specs, then check that gold resolves and the empty patch does not",
		Long: `Check every task (default: every tasks/<project>/<id>) and its probes against their
schemas, reporting every problem with file, line and field. Unless --schema-only, also run each
task's gold patch --runs times (every run must resolve) and the empty patch once (it must fail
an official test, so the task is not already solved), and print a table per task.

Exit codes: 0 every check passed; 1 a check failed; 2 a spec is invalid; 3 infrastructure fault.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			dirs := args
			if len(dirs) == 0 {
				found, err := task.Find("tasks")
				if err != nil {
					return err
				}
				for _, d := range found {
					dirs = append(dirs, d)
				}
			}
			if len(dirs) == 0 {
				return exitf(ExitUsage, "no tasks to validate")
			}
			type item struct {
				t *task.Task
				p *probe.Set
			}
			var items []item
			var errs specfile.Errors
			collect := func(err error) {
				if se, ok := err.(specfile.Errors); ok {
					errs = append(errs, se...)
				} else if err != nil {
					errs = append(errs, specfile.FieldError{Msg: err.Error()})
				}
			}
			for _, d := range dirs {
				t, err := task.Load(d)
				if err != nil {
					collect(err)
					continue
				}
				p, err := probe.Load(task.ProbesDir(o.probes, d), t.ID)
				if err != nil {
					collect(err)
					continue
				}
				items = append(items, item{t, p})
			}
			if err := errs.Err(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d task(s): specs valid\n", len(items))
			if o.schemaOnly {
				return nil
			}
			r, err := g.runner()
			if err != nil {
				return err
			}
			images := map[string]string{}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "TASK\tGOLD\tEMPTY\tCHECK\n")
			failed := false
			for _, it := range items {
				img, ok := images[it.t.Environment]
				if !ok {
					env, err := envspec.Load(filepath.Join(o.envs, it.t.Environment))
					if err != nil {
						return err
					}
					b, err := image.Build(cmd.Context(), env, g.imageStore(), image.Options{Log: cmd.ErrOrStderr()})
					if err != nil {
						return exitf(ExitInfra, "%v", err)
					}
					img = b.Manifest
					images[it.t.Environment] = img
				}
				layout, _ := filepath.Abs(g.imageStore().Layout())
				gold, err := os.ReadFile(it.t.File(it.t.Gold))
				if err != nil {
					return err
				}
				run := func(name string, patch []byte) (*result.Result, error) {
					return r.Run(cmd.Context(), runner.Inputs{Task: it.t, Probes: it.p, Layout: layout, Image: img,
						Patch: patch, Model: name}, filepath.Join(o.out, it.t.ID, name))
				}
				var problems []string
				goldOK := 0
				for i := 0; i < o.runs; i++ {
					res, err := run(fmt.Sprintf("gold-%d", i+1), gold)
					if err != nil {
						return exitf(ExitInfra, "%v", err)
					}
					if res.Resolved {
						goldOK++
					} else {
						problems = append(problems, fmt.Sprintf("gold run %d: %s", i+1, res.Reason))
					}
				}
				empty, err := run("empty", nil)
				if err != nil {
					return exitf(ExitInfra, "%v", err)
				}
				if empty.FailureClass != result.OfficialTestsFailed {
					problems = append(problems, fmt.Sprintf("empty patch must fail an official test, got %q", empty.FailureClass))
				}
				check := "ok"
				if len(problems) > 0 {
					check, failed = strings.Join(problems, "; "), true
				}
				fmt.Fprintf(tw, "%s\t%d/%d resolved\t%s\t%s\n", it.t.ID, goldOK, o.runs, orDash(empty.FailureClass), check)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if failed {
				return &ExitError{Code: ExitFailed, Err: fmt.Errorf("validation failed")}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.probes, "probes", "probes", "probes root (probes/<project>/<id>)")
	f.StringVar(&o.envs, "environments", "environments", "environments root")
	f.StringVar(&o.out, "out", ".infradev/validate", "where validation runs are written")
	f.IntVar(&o.runs, "runs", 3, "how many times gold must resolve")
	f.BoolVar(&o.schemaOnly, "schema-only", false, "check specs only; run nothing")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
