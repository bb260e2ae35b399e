package cli

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/infradev/infradev/harness/eval"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/resultstore"
	"github.com/infradev/infradev/harness/schedule"
	"github.com/infradev/infradev/harness/specfile"
	"github.com/infradev/infradev/harness/task"
)

func newEvalCmd(g *globals) *cobra.Command {
	var o struct {
		preds                []string
		runID, tasks, probes string
		envs, out, results   string
		match, label, prompt string
		jobs, gpus           int
		asJSON               bool
		executor             string
		partition, account   string
		slurmOpts            []string
		cpus                 float64
		memory               string
	}
	cmd := &cobra.Command{
		Use:   "eval --predictions FILE.jsonl [--predictions ...]",
		Short: "Evaluate predictions (SWE-bench fields) and print the report",
		Long: `Evaluate every prediction (instance_id, model_name_or_path, model_patch) on its task.
Attempts run concurrently, packed by each task's declared CPUs, memory and GPUs onto this
machine's capacity (--cpus, --memory, --gpus), at most --jobs at once. Results go to
OUT/RUN_ID/<model>/<instance>/ and to the results store, keyed by the digests of every input
(task, environment, probes, patch, harness, hardware): a finished attempt is never run again,
identical patches from different models run once, and an interrupted evaluation (Ctrl-C, or
even kill -9) resumes when the same command runs again. Writes OUT/RUN_ID/report.{json,md,html,
junit.xml} and prints the table; "infradev report" regenerates them from stored results.

Exit codes: 0 the evaluation completed (whatever the verdicts); 2 bad usage or input;
3 infrastructure fault; 130 interrupted (finished results kept).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := g.runner()
			if err != nil {
				return err
			}
			capacity := schedule.Capacity{CPUs: o.cpus, MemoryBytes: totalMemory()}
			switch o.executor {
			case "local":
			case "slurm":
				if r, err = g.slurmAttempter(r, o.partition, o.account, o.slurmOpts, cmd.ErrOrStderr()); err != nil {
					return err
				}
				// The cluster's scheduler packs the jobs: every attempt is submitted (at most
				// --jobs at once), and Slurm's gres decides GPUs.
				capacity = schedule.Capacity{CPUs: math.MaxInt32, MemoryBytes: math.MaxInt64}
				for i := 0; i < 1024; i++ {
					capacity.GPUs = append(capacity.GPUs, i)
				}
				o.gpus = -2
			default:
				return fault.Inputf("--executor: want local or slurm, got %q", o.executor)
			}
			if o.memory != "" {
				if capacity.MemoryBytes, err = parseSize(o.memory); err != nil {
					return fault.Inputf("--memory: %v", err)
				}
			}
			switch {
			case o.gpus == -2: // the cluster's
			case o.gpus >= 0: // a simulated count, for planning and tests
				for i := 0; i < o.gpus; i++ {
					capacity.GPUs = append(capacity.GPUs, i)
				}
			case g.machine() != nil:
				for _, d := range g.machine().Devices {
					capacity.GPUs = append(capacity.GPUs, d.Index)
				}
			default:
				fmt.Fprintf(cmd.ErrOrStderr(), "no GPUs: %v; tasks that need GPUs will be reported as not run\n", g.gpuErr)
			}
			if sw, ok := r.(interface{ Sweep() int }); ok {
				if n := sw.Sweep(); n > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "cleaned up %d leftovers of an interrupted run\n", n)
				}
			}
			mirrors, err := g.mirrorMap()
			if err != nil {
				return err
			}
			if o.match != "" {
				if _, err := filepath.Match(o.match, ""); err != nil {
					return fault.Inputf("--match %q: %v", o.match, err)
				}
			}
			store, err := resultstore.Open(o.results)
			if err != nil {
				return err
			}
			progress := newProgress(cmd.ErrOrStderr())
			results, err := eval.Run(cmd.Context(), eval.Config{
				Predictions: o.preds, RunID: o.runID,
				TasksRoot: o.tasks, ProbesRoot: o.probes, EnvsRoot: o.envs,
				Store: g.imageStore(), Mirrors: mirrors, Out: o.out, Runner: r,
				Results:  store,
				Capacity: capacity, Jobs: o.jobs,
				Select:        selector(o.match, o.label),
				PromptVariant: o.prompt,
				Progress:      progress.event,
			})
			progress.finish()
			if err := finishRun(cmd, err, o.out, o.runID, len(results), o.asJSON); err != nil {
				return err
			}
			return infraFaults(results)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.preds, "predictions", nil, "predictions file (JSON Lines); repeatable")
	f.StringVar(&o.runID, "run-id", "default", "name of this evaluation run")
	f.StringVar(&o.tasks, "tasks", "tasks", "tasks root (tasks/<project>/<id>)")
	f.StringVar(&o.probes, "probes", "probes", "probes root (probes/<project>/<id>)")
	f.StringVar(&o.envs, "environments", "environments", "environments root")
	f.StringVar(&o.out, "out", "runs", "results root")
	f.StringVar(&o.results, "results", ".infradev/results", "content-addressed results store: a directory, or the http(s) URL of a Bazel HTTP remote cache shared with bazel test (empty: none)")
	f.StringVar(&o.match, "match", "", "evaluate only tasks whose directory matches this glob (e.g. 'tasks/demo/minitron-*')")
	f.StringVar(&o.label, "label", "", "evaluate only tasks carrying this label")
	f.StringVar(&o.prompt, "prompt-variant", "instruction", "the prompt the predictions were made from (instruction or pr_description), for the report")
	f.StringVar(&o.executor, "executor", "local", "where attempts run: local (this machine's sandbox) or slurm (a job per attempt on the cluster's scheduler, sharing --store and --out)")
	f.StringVar(&o.partition, "partition", "", "slurm: the partition jobs go to")
	f.StringVar(&o.account, "account", "", "slurm: the account jobs are charged to")
	f.StringArrayVar(&o.slurmOpts, "slurm-opt", nil, "slurm: one more sbatch option, as given (repeatable)")
	f.BoolVar(&o.asJSON, "json", false, "print the summary (report.json) as JSON instead of the tables")
	f.IntVar(&o.jobs, "jobs", 0, "run at most this many attempts at once (0: as capacity allows)")
	f.Float64Var(&o.cpus, "cpus", float64(runtime.NumCPU()), "CPUs to pack attempts onto")
	f.StringVar(&o.memory, "memory", "", "memory to pack attempts onto (default: this machine's)")
	f.IntVar(&o.gpus, "gpus", -1, "GPUs to pack attempts onto: -1 finds them with NVML; N simulates device indices 0..N-1")
	_ = cmd.MarkFlagRequired("predictions")
	return cmd
}

func selector(match, label string) func(*task.Task) bool {
	if match == "" && label == "" {
		return nil
	}
	return func(t *task.Task) bool {
		if match != "" {
			if ok, _ := filepath.Match(match, t.Dir); !ok {
				if ok2, _ := filepath.Match(match, filepath.Base(t.Dir)); !ok2 {
					return false
				}
			}
		}
		if label != "" {
			for _, l := range t.Labels {
				if l == label {
					return true
				}
			}
			return false
		}
		return true
	}
}

func totalMemory() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 1 << 40
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// progress shows a bar with an ETA on a terminal and plain lines otherwise.
type progress struct {
	w   io.Writer
	bar *progressbar.ProgressBar
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		p.bar = progressbar.NewOptions(-1, progressbar.OptionSetWriter(w), progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true), progressbar.OptionClearOnFinish(), progressbar.OptionSetDescription("eval"))
	}
	return p
}

func (p *progress) event(e eval.Event) {
	if p.bar != nil {
		p.bar.ChangeMax(e.Total)
		_ = p.bar.Set(e.Done)
		p.bar.Describe(fmt.Sprintf("%s %s: %s", e.Model, e.Instance, e.Verdict))
		return
	}
	eta := ""
	if e.ETA > 0 {
		eta = " eta " + e.ETA.Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "[%d/%d] %s %s: %s (%s)%s\n", e.Done, e.Total, e.Model, e.Instance, e.Verdict, e.How, eta)
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

func parseSize(s string) (int64, error) { return specfile.ParseSize(strings.TrimSpace(s)) }

// infraFaults is an infrastructure fault when any attempt ended in one: the evaluation is not
// complete (those attempts are run again by the same command), though every verdict is kept.
func infraFaults(results []*result.Result) error {
	var first *result.Result
	n := 0
	for _, r := range results {
		if r.FailureClass == result.InfraError {
			if first == nil {
				first = r
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return fault.Infraf("%d attempt(s) ended in an infrastructure fault (first: %s %s: %s); the same command runs them again", n, first.Model, first.InstanceID, first.Reason)
}

// finishRun ends an evaluation's command: the run's error (an interrupt is its own class), then
// every report written from the stored results (at least want of them) and the summary printed.
func finishRun(cmd *cobra.Command, runErr error, out, runID string, want int, asJSON bool) error {
	if runErr != nil {
		if cmd.Context().Err() != nil {
			return fault.Wrap(fault.Interrupted, runErr)
		}
		return runErr
	}
	runDir := filepath.Join(out, runID)
	stored, err := report.LoadRun(runDir)
	if err != nil {
		return err
	}
	if len(stored) < want {
		return fault.Infraf("%s holds %d results, want at least %d", runDir, len(stored), want)
	}
	s, err := report.WriteRun(runDir, runID, stored)
	if err != nil {
		return err
	}
	return printSummary(cmd.OutOrStdout(), s, asJSON, filepath.Join(runDir, "report.json"))
}
