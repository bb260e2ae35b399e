package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/samples"
	"github.com/infradev/infradev/harness/specfile"
	"github.com/infradev/infradev/harness/suite"
	"github.com/infradev/infradev/harness/task"
)

func newValidateCmd(g *globals) *cobra.Command {
	var o struct {
		probes, envs, out string
		runs              int
		schemaOnly        bool
		updateBaseline    bool
	}
	cmd := &cobra.Command{
		Use:   "validate [TASK_DIR...]",
		Short: "Check task specs, then check that gold resolves and the empty patch does not",
		Long: `Check every task (default: every tasks/<project>/<id>) and its probes against their
schemas, reporting every problem with file, line and field, and check that the instruction names
every interface the probes use that the gold patch provides. Unless --schema-only, also run each
task's gold patch --runs times (every run must resolve), the empty patch once (it must fail
an official test, so the task is not already solved) and every sample in samples.yaml beside
the probes (each must get the verdict, and fail exactly the probes, it was built for), and
print a table per task. Every probe must be failed by at least one sample: a probe that no
wrong patch fails has shown no power to tell wrong from right.

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
				sort.Strings(dirs)
			}
			if len(dirs) == 0 {
				return exitf(ExitUsage, "no tasks to validate")
			}
			type item struct {
				t *task.Task
				p *probe.Set
				s *samples.Set
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
				if err := suite.CheckInstruction(t, p); err != nil {
					errs = append(errs, specfile.FieldError{File: t.File(t.Instruction), Msg: err.Error()})
					continue
				}
				ss, err := samples.Load(p.Dir, t.ID, p)
				if err != nil {
					collect(err)
					continue
				}
				if un := ss.Uncovered(p); len(un) > 0 {
					errs = append(errs, specfile.FieldError{File: filepath.Join(p.Dir, samples.File),
						Msg: fmt.Sprintf("no sample is built to fail probe(s) %s: add a wrong patch each of them catches", strings.Join(un, ", "))})
					continue
				}
				items = append(items, item{t, p, ss})
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
			fmt.Fprintf(tw, "TASK\tGOLD\tEMPTY\tSAMPLES\tCHECK\n")
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
				run := func(name string, patch []byte, measure bool) (*result.Result, error) {
					return r.Run(cmd.Context(), runner.Inputs{Task: it.t, Probes: it.p, Layout: layout, Image: img,
						Patch: patch, Model: name, MeasureBudgets: measure}, filepath.Join(o.out, it.t.ID, name))
				}
				var problems []string
				var golds []*result.Result
				goldOK := 0
				for i := 0; i < o.runs; i++ {
					res, err := run(fmt.Sprintf("gold-%d", i+1), gold, true)
					if err != nil {
						return exitf(ExitInfra, "%v", err)
					}
					golds = append(golds, res)
					if res.Resolved {
						goldOK++
					} else {
						problems = append(problems, fmt.Sprintf("gold run %d: %s", i+1, res.Reason))
					}
				}
				if flaky := report.Flaky(golds); len(flaky) > 0 {
					problems = append(problems, "flaky across gold runs: "+strings.Join(flaky, ", "))
				}
				if len(it.p.Budgeted()) > 0 && goldOK == o.runs {
					note, err := baseline(it.t, it.p, golds, img, o.updateBaseline)
					if err != nil {
						return err
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", it.t.ID, note)
					if it.p, err = probe.Load(it.p.Dir, it.t.ID); err != nil {
						return err
					}
					judged, err := run("gold-budgets", gold, false)
					if err != nil {
						return exitf(ExitInfra, "%v", err)
					}
					if !judged.Resolved {
						problems = append(problems, "gold fails its own budgets: "+judged.Reason)
					}
				}
				empty, err := run("empty", nil, false)
				if err != nil {
					return exitf(ExitInfra, "%v", err)
				}
				if empty.FailureClass != result.OfficialTestsFailed {
					problems = append(problems, fmt.Sprintf("empty patch must fail an official test, got %q", empty.FailureClass))
				}
				asBuilt := 0
				for _, sm := range it.s.Samples {
					patch, err := it.s.Read(sm)
					if err != nil {
						return err
					}
					res, err := run("sample-"+sm.Name, patch, false)
					if err != nil {
						return exitf(ExitInfra, "%v", err)
					}
					if msg := sm.Check(res); msg != "" {
						problems = append(problems, "sample "+msg)
					} else {
						asBuilt++
					}
				}
				check := "ok"
				if len(problems) > 0 {
					check, failed = strings.Join(problems, "; "), true
				}
				fmt.Fprintf(tw, "%s\t%d/%d resolved\t%s\t%d/%d as built\t%s\n", it.t.ID, goldOK, o.runs, orDash(empty.FailureClass),
					asBuilt, len(it.s.Samples), check)
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
	f.BoolVar(&o.updateBaseline, "update-baseline", false, "rewrite baseline.json from this run's gold figures")
	return cmd
}

// baseline writes the budgeted probes' gold figures (the largest over the runs) to the probes'
// baseline.json when there is none or when asked to, and says what it did.
func baseline(t *task.Task, ps *probe.Set, golds []*result.Result, image string, update bool) (string, error) {
	if ps.Baseline != nil && !update {
		return "baseline.json kept (--update-baseline rewrites it)", nil
	}
	b := &probe.Baseline{Task: t.ID, Environment: image, Harness: Version, Runs: len(golds), Probes: map[string]probe.Figures{}}
	for _, g := range golds {
		p := g.Phase("probes")
		if p == nil {
			continue
		}
		for _, o := range p.Tests {
			f := b.Probes[o.Probe]
			f.PeakMemoryBytes = max(f.PeakMemoryBytes, o.PeakMemoryBytes)
			f.WallSeconds = max(f.WallSeconds, o.WallSeconds)
			if o.PeakMemoryBytes > 0 {
				b.Probes[o.Probe] = f
			}
		}
	}
	if err := probe.WriteBaseline(ps.Dir, b); err != nil {
		return "", err
	}
	var parts []string
	for id, f := range b.Probes {
		parts = append(parts, fmt.Sprintf("%s peak %.1fMiB wall %.2fs", id, float64(f.PeakMemoryBytes)/(1<<20), f.WallSeconds))
	}
	return "baseline.json written: " + strings.Join(parts, "; "), nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
