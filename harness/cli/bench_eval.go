package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/infradev/infradev/harness/eval"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/judge"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/resultstore"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/schedule"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/unpack"
)

func newBenchEvalCmd(g *globals) *cobra.Command {
	var preds, taskDir string
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Eval speed: cold against warm reruns, and harness overhead per attempt",
		Long: `Evaluate the predictions cold (empty run folder and results store; the environment
already built), then rerun the same command (results resumed from the run folder) and run it
under a new run id (results from the store), and print the times and speedups. Then time one
gold attempt of --task through the harness against the same official-test and probe commands
run directly in the same root filesystem (chroot: no sandbox, no patch checks, no grading).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			work, err := os.MkdirTemp("", "infradev-bench-eval-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(work)
			r, err := g.runner()
			if err != nil {
				return err
			}
			results := filepath.Join(work, "results")
			cfg := eval.Config{Predictions: []string{preds}, TasksRoot: "tasks", ProbesRoot: "probes", EnvsRoot: "environments",
				Store: g.imageStore(), Out: filepath.Join(work, "runs"), Runner: r,
				Results:  resultstore.Store{Dir: results},
				Capacity: schedule.Capacity{CPUs: 64, MemoryBytes: totalMemory()}, Jobs: 1}
			timed := func(runID string) (time.Duration, int, error) {
				c := cfg
				c.RunID = runID
				start := time.Now()
				rs, err := eval.Run(ctx, c)
				return time.Since(start), len(rs), err
			}
			// Build the environment first: it is not what this benchmark measures.
			if _, _, err := timed("warmup-env"); err != nil {
				return err
			}
			os.RemoveAll(cfg.Out)
			os.RemoveAll(results)
			cold, n, err := timed("bench")
			if err != nil {
				return err
			}
			warm, _, err := timed("bench")
			if err != nil {
				return err
			}
			stored, _, err := timed("bench-2")
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "demo predictions: %d attempts, --jobs 1\n", n)
			fmt.Fprintf(out, "cold eval                       %9.3fs\n", cold.Seconds())
			fmt.Fprintf(out, "warm rerun (run folder)         %9.3fs   %7.0fx faster\n", warm.Seconds(), cold.Seconds()/warm.Seconds())
			fmt.Fprintf(out, "new run id (results store)      %9.3fs   %7.0fx faster\n", stored.Seconds(), cold.Seconds()/stored.Seconds())
			return overhead(ctx, out, g, r, taskDir, work)
		},
	}
	cmd.Flags().StringVar(&preds, "predictions", "tasks/demo/predictions/skeleton.jsonl", "predictions to evaluate")
	cmd.Flags().StringVar(&taskDir, "task", "tasks/demo/minitron-0001", "task whose gold attempt is timed against its commands run directly")
	return cmd
}

// overhead times one gold attempt through the harness against the same commands run directly.
func overhead(ctx context.Context, out io.Writer, g *globals, r runner.Attempter, taskDir, work string) error {
	t, err := task.Load(taskDir)
	if err != nil {
		return err
	}
	ps, err := probe.Load(task.ProbesDir("probes", taskDir), t.ID)
	if err != nil {
		return err
	}
	gold, err := os.ReadFile(t.GoldFile())
	if err != nil {
		return err
	}
	layout, _ := filepath.Abs(g.imageStore().Layout())
	img, err := resolveEnv(layout, t.Environment)
	if err != nil {
		return err
	}
	in := runner.Inputs{Task: t, Probes: ps, Layout: layout, Image: img, Patch: gold}
	const runs = 3
	var harness, direct time.Duration
	for i := 0; i < runs; i++ {
		start := time.Now()
		res, err := r.Run(ctx, in, filepath.Join(work, fmt.Sprintf("attempt-%d", i)))
		if err != nil {
			return err
		}
		if !res.Resolved {
			return fault.Checkf("gold did not resolve: %s", res.Reason)
		}
		harness += time.Since(start)
		d, err := runDirect(ctx, g, t, ps, layout, img, gold, filepath.Join(work, fmt.Sprintf("direct-%d", i)))
		if err != nil {
			return fault.Infraf("direct run: %v", err)
		}
		direct += d
	}
	fmt.Fprintf(out, "%s gold, mean of %d: harness attempt %.3fs, same commands run directly %.3fs: overhead %.2fx\n",
		t.ID, runs, harness.Seconds()/runs, direct.Seconds()/runs, harness.Seconds()/direct.Seconds())
	return nil
}

// runDirect prepares the repository with the gold and test patches (not timed), then times the
// official-test command and each probe command run with chroot, as a developer would run them.
func runDirect(ctx context.Context, g *globals, t *task.Task, ps *probe.Set, layout, img string, gold []byte, dir string) (time.Duration, error) {
	cache, _ := filepath.Abs(g.cache)
	stack, _, err := (unpack.Cache{Dir: filepath.Join(cache, "unpacked")}).Stack(ctx, layout, img)
	if err != nil {
		return 0, err
	}
	ov, err := sandbox.MountOverlay(stack, dir, 0)
	if err != nil {
		return 0, err
	}
	defer ov.Unmount()
	tests, err := os.ReadFile(t.TestPatchFile())
	if err != nil {
		return 0, err
	}
	// A chroot has no /dev of its own; git and Python want /dev/null.
	os.MkdirAll(filepath.Join(ov.Merged, "dev"), 0o755)
	if err := unix.Mknod(filepath.Join(ov.Merged, "dev", "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil && !os.IsExist(err) {
		return 0, err
	}
	tmp := filepath.Join(ov.Merged, "tmp")
	os.WriteFile(filepath.Join(tmp, "gold.patch"), gold, 0o644)
	os.WriteFile(filepath.Join(tmp, "tests.patch"), tests, 0o644)
	probes := filepath.Join(tmp, "probes")
	os.MkdirAll(probes, 0o755)
	entries, _ := os.ReadDir(ps.Dir)
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(ps.Dir, e.Name()))
		os.WriteFile(filepath.Join(probes, e.Name()), data, 0o644)
	}
	// The probes' judge library, as the harness stages it (children run as the same user here).
	lib := filepath.Join(tmp, "judge")
	os.MkdirAll(lib, 0o755)
	os.WriteFile(filepath.Join(lib, judge.LibraryModule+".py"), judge.Library, 0o644)
	chroot := func(script string) error {
		c := exec.CommandContext(ctx, "chroot", ov.Merged, "/bin/sh", "-c", script)
		c.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1"}
		var buf bytes.Buffer
		c.Stdout, c.Stderr = &buf, &buf
		if err := c.Run(); err != nil {
			return fmt.Errorf("%w: %s", err, buf.String())
		}
		return nil
	}
	if err := chroot("cd " + t.Repo.Path + " && git reset -q && git apply /tmp/gold.patch && git apply /tmp/tests.patch"); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := chroot("cd " + t.Repo.Path + " && python3 -m pytest -q -p no:cacheprovider " + strings.Join(t.Tests.IDs(), " ")); err != nil {
		return 0, err
	}
	var ids []string
	for _, p := range ps.Probes {
		ids = append(ids, path.Join("/tmp/probes", p.Test))
	}
	// The repository holds gold and the official tests here: it is also the gold tree that
	// reference children run over.
	if err := chroot("cd " + t.Repo.Path + " && PYTHONPATH=/tmp/judge INFRADEV_REPO=" + t.Repo.Path + " INFRADEV_REFERENCE=" + t.Repo.Path +
		" python3 -m pytest -q -p no:cacheprovider --rootdir=/tmp/probes " + strings.Join(ids, " ")); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
