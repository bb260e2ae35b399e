package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/importer"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/upstream"
)

func newTaskCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "task", Short: "Tasks from upstream changes"}
	cmd.AddCommand(newTaskImportCmd(g), newTaskDeriveCmd(g))
	return cmd
}

func newTaskImportCmd(g *globals) *cobra.Command {
	var o struct {
		repo, merge, env, id, project, path, out, work, envs string
		tests, files, deselect, plugins                      []string
		runs, ranks                                          int
		timeout                                              time.Duration
		asJSON                                               bool
	}
	cmd := &cobra.Command{
		Use:   "import --repo URL --merge-commit SHA --env NAME --id ID",
		Short: "Make a task skeleton from an upstream change, finding its fail-to-pass tests",
		Long: `Import an upstream change as a task. The base is the merge commit's first parent; the gold
patch and official test patch are the change split by test path rules (--tests, default the
frameworks' test directories and test modules), derived from a git mirror (--git-mirror,
$INFRADEV_GIT_MIRRORS) and kept in the store, never in the task directory. The task's image is
the environment (--env) with the repository at the base commit on top. The official test
files (--files, default the Python test modules the change touches) run --runs times at the
base with the test patch and at the merge commit; a test is fail-to-pass when it fails at every
base run and passes at every merge run, pass-to-pass when it passes everywhere, and dropped
otherwise (flaky, or failing at the merge commit: named with the reason). A change without a
fail-to-pass test is refused. Writes task.yaml and an instruction.md to be written by hand
under --out (default tasks/<project>/<id>).

Exit codes: 0 imported; 1 no fail-to-pass test; 2 bad usage; 3 infrastructure fault (a mirror
without the commits included).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.ranks < 0 || o.ranks > task.MaxRanks {
				return fault.Inputf("--ranks: must be between 1 and %d, got %d", task.MaxRanks, o.ranks)
			}
			if o.project == "" {
				o.project = o.env
			}
			if o.out == "" {
				o.out = filepath.Join("tasks", o.project, o.id)
			}
			if o.path == "" {
				o.path = "/workspace/" + filepath.Base(o.repo)
			}
			if o.work == "" {
				o.work = filepath.Join(g.cache, "import", o.id)
			}
			if err := os.RemoveAll(o.work); err != nil {
				return err
			}
			prep, err := g.preparer(o.envs, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			att, err := g.runner()
			if err != nil {
				return err
			}
			rn, ok := att.(importer.Surveyor)
			if !ok {
				return fault.Infraf("the runner cannot survey tests")
			}
			res, err := importer.Run(cmd.Context(), importer.Options{URL: o.repo, MergeCommit: o.merge, ID: o.id, Project: o.project,
				Environment: o.env, Path: o.path, Tests: o.tests, Files: o.files, Deselect: o.deselect, Plugins: o.plugins,
				Ranks: o.ranks, Runs: o.runs, Timeout: o.timeout, Out: o.out, Work: o.work, Mirrors: prep.Mirrors, Prepare: prep, Runner: rn,
				Log: func(f string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), f+"\n", a...) }})
			if res != nil {
				if o.asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					if err := enc.Encode(res); err != nil {
						return err
					}
				} else {
					printImport(cmd, res)
				}
			}
			if err != nil {
				if res != nil {
					return fault.Checkf("%v", err)
				}
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.repo, "repo", "", "the upstream repository's URL")
	f.StringVar(&o.merge, "merge-commit", "", "the commit that made the change (its first parent is the base)")
	f.StringVar(&o.env, "env", "", "the framework environment under --environments")
	f.StringVar(&o.id, "id", "", "the task id")
	f.StringVar(&o.project, "project", "", "the task's project (default: the environment's name)")
	f.StringVar(&o.path, "path", "", "the repository's path in the image (default /workspace/<repository name>)")
	f.StringVar(&o.out, "out", "", "the task directory to write (default tasks/<project>/<id>)")
	f.StringVar(&o.work, "work", "", "where the test runs go (default <cache>/import/<id>)")
	f.StringVar(&o.envs, "environments", "environments", "environments root")
	f.StringArrayVar(&o.tests, "tests", nil, "a glob of test paths (repeatable; default the frameworks' test directories and modules)")
	f.StringArrayVar(&o.files, "files", nil, "a test file to run (repeatable; default the Python test modules the change touches)")
	f.StringArrayVar(&o.deselect, "deselect", nil, "a test id never to run, e.g. one that hangs without a GPU (repeatable)")
	f.StringArrayVar(&o.plugins, "plugin", nil, "a pytest plugin the tests need, loaded with -p (repeatable)")
	f.IntVar(&o.runs, "runs", 3, "how many times each side runs")
	f.IntVar(&o.ranks, "ranks", 0, "run the tests as this many rank processes, as torchrun does (tests.ranks)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Minute, "the limit of one run of the tests")
	f.BoolVar(&o.asJSON, "json", false, "print the result as JSON")
	for _, n := range []string{"repo", "merge-commit", "env", "id"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

func printImport(cmd *cobra.Command, r *importer.Result) {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "base %s; test files: %v\n", r.Base, r.Files)
	fmt.Fprintf(w, "fail-to-pass (%d): fails at every base run, passes at every merge run\n", len(r.FailToPass))
	for _, id := range r.FailToPass {
		fmt.Fprintf(w, "  %s\n", id)
	}
	fmt.Fprintf(w, "pass-to-pass (%d): passes at every run\n", len(r.PassToPass))
	for _, id := range r.PassToPass {
		fmt.Fprintf(w, "  %s\n", id)
	}
	ids := make([]string, 0, len(r.Dropped))
	for id := range r.Dropped {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	fmt.Fprintf(w, "dropped (%d):\n", len(ids))
	for _, id := range ids {
		fmt.Fprintf(w, "  %s: %s\n", id, r.Dropped[id])
	}
	if r.TaskDir != "" {
		fmt.Fprintf(w, "wrote %s/task.yaml in %.0fs; write %s/instruction.md and the probes next\n", r.TaskDir, r.Seconds, r.TaskDir)
	}
}

func newTaskDeriveCmd(g *globals) *cobra.Command {
	var print string
	cmd := &cobra.Command{
		Use:   "derive TASK_DIR",
		Short: "Materialise an upstream task's gold patch, official test patch and PR description",
		Long: `Derive an upstream task's files from its commits into the store (from the store when they
are there already, else from a git mirror) and print where they are, or with --print gold,
tests or pr_description, one file's content.

Exit codes: 0 done; 2 bad usage or spec; 3 no mirror has the commits.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := task.Load(args[0])
			if err != nil {
				return err
			}
			if !t.Upstream() {
				return fault.Inputf("task %s references no upstream change (repo.url and repo.merge_commit)", t.ID)
			}
			m, err := g.mirrorMap()
			if err != nil {
				return err
			}
			if err := upstream.Attach(cmd.Context(), g.store, t, m); err != nil {
				return err
			}
			files := map[string]string{"gold": t.GoldFile(), "tests": t.TestPatchFile(), "pr_description": t.PRDescriptionFile()}
			if print == "" {
				for _, k := range []string{"gold", "tests", "pr_description"} {
					fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", k, files[k])
				}
				return nil
			}
			f, ok := files[print]
			if !ok {
				return fault.Inputf("--print: want gold, tests or pr_description, got %q", print)
			}
			data, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	}
	cmd.Flags().StringVar(&print, "print", "", "print one file: gold, tests or pr_description")
	return cmd
}
