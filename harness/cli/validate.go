package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/validate"
)

func newValidateCmd(g *globals) *cobra.Command {
	var o struct {
		probes, envs, out string
		runs              int
		schemaOnly        bool
		updateBaseline    bool
		noTamper          bool
		record            bool
		jobs              int
		gpus, offline     bool
		goldOnly          bool
	}
	cmd := &cobra.Command{
		Use:   "validate [TASK_DIR...]",
		Short: "Check task specs, then check that gold resolves, the base fails and the probes hold",
		Long: `Check every task (default: every tasks/<project>/<id>) and its probes against their
schemas, reporting every problem with file, line and field, and check that the instruction names
every interface the probes use that the gold patch provides. Unless --schema-only, also run:

- the task's own check: the repository is at its base commit, the official test patch and gold
  apply, canaries get their outcomes in every official test file, and every probe parses,
  imports nothing of the repository in its judging process and is collected (a fault is
  named with file and line);
- gold --runs times (every run must resolve; budgeted probes' baselines are measured);
- the empty patch: every fail-to-pass test must fail and every pass-to-pass test pass;
- every sample in samples.yaml beside the probes (each must get the verdict, and fail exactly
  the probes, it was built for);
- the tamper check (unless --no-tamper): the empty patch with each in-process cheat, and each
  sample with one, must not resolve, and the probes alone must reject the empty patch;
- the forgery check (with the tamper check): what gold's probe children sent is recorded and
  forged as a child of the code under test could forge it (replayed verbatim; the code under
  test's own values with gold's scalars, over the empty patch and every sample built to fail
  probes; every float NaN). Every probe must still fail the empty patch and catch the samples
  it was built for; one that does not decides from data the child reports and is named with
  its file and line;

and print a table per task with the time it took. Every probe must be failed by at least one
sample: a probe that no wrong patch fails has shown no power to tell wrong from right.

--gold-only stops a task that needs no GPU after its own check and gold's runs: a first step
after its probes changed, recorded as cpu-pending (gold resolves under them; the rest is still
to run). A later full validation replaces that record; a gold-only one never replaces a full one.

A task whose attempts need GPUs gets only the task's own check unless --gpus is given (its
record then says gpu-pending); with --gpus (what a GPU pool runs) it is validated in full on
this machine's GPUs and its record says gpu, naming the machine class. A task needing more
GPUs than the machine has stays gpu-pending.

--offline runs nothing and reads no mirror: the specs are checked, and every task must have a
validation record that describes it as it is (not stale), with a status its GPU needs allow.

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
				return fault.Inputf("no tasks to validate")
			}
			if o.offline && (o.gpus || o.record || o.goldOnly) {
				return fault.Inputf("--offline runs nothing: it takes neither --gpus, --record nor --gold-only")
			}
			mirrors, err := g.mirrorMap()
			if err != nil {
				return err
			}
			if o.offline {
				mirrors = nil
			}
			items, offline, err := validate.Specs(cmd.Context(), dirs, validate.SpecOptions{
				ProbesRoot: o.probes, Store: g.store, Mirrors: mirrors, Digests: o.record})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d task(s): specs valid\n", len(items))
			if len(offline) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%d upstream task(s) checked offline, without their derived files (no mirror, nothing stored): %s\n",
					len(offline), strings.Join(offline, ", "))
			}
			if o.offline {
				return checkRecords(cmd, items, o.envs)
			}
			if o.schemaOnly {
				return nil
			}
			gpus := 0
			if o.gpus {
				m := g.machine()
				if m == nil || len(m.Devices) == 0 {
					why := "NVML found none"
					if g.gpuErr != nil {
						why = g.gpuErr.Error()
					}
					return fault.Infraf("--gpus: this machine has no GPUs to validate on (%s)", why)
				}
				gpus = len(m.Devices)
			}
			if len(offline) > 0 {
				return fault.Infraf("upstream task(s) %s need their repository: give a mirror (--git-mirror or $INFRADEV_GIT_MIRRORS)", strings.Join(offline, ", "))
			}
			att, err := g.runner()
			if err != nil {
				return err
			}
			rn, ok := att.(validate.Runner)
			if !ok {
				return fault.Infraf("the runner cannot check tasks")
			}
			prep, err := g.preparer(o.envs, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			images, envImages := map[string]string{}, map[string]string{}
			for _, it := range items {
				img, err := prep.Task(cmd.Context(), it.Task)
				if err != nil {
					return err
				}
				images[it.Task.ID] = img
				// The environment image this validation runs on, as the store names it after the
				// build: a record is written only when env.lock pins that same image.
				if envImages[it.Task.Environment] == "" {
					if envImages[it.Task.Environment], err = image.Resolve(g.imageStore().Layout(), it.Task.Environment); err != nil {
						return err
					}
				}
			}
			layout, err := filepath.Abs(g.imageStore().Layout())
			if err != nil {
				return err
			}
			// Tasks are validated concurrently (--jobs), each one's attempts in order; the table
			// keeps the tasks' order.
			// Each passing task's record is written as soon as its validation ends, so a long
			// run that is interrupted keeps the records it earned.
			reports := make([]*validate.Report, len(items))
			errsOut := make([]error, len(items))
			recordErrs := make([]error, len(items))
			if o.record {
				g.machine() // read once, before the tasks' goroutines write records
			}
			sem := make(chan struct{}, max(1, o.jobs))
			var wg sync.WaitGroup
			for i, it := range items {
				wg.Add(1)
				go func(i int, it validate.Item) {
					defer wg.Done()
					sem <- struct{}{}
					defer func() { <-sem }()
					reports[i], errsOut[i] = validateOne(cmd, g, rn, it, layout, images[it.Task.ID], o.runs, o.out, !o.noTamper, o.updateBaseline, o.goldOnly, gpus)
					if errsOut[i] == nil && o.record && reports[i].OK() {
						recordErrs[i] = writeRecord(g, it, o.envs, envImages[it.Task.Environment], reports[i])
					}
				}(i, it)
			}
			wg.Wait()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "TASK\tGOLD\tEMPTY\tSAMPLES\tTAMPER\tFORGERIES\tTIME\tCHECK\n")
			failed := false
			for i, rep := range reports {
				if errsOut[i] != nil {
					return fault.Infraf("%s: %v", items[i].Task.ID, errsOut[i])
				}
				if rep.BaselineNote != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", rep.Task, rep.BaselineNote)
				}
				check := "ok"
				switch {
				case rep.Fault != "":
					check, failed = "task error: "+rep.Fault, true
				case !rep.OK():
					check, failed = strings.Join(rep.Problems, "; "), true
				}
				tamper := "-"
				if rep.TamperRuns > 0 {
					tamper = fmt.Sprintf("%d/%d rejected", rep.TamperOK, rep.TamperRuns)
				}
				forged := "-"
				if rep.Forgeries > 0 {
					forged = fmt.Sprintf("%d/%d withstood", rep.ForgeriesOK, rep.Forgeries)
				}
				goldCol, samplesCol := fmt.Sprintf("%d/%d resolved", rep.GoldResolved, rep.GoldRuns), fmt.Sprintf("%d/%d as built", rep.SamplesOK, rep.Samples)
				if rep.Fault != "" {
					goldCol, samplesCol = "-", "-"
				}
				if rep.GoldOnly && rep.OK() {
					samplesCol, check = "-", "ok, gold only: cpu-pending (the empty patch, samples, tamper and forgery checks still to run)"
				}
				if rep.Pending && rep.Fault == "" {
					goldCol, samplesCol = "-", "-"
					check = fmt.Sprintf("ok without GPUs: gpu-pending (needs %d, --gpus on a machine with them validates it)", items[i].Task.Resources.GPUs.Count)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0fs\t%s\n", rep.Task, goldCol, orDash(rep.Empty), samplesCol, tamper, forged, rep.WallSeconds, check)
				if recordErrs[i] != nil {
					failed = true
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, err := range recordErrs {
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "%v\n", err)
				}
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
	f.BoolVar(&o.record, "record", false, "write each passing task's validation record (validation.json beside its probes)")
	f.IntVar(&o.jobs, "jobs", 1, "tasks validated at once (budgeted probes measure time and memory: more at once makes them noisier)")
	f.BoolVar(&o.noTamper, "no-tamper", false, "skip the tamper check (every sample and the empty patch again with an in-process cheat)")
	f.BoolVar(&o.gpus, "gpus", false, "validate tasks that need GPUs in full on this machine's GPUs (without it they get only the checks that need none)")
	f.BoolVar(&o.goldOnly, "gold-only", false, "stop after the task check and gold's runs (a task needing no GPU; its record says cpu-pending)")
	f.BoolVar(&o.offline, "offline", false, "run nothing and read no mirror: check the specs and that every task's validation record is current")
	return cmd
}

// checkRecords is validate --offline's check: every task has a current validation record whose
// status its GPU needs allow.
func checkRecords(cmd *cobra.Command, items []validate.Item, envs string) error {
	var problems, notes []string
	for _, it := range items {
		lock, err := image.ReadLock(filepath.Join(envs, it.Task.Environment))
		if err != nil {
			return err
		}
		env := ""
		if lock != nil {
			env = lock.Manifest
		}
		problem, note, err := validate.CheckRecord(it.Task, it.Probes.Dir, env)
		if err != nil {
			return err
		}
		if problem != "" {
			problems = append(problems, problem)
		}
		if note != "" {
			notes = append(notes, note)
		}
	}
	for _, p := range append(problems, notes...) {
		fmt.Fprintln(cmd.ErrOrStderr(), p)
	}
	if len(problems) > 0 {
		return &ExitError{Code: ExitFailed, Err: fmt.Errorf("%d of %d task(s) lack a current validation record", len(problems), len(items))}
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%d task(s): every validation record current", len(items))
	if len(notes) > 0 {
		fmt.Fprintf(cmd.OutOrStdout(), ", %d of them not validated in full as the harness now validates (noted above)", len(notes))
	}
	fmt.Fprintln(cmd.OutOrStdout())
	return nil
}

// writeRecord writes a passing task's validation record (validate.RecordPinned) with this
// harness's key and hardware class.
func writeRecord(g *globals, it validate.Item, envs, ranOn string, rep *validate.Report) error {
	hardware := "cpu"
	if m := g.machine(); m != nil && len(m.Devices) > 0 && !rep.Pending {
		hardware = fmt.Sprintf("gpu:%s x%d", m.Devices[0].Name, len(m.Devices))
	}
	key, err := harnessKey()
	if err != nil {
		return err
	}
	return validate.RecordPinned(it, filepath.Join(envs, it.Task.Environment), ranOn, key, hardware, rep, time.Now())
}

// validateOne validates one task with its gold patch (read from the task).
func validateOne(cmd *cobra.Command, g *globals, rn validate.Runner, it validate.Item, layout, img string,
	runs int, out string, tamper, updateBaseline, goldOnly bool, gpus int) (*validate.Report, error) {
	t, p, ss := it.Task, it.Probes, it.Samples
	gold, err := os.ReadFile(t.GoldFile())
	if err != nil {
		return nil, err
	}
	onGold, err := g.samplePrep(cmd.Context())(t)
	if err != nil {
		return nil, err
	}
	return validate.Task(cmd.Context(), rn, runner.Inputs{Task: t, Probes: p, Layout: layout, Image: img}, ss, gold,
		validate.Options{Runs: runs, Out: out, Tamper: tamper, OnGold: onGold, GPUs: gpus, GoldOnly: goldOnly,
			Baseline: func(golds []*result.Result) (string, *probe.Set, error) {
				note, err := validate.Baseline(t, p, golds, img, Version, updateBaseline)
				if err != nil {
					return "", nil, err
				}
				ps, err := probe.Load(p.Dir, t.ID)
				return note, ps, err
			}})
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
