// Package cli owns the infradev command line: one file per command, output through each
// command's writers, machine-readable output beside the human one, documented exit codes.
//
// Exit codes: 0 success (run-task: resolved); 1 a verdict or check failed (not resolved, a
// validation violation); 2 bad usage or a bad spec file; 3 an infrastructure fault.
package cli

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/mirror"
	"github.com/infradev/infradev/harness/prepare"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/samples"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/slurm"
	"github.com/infradev/infradev/harness/specfile"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/unpack"
	"github.com/infradev/infradev/harness/upstream"
)

// Version is the harness's release name. Results are keyed by harnessKey, which adds the
// digest of the running binary, so that any change to grading invalidates stored results.
const Version = "infradev/0.1.0"

var (
	harnessOnce sync.Once
	harnessID   string
	harnessErr  error
)

// harnessKey is Version plus the digest of the running executable (Go builds are
// reproducible: the same source gives the same key). A binary that cannot be read is an
// error, never a fallback: a key without the digest would share results across harnesses
// that grade differently.
func harnessKey() (string, error) {
	harnessOnce.Do(func() {
		harnessID, harnessErr = executableKey()
	})
	return harnessID, harnessErr
}

func executableKey() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fault.Infraf("the harness key: finding the running binary: %v", err)
	}
	f, err := os.Open(exe)
	if err != nil {
		return "", fault.Infraf("the harness key: %v", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fault.Infraf("the harness key: reading %s: %v", exe, err)
	}
	return fmt.Sprintf("%s+%x", Version, h.Sum(nil)[:8]), nil
}

// Exit codes.
const (
	ExitOK     = 0
	ExitFailed = 1
	ExitUsage  = 2
	ExitInfra  = 3
)

// ExitError carries an exit code to main.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

func exitf(code int, format string, args ...any) error {
	return &ExitError{Code: code, Err: fmt.Errorf(format, args...)}
}

// globals are the flags every command shares, and what is discovered once per process.
type globals struct {
	store   string
	cache   string
	mirrors []string

	gpusRead bool
	gpus     *gpu.Machine
	nvml     nvml.Interface
	gpuErr   error
}

// Execute runs the command line and returns the process exit code: the class of the error
// (package fault) decides it, in this one place. An error cobra returns before a command runs
// (an unknown flag, command or argument count) is bad usage.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := NewRoot()
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	ran := false
	markRun(cmd, &ran)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	if !ran {
		err = fault.Wrap(fault.Input, err)
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil && ee.Err.Error() != "" {
			fmt.Fprintln(stderr, "infradev:", ee.Err)
		}
		return ee.Code
	}
	var se specfile.Errors
	if errors.As(err, &se) {
		fmt.Fprintln(stderr, se.Error())
		return fault.Input.ExitCode()
	}
	c := fault.ClassOf(err)
	prefix := "infradev: "
	if c == fault.Infra {
		prefix += "infrastructure fault: "
	}
	fmt.Fprintln(stderr, prefix+err.Error())
	return c.ExitCode()
}

// markRun makes every command set *ran when its own code starts, after cobra's checks of
// flags and arguments.
func markRun(c *cobra.Command, ran *bool) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			*ran = true
			return run(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		markRun(sub, ran)
	}
}

// NewRoot builds the command tree.
func NewRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "infradev",
		Short:         "Score coding-agent patches on AI-infrastructure tasks, hermetically",
		SilenceUsage:  true,
		SilenceErrors: true,
		Long: `infradev builds content-addressed task environments, runs submissions in a sandbox
(apply the patch, run the official tests, run the hidden probes) and reports verdicts.

Exit codes: 0 success (run-task: resolved); 1 not resolved or a check failed;
2 bad usage, input or spec (or a broken task); 3 infrastructure fault; 130 interrupted.`,
	}
	root.PersistentFlags().StringVar(&g.store, "store", envOr("INFRADEV_STORE", ".infradev/store"),
		"image store: the OCI layout and step cache (env INFRADEV_STORE)")
	root.PersistentFlags().StringVar(&g.cache, "cache", envOr("INFRADEV_CACHE", ".infradev/cache"),
		"local cache: unpacked layers, sandbox state and scratch (env INFRADEV_CACHE)")
	root.PersistentFlags().StringArrayVar(&g.mirrors, "git-mirror", nil,
		"upstream repositories as local git directories: URL=DIR, or URL-PREFIX/=DIR (repeatable; tried before $INFRADEV_GIT_MIRRORS and $INFRADEV_GIT_MIRRORS_FILE)")
	root.AddCommand(newEnvCmd(g), newRunTaskCmd(g), newEvalCmd(g), newValidateCmd(g), newBenchCmd(g), newReportCmd(), newGPUsCmd(g), newSamplesCmd(g), newGenCmd(), newTaskCmd(g), newCatalogueCmd(), newAgentCmd(g), newAnalyzeCmd(g), newSkillCmd(g), newVersionCmd(), newBazelSubmissionsCmd(g))
	return root
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (g *globals) imageStore() image.Store { return image.Store{Dir: g.store} }

// mirrorMap is the mirror map from the flags and the environment.
func (g *globals) mirrorMap() (mirror.Map, error) {
	m, err := mirror.FromEnv(g.mirrors)
	if err != nil {
		return nil, fault.Wrap(fault.Input, err)
	}
	return m, nil
}

// samplePrep attaches an upstream task's derived files and returns how its samples written on
// the gold tree become submissions (through the task's mirror); for other tasks, nothing.
func (g *globals) samplePrep(ctx context.Context) func(*task.Task) (samples.OnGold, error) {
	return func(t *task.Task) (samples.OnGold, error) {
		if !t.Upstream() {
			return nil, nil
		}
		m, err := g.mirrorMap()
		if err != nil {
			return nil, err
		}
		if err := upstream.Attach(ctx, g.store, t, m); err != nil {
			return nil, err
		}
		gitDir, err := m.Resolve(t.Repo.URL, t.Repo.BaseCommit)
		if err != nil {
			return nil, err
		}
		gold, err := os.ReadFile(t.GoldFile())
		if err != nil {
			return nil, err
		}
		return func(diff []byte) ([]byte, error) {
			return upstream.OnGold(ctx, gitDir, t.Repo.BaseCommit, gold, diff)
		}, nil
	}
}

// preparer prepares tasks (derived upstream files, images) from the environments under envs.
func (g *globals) preparer(envs string, log io.Writer) (*prepare.Preparer, error) {
	m, err := g.mirrorMap()
	if err != nil {
		return nil, err
	}
	return &prepare.Preparer{Store: g.imageStore(), EnvsRoot: envs, Mirrors: m, Log: log}, nil
}

// runner wires the attempt runner: runc sandbox, unpack cache, scratch space, the machine's
// GPUs (leased across processes, passed through as the NVIDIA toolkit does) when NVML finds
// any, and one retry of attempts that end in an infrastructure error.
func (g *globals) runner() (runner.Attempter, error) {
	cache, err := filepath.Abs(g.cache)
	if err != nil {
		return nil, err
	}
	key, err := harnessKey()
	if err != nil {
		return nil, err
	}
	runc := &sandbox.Runc{Binary: envOr("INFRADEV_RUNTIME", "runc"), StateDir: filepath.Join(cache, "sandbox")}
	r := &runner.Runner{
		Sandbox:    gpu.Sandbox{Sandbox: runc},
		Cache:      unpack.Cache{Dir: filepath.Join(cache, "unpacked")},
		Scratch:    filepath.Join(cache, "scratch"),
		TaskChecks: filepath.Join(cache, "task-checks"),
		Harness:    key,
	}
	m := g.machine()
	if m == nil || len(m.Devices) == 0 {
		return runner.Retry{Attempter: r}, nil
	}
	// On a GPU machine: leases around the runner (a retry leases other GPUs than a faulty
	// one), and the sandbox wrapped to pass the leased GPUs through and meter them.
	leased := &runner.Leased{Attempter: r, Dir: envOr("INFRADEV_GPU_LEASES", "/run/infradev/gpu-leases"), Machine: m}
	r.Sandbox = gpu.Sandbox{Sandbox: runc, Nodes: gpu.HostNodes{Machine: m}, NVML: g.nvml, OnFault: leased.SetAside}
	r.Hardware = "gpu:" + m.Devices[0].Name
	return runner.Retry{Attempter: leased}, nil
}

// machine discovers the GPUs once; nil when there is no driver.
func (g *globals) machine() *gpu.Machine {
	if !g.gpusRead {
		g.gpusRead = true
		lib := nvml.New()
		m, err := gpu.Discover(lib)
		if err == nil {
			g.gpus, g.nvml = m, lib
		} else {
			g.gpuErr = err
		}
	}
	return g.gpus
}

// slurmAttempter runs attempts as Slurm jobs of this same binary, against this store, with
// the local runner's keys; one retry of jobs Slurm failed (a node lost, preemption).
func (g *globals) slurmAttempter(local runner.Attempter, partition, account string, opts []string, log io.Writer) (runner.Attempter, error) {
	exe := os.Getenv("INFRADEV_BINARY")
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fault.Infraf("the binary jobs run: %v", err)
		}
	}
	store, err := filepath.Abs(g.store)
	if err != nil {
		return nil, err
	}
	cache, err := filepath.Abs(g.cache)
	if err != nil {
		return nil, err
	}
	for _, bin := range []string{"sbatch", "scontrol", "scancel"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fault.Inputf("--executor slurm: %s is not on PATH", bin)
		}
	}
	return runner.Retry{Attempter: slurm.Attempter{Keys: local, Binary: exe, Store: store, Cache: cache,
		Partition: partition, Account: account, Options: opts,
		Progress: func(job, state string) { fmt.Fprintf(log, "slurm job %s: %s\n", job, state) }}}, nil
}
