package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/agent"
	"github.com/infradev/infradev/harness/eval"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/resultstore"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/schedule"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/unpack"
)

func newAgentCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run coding agents on tasks and grade what they make",
	}
	cmd.AddCommand(newAgentRunCmd(g))
	return cmd
}

func newAgentRunCmd(g *globals) *cobra.Command {
	var o struct {
		agent, agents, runID     string
		tasks                    []string
		tasksRoot, probes, envs  string
		out, results, skill      string
		variants                 []string
		attempts, jobs, evalJobs int
		asJSON                   bool
	}
	cmd := &cobra.Command{
		Use:   "run --agent NAME --tasks DIR|GLOB|ID [...] --run-id ID",
		Short: "Run an agent on tasks in sandboxes, then grade its submissions as eval does",
		Long: `Run an agent (agents/<name>/agent.yaml: a command agent or the built-in agent) on each
task, once per prompt variant and attempt. Each attempt gets a sandbox over the task's image with
the repository at its base commit, the prompt at /run/infradev/prompt/prompt.md, no probes and no
official tests, the agent's wall-clock and step budgets, and no network unless the agent's
definition says "network: host". The workspace's diff is the submission. Attempts go to
OUT/RUN_ID/agent/<agent>@<variant>@<k>/<instance>/ (agent.json, patch.diff, prompt/,
transcript.jsonl or agent.log, logs/); the submissions to OUT/RUN_ID/predictions/<agent>.jsonl, graded
into OUT/RUN_ID as eval does, with the report beside them. A finished attempt is never run
again: the same command resumes an interrupted run.

Exit codes: 0 every attempt ran and was graded (whatever the verdicts); 2 bad usage or input;
3 an infrastructure fault (attempts that hit one are run again next time); 130 interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := agent.Find(o.agents, o.agent)
			if err != nil {
				return err
			}
			tasks, err := selectTasks(o.tasksRoot, o.tasks)
			if err != nil {
				return err
			}
			r, err := g.runner()
			if err != nil {
				return err
			}
			mirrors, err := g.mirrorMap()
			if err != nil {
				return err
			}
			prep, err := g.preparer(o.envs, nil)
			if err != nil {
				return err
			}
			cache, err := filepath.Abs(g.cache)
			if err != nil {
				return err
			}
			runner := &agent.Runner{
				Sandbox: &sandbox.Runc{Binary: envOr("INFRADEV_RUNTIME", "runc"), StateDir: filepath.Join(cache, "sandbox")},
				Cache:   unpack.Cache{Dir: filepath.Join(cache, "unpacked")},
				Scratch: filepath.Join(cache, "scratch"),
				Prep:    prep,
			}
			store, err := resultstore.Open(o.results)
			if err != nil {
				return err
			}
			w := cmd.ErrOrStderr()
			progress := newProgress(w)
			outcomes, err := agent.Evaluate(cmd.Context(), agent.Evaluation{
				Spec: spec, Tasks: tasks, Variants: o.variants, Attempts: o.attempts, Skill: o.skill,
				Jobs: o.jobs, Runner: runner,
				Eval: eval.Config{RunID: o.runID, TasksRoot: o.tasksRoot, ProbesRoot: o.probes, EnvsRoot: o.envs,
					Store: g.imageStore(), Mirrors: mirrors, Out: o.out, Runner: r, Results: store,
					Capacity: schedule.Capacity{CPUs: float64(runtime.NumCPU()), MemoryBytes: totalMemory()},
					Jobs:     o.evalJobs, Progress: progress.event},
				Progress: func(done, total int, rec *agent.Record, how string) {
					fmt.Fprintf(w, "[agent %d/%d] %s %s %s #%d: %s, %d steps, %d tokens, patch %d bytes (%s)\n", done, total,
						rec.Agent, rec.InstanceID, rec.PromptVariant, rec.Attempt, rec.Outcome.Status, rec.Outcome.Steps,
						rec.Outcome.Usage.TotalTokens, rec.PatchBytes, how)
				},
			})
			progress.finish()
			if err := finishRun(cmd, err, o.out, o.runID, 0, o.asJSON); err != nil {
				return err
			}
			if err := infraFaults(outcomes.Results); err != nil {
				return err
			}
			if n := len(outcomes.Faults); n > 0 {
				return fault.Infraf("%d attempts ended in an infrastructure fault (first: %s %s: %s); the same command runs them again",
					n, outcomes.Faults[0].InstanceID, outcomes.Faults[0].PromptVariant, outcomes.Faults[0].Outcome.Reason)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.agent, "agent", "", "the agent: a name under --agents, or a folder holding agent.yaml")
	f.StringVar(&o.agents, "agents", "agents", "agents root (agents/<name>/agent.yaml)")
	f.StringArrayVar(&o.tasks, "tasks", nil, "the tasks: task folders, folders of tasks (tasks/demo), globs ('tasks/demo/minitron-*') or task ids; repeatable")
	f.StringVar(&o.runID, "run-id", "", "name of this run")
	f.StringArrayVar(&o.variants, "prompt-variant", []string{agent.Instruction}, "prompt variant: instruction, pr_description or instruction+skill; repeatable")
	f.StringVar(&o.skill, "skill", "", "skill folder (SKILL.md) for the instruction+skill variant, as `infradev skill` writes it")
	f.BoolVar(&o.asJSON, "json", false, "print the summary (report.json) as JSON instead of the tables")
	f.IntVar(&o.attempts, "attempts", 1, "attempts per task and variant (pass@k needs k of them)")
	f.IntVar(&o.jobs, "jobs", 1, "agent attempts at once")
	f.IntVar(&o.evalJobs, "eval-jobs", 0, "gradings at once (0: as capacity allows)")
	f.StringVar(&o.tasksRoot, "tasks-root", "tasks", "where task ids are looked up (tasks/<project>/<id>)")
	f.StringVar(&o.probes, "probes", "probes", "probes root")
	f.StringVar(&o.envs, "environments", "environments", "environments root")
	f.StringVar(&o.out, "out", "runs", "results root")
	f.StringVar(&o.results, "results", ".infradev/results", "content-addressed results store (empty: none)")
	_ = cmd.MarkFlagRequired("agent")
	_ = cmd.MarkFlagRequired("tasks")
	_ = cmd.MarkFlagRequired("run-id")
	return cmd
}

// matchTask matches a task directory against a glob; a trailing "**" matches any depth.
func matchTask(pattern, dir string) (bool, error) {
	pattern, dir = filepath.Clean(pattern), filepath.Clean(dir)
	if prefix, ok := strings.CutSuffix(pattern, string(filepath.Separator)+"**"); ok {
		return strings.HasPrefix(dir, prefix+string(filepath.Separator)), nil
	}
	return filepath.Match(pattern, dir)
}

// selectTasks loads the tasks named by directories, globs over them or ids, in id order.
func selectTasks(root string, sel []string) ([]*task.Task, error) {
	found, err := task.Find(root)
	if err != nil {
		return nil, err
	}
	picked := map[string]string{}
	for _, s := range sel {
		n := 0
		// A folder of tasks (tasks/demo, or the whole tasks root) selects every task in it.
		if fi, err := os.Stat(s); err == nil && fi.IsDir() {
			if _, err := os.Stat(filepath.Join(s, "task.yaml")); err != nil {
				s = filepath.Join(s, "**")
			}
		}
		for id, dir := range found {
			ok := id == s || filepath.Clean(s) == filepath.Clean(dir)
			if !ok {
				var err error
				if ok, err = matchTask(s, dir); err != nil {
					return nil, fault.Inputf("--tasks %q: %v", s, err)
				}
			}
			if ok {
				picked[id] = dir
				n++
			}
		}
		if n == 0 {
			return nil, fault.Inputf("--tasks %q: no task under %s matches", s, root)
		}
	}
	ids := make([]string, 0, len(picked))
	for id := range picked {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []*task.Task
	for _, id := range ids {
		t, err := task.Load(picked[id])
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}
