// Package importer owns turning an upstream change into a task skeleton: the base is the merge
// commit's first parent; the gold patch, official test patch and PR description are derived
// (package upstream); the official tests are run in the sandbox several times at the base (with
// the test patch) and at the merge commit, as SWE-bench's validation does, and every test id is
// classed fail-to-pass, pass-to-pass, or dropped with the reason. A change without a
// fail-to-pass test is refused. What it writes is a task.yaml and an instruction to be written
// by hand; nothing upstream enters the task directory.
package importer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/mirror"
	"github.com/infradev/infradev/harness/prepare"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/upstream"
)

// Surveyor runs a task's test files and reports outcomes by node id (runner.Runner.Survey).
type Surveyor interface {
	Survey(ctx context.Context, in runner.Inputs, files, deselect []string, out string) (map[string]string, error)
}

// Options describe one import.
type Options struct {
	URL, MergeCommit string
	// ID, Project and Environment name the task; Path is the repository's path in the image.
	ID, Project, Environment, Path string
	// Tests are test path globs (default upstream.DefaultTests); Files the test files to run
	// (default: the Python test modules the test patch touches); Deselect ids never to run.
	Tests, Files, Deselect []string
	// Plugins are pytest plugins to load (-p).
	Plugins []string
	// Ranks runs the tests as that many rank processes, as torchrun does (tests.ranks).
	Ranks int
	// Runs is how many times each side runs. Default 3.
	Runs int
	// Timeout bounds one run of the tests. Default 30m.
	Timeout time.Duration
	// Out is where the task directory is written (tasks/<project>/<id>); Work holds the runs.
	Out, Work string
	Mirrors   mirror.Map
	Prepare   *prepare.Preparer
	Runner    Surveyor
	// Log receives progress lines. Default: discarded.
	Log func(format string, args ...any)
}

// Result is an import's outcome.
type Result struct {
	Base                   string
	FailToPass, PassToPass []string
	// Dropped maps a test id to why it is not official.
	Dropped map[string]string
	Files   []string
	// Seconds is the wall time of the whole import.
	Seconds float64
	TaskDir string
}

// Run imports one change.
func Run(ctx context.Context, o Options) (*Result, error) {
	start := time.Now()
	if o.Runs == 0 {
		o.Runs = 3
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Minute
	}
	log := o.Log
	if log == nil {
		log = func(string, ...any) {}
	}
	gitDir, err := o.Mirrors.Resolve(o.URL, o.MergeCommit)
	if err != nil {
		return nil, err
	}
	base, err := upstream.FirstParent(ctx, gitDir, o.MergeCommit)
	if err != nil {
		return nil, err
	}
	t := &task.Task{Schema: task.Schema, ID: o.ID, Project: o.Project, Environment: o.Environment,
		Repo:  task.Repo{URL: o.URL, Path: o.Path, BaseCommit: base, MergeCommit: o.MergeCommit},
		Tests: task.Tests{Runner: "pytest", Paths: o.Tests, Plugins: o.Plugins, Ranks: o.Ranks},
		Resources: task.Resources{CPUs: 2, Memory: "8GiB", MemoryBytes: 8 << 30, DiskBytes: task.DefaultDiskBytes,
			Pids: task.DefaultPids},
		Timeouts: task.Timeouts{ApplyD: 5 * time.Minute, TestsD: o.Timeout, ProbesD: o.Timeout},
		Dir:      filepath.Join(o.Work, "spec")}
	if err := os.MkdirAll(t.Dir, 0o755); err != nil {
		return nil, err
	}
	img, err := o.Prepare.Task(ctx, t)
	if err != nil {
		return nil, err
	}
	d, err := upstream.Read(filepath.Dir(t.Derived.Gold))
	if err != nil {
		return nil, err
	}
	files := o.Files
	if len(files) == 0 {
		for _, f := range d.TestFiles {
			if base := filepath.Base(f); strings.HasSuffix(f, ".py") && (strings.HasPrefix(base, "test_") || strings.HasSuffix(base, "_test.py")) {
				files = append(files, f)
			}
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s %s changes no Python test module (%v): name the test files to run", o.URL, o.MergeCommit[:12], d.TestFiles)
	}
	gold, err := os.ReadFile(t.GoldFile())
	if err != nil {
		return nil, err
	}
	in := runner.Inputs{Task: t, Layout: o.Prepare.Store.Layout(), Image: img}
	var baseRuns, mergeRuns []map[string]string
	for _, side := range []struct {
		name  string
		patch []byte
	}{{"base", nil}, {"merge", gold}} {
		for i := 1; i <= o.Runs; i++ {
			a := in
			a.Patch = side.patch
			out := filepath.Join(o.Work, fmt.Sprintf("%s-%d", side.name, i))
			runStart := time.Now()
			got, err := o.Runner.Survey(ctx, a, files, o.Deselect, out)
			if err != nil {
				return nil, fmt.Errorf("%s run %d: %w", side.name, i, err)
			}
			log("%s run %d: %d tests in %.1fs", side.name, i, len(got), time.Since(runStart).Seconds())
			if side.name == "base" {
				baseRuns = append(baseRuns, got)
			} else {
				mergeRuns = append(mergeRuns, got)
			}
		}
	}
	f2p, p2p, dropped := Classify(baseRuns, mergeRuns)
	res := &Result{Base: base, FailToPass: f2p, PassToPass: p2p, Dropped: dropped, Files: files}
	if len(f2p) == 0 {
		return res, fmt.Errorf("%s %s: no test fails at the base and passes at the merge commit: not a task", o.URL, o.MergeCommit[:12])
	}
	res.TaskDir = o.Out
	if err := writeSkeleton(o, base, res); err != nil {
		return nil, err
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// Classify sorts the tests of several runs at the base and at the merge commit. A test is
// fail-to-pass when it passed in every merge run and in no base run (a module that fails to
// import reports no tests: not passing); pass-to-pass when it passed in every run of both;
// otherwise it is dropped, with the reason.
func Classify(base, merge []map[string]string) (f2p, p2p []string, dropped map[string]string) {
	dropped = map[string]string{}
	ids := map[string]bool{}
	for _, runs := range [][]map[string]string{base, merge} {
		for _, r := range runs {
			for id := range r {
				ids[id] = true
			}
		}
	}
	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Strings(sorted)
	for _, id := range sorted {
		mergePass, mergeWhy := passes(merge, id)
		basePass, _ := passes(base, id)
		switch {
		case mergePass < len(merge) && mergePass > 0:
			dropped[id] = fmt.Sprintf("flaky at the merge commit: passed %d of %d runs", mergePass, len(merge))
		case mergePass < len(merge):
			dropped[id] = "does not pass at the merge commit: " + mergeWhy
		case basePass == 0:
			f2p = append(f2p, id)
		case basePass == len(base):
			p2p = append(p2p, id)
		default:
			dropped[id] = fmt.Sprintf("flaky at the base: passed %d of %d runs", basePass, len(base))
		}
	}
	return f2p, p2p, dropped
}

// passes counts the runs in which id passed, and says how it did not in one that failed.
func passes(runs []map[string]string, id string) (int, string) {
	n, why := 0, ""
	for _, r := range runs {
		o, ok := r[id]
		switch {
		case o == "passed":
			n++
		case !ok:
			why = "not reported (its module does not import, or it is not collected)"
		default:
			why = o
		}
	}
	return n, why
}

func writeSkeleton(o Options, base string, r *Result) error {
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Imported by `infradev task import` from %s %s.\n", o.URL, o.MergeCommit)
	fmt.Fprintf(&b, "# The gold patch, official test patch and PR description are derived from the commits at\n# build time; write instruction.md and the probes by hand.\n")
	fmt.Fprintf(&b, "schema: %s\nid: %s\nproject: %s\nkind: \"TODO: the kind of change\"\n", task.Schema, o.ID, o.Project)
	fmt.Fprintf(&b, "repo:\n  url: %s\n  path: %s\n  base_commit: %s\n  merge_commit: %s\n", o.URL, o.Path, base, o.MergeCommit)
	fmt.Fprintf(&b, "environment: %s\ninstruction: instruction.md\ntests:\n  runner: pytest\n", o.Environment)
	if len(o.Tests) > 0 {
		b.WriteString("  paths:\n")
		for _, g := range o.Tests {
			fmt.Fprintf(&b, "    - %q\n", g)
		}
	}
	if len(o.Plugins) > 0 {
		b.WriteString("  plugins: [" + strings.Join(o.Plugins, ", ") + "]\n")
	}
	if o.Ranks > 1 {
		fmt.Fprintf(&b, "  ranks: %d\n", o.Ranks)
	}
	b.WriteString("  fail_to_pass:\n")
	for _, id := range r.FailToPass {
		fmt.Fprintf(&b, "    - %q\n", id)
	}
	if len(r.PassToPass) == 0 {
		b.WriteString("  pass_to_pass: []\n")
	} else {
		b.WriteString("  pass_to_pass:\n")
		for _, id := range r.PassToPass {
			fmt.Fprintf(&b, "    - %q\n", id)
		}
	}
	fmt.Fprintf(&b, "resources:\n  cpus: 2\n  memory: 8GiB\n  gpus: {count: 0}\ntimeouts:\n  apply: 5m\n  tests: %s\n  probes: %s\n",
		duration(o.Timeout), duration(o.Timeout))
	if err := atomicfile.Write(filepath.Join(o.Out, "task.yaml"), []byte(b.String())); err != nil {
		return err
	}
	instr := filepath.Join(o.Out, "instruction.md")
	if _, err := os.Stat(instr); err == nil {
		return nil // never overwrite an instruction someone wrote
	}
	return atomicfile.Write(instr, []byte(task.InstructionPlaceholder+" write what to build and every interface the probes use, without the solution.\n"))
}

func duration(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%dm", int(d/time.Minute))
	}
	return fmt.Sprintf("%ds", int(d/time.Second))
}
