// Package slurm owns handing attempts to a Slurm cluster's own scheduler. Each attempt is a
// batch job that asks for exactly what its task needs (CPUs, memory, GPUs as gres, a time limit
// from the task's timeouts) and runs `infradev run-task` on a node, against the image store and
// run folder on the file system the cluster shares; Slurm decides where and when. Its
// Attempter is an attempt.Attempter, so evaluations keep their keys, results store, sharing
// and resumption whatever runs the attempts. A job Slurm fails (a node that dies, preemption)
// is an infrastructure fault; a job that hits its time limit is a timeout.
package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/attempt"
	"github.com/infradev/infradev/harness/grade"
	"github.com/infradev/infradev/harness/result"
)

// Attempter runs attempts as Slurm jobs.
type Attempter struct {
	// Keys computes the inputs' digests: the same keys run-task computes on the node.
	Keys attempt.Attempter
	// Binary is the infradev binary the jobs run, at a path every node sees; Store and Cache
	// are its --store (shared) and --cache (may be node-local) flags.
	Binary, Store, Cache string
	// Partition and Account are sbatch's; Options are more sbatch options, as given.
	Partition, Account string
	Options            []string
	// Env is added to the Slurm commands' environment (e.g. SLURM_CONF).
	Env []string
	// Poll is how often a job's state is read. Default 1s.
	Poll time.Duration
	// Progress, when set, is told of each job's state changes.
	Progress func(job, state string)
}

// Digests implements attempt.Attempter.
func (a Attempter) Digests(in attempt.Inputs) (result.Inputs, error) { return a.Keys.Digests(in) }

// Request is what a job asks Slurm for.
type Request struct {
	CPUs      int
	MemoryMiB int64
	GPUs      int
	Minutes   int
}

// RequestOf is what an attempt of in asks for: its task's CPUs (at least 1), memory (with
// 512 MiB for the harness itself) and GPUs, and its phases' timeouts with 10 minutes for
// unpacking and setup.
func RequestOf(in attempt.Inputs) Request {
	t := in.Task
	r := Request{CPUs: max(1, int(math.Ceil(t.Resources.CPUs))), GPUs: t.Resources.GPUs.Count}
	if t.Resources.MemoryBytes > 0 {
		r.MemoryMiB = t.Resources.MemoryBytes>>20 + 512
	}
	total := t.Timeouts.ApplyD + t.Timeouts.TestsD + t.Timeouts.ProbesD + 10*time.Minute
	r.Minutes = int(math.Ceil(total.Minutes()))
	return r
}

// Run implements attempt.Attempter: submit, wait for Slurm's final state, read the result the
// job wrote. Cancelling ctx cancels the job.
func (a Attempter) Run(ctx context.Context, in attempt.Inputs, out string) (*result.Result, error) {
	out, err := filepath.Abs(out)
	if err != nil {
		return nil, err
	}
	// Each job writes its own folder: a job Slurm gave up on may still be running on its node
	// when the retry's job starts.
	job, err := os.MkdirTemp(mkdir(filepath.Join(out, "slurm")), "job-")
	if err != nil {
		return nil, err
	}
	patch := filepath.Join(job, "submission.patch")
	if err := atomicfile.Write(patch, in.Patch); err != nil {
		return nil, err
	}
	script := filepath.Join(job, "job.sh")
	run := filepath.Join(job, "run")
	if err := os.WriteFile(script, []byte(a.script(in, patch, run)), 0o755); err != nil {
		return nil, err
	}
	id, err := a.submit(ctx, in, job, script)
	if err != nil {
		return nil, fmt.Errorf("sbatch: %w", err)
	}
	state, err := a.wait(ctx, id)
	if err != nil {
		if ctx.Err() != nil {
			_ = a.command(context.Background(), "scancel", id).Run()
			return nil, ctx.Err()
		}
		return nil, err
	}
	return a.collect(in, out, run, id, state)
}

// script is the job: run-task, whose exit 0 (resolved) and 1 (not resolved) are both verdicts.
func (a Attempter) script(in attempt.Inputs, patch, out string) string {
	q := shellQuote
	args := []string{q(a.Binary)}
	if a.Store != "" {
		args = append(args, "--store", q(a.Store))
	}
	if a.Cache != "" {
		args = append(args, "--cache", q(a.Cache))
	}
	id := in.Identity()
	args = append(args, "run-task", "--task", q(abs(in.Task.Dir)), "--probes", q(abs(in.Probes.Dir)),
		"--layout", q(abs(in.Layout)), "--image", q(in.Image), "--patch", q(patch), "--out", q(out),
		"--model", q(id.Model), "--instance-id", q(id.InstanceID), "--results", "''")
	return "#!/bin/sh\n# One attempt, as Slurm runs it: infradev run-task; exits 0 and 1 are verdicts.\n" +
		strings.Join(args, " ") + "\nrc=$?\n[ \"$rc\" -le 1 ] && exit 0\nexit \"$rc\"\n"
}

func (a Attempter) submit(ctx context.Context, in attempt.Inputs, dir, script string) (string, error) {
	r := RequestOf(in)
	args := []string{"--parsable", "--job-name", "infradev-" + in.Identity().InstanceID,
		// sbatch reads % in file names as a pattern (%j, %N...): run folders hold %XX escapes.
		"--output", strings.ReplaceAll(filepath.Join(dir, "job.log"), "%", "%%"), "--chdir", dir,
		"--nodes", "1", "--ntasks", "1", "--cpus-per-task", strconv.Itoa(r.CPUs), "--time", strconv.Itoa(r.Minutes)}
	if r.MemoryMiB > 0 {
		args = append(args, "--mem", fmt.Sprintf("%dM", r.MemoryMiB))
	}
	if r.GPUs > 0 {
		args = append(args, fmt.Sprintf("--gres=gpu:%d", r.GPUs))
	}
	if a.Partition != "" {
		args = append(args, "--partition", a.Partition)
	}
	if a.Account != "" {
		args = append(args, "--account", a.Account)
	}
	args = append(append(args, a.Options...), script)
	var stdout, stderr bytes.Buffer
	cmd := a.command(ctx, "sbatch", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	id, _, _ := strings.Cut(strings.TrimSpace(stdout.String()), ";")
	if id == "" {
		return "", errors.New("no job id in sbatch's output")
	}
	return id, nil
}

// final are the states a job leaves the queue in.
var final = map[string]bool{"COMPLETED": true, "FAILED": true, "TIMEOUT": true, "CANCELLED": true, "NODE_FAIL": true,
	"PREEMPTED": true, "BOOT_FAIL": true, "DEADLINE": true, "OUT_OF_MEMORY": true}

// JobState is a job's state as scontrol reports it.
type JobState struct {
	State    string
	ExitCode string // "rc:signal"
	Reason   string
}

func (a Attempter) wait(ctx context.Context, id string) (JobState, error) {
	poll := a.Poll
	if poll == 0 {
		poll = time.Second
	}
	last := ""
	for {
		st, err := a.State(ctx, id)
		if err != nil {
			return JobState{}, err
		}
		if st.State != last && a.Progress != nil {
			a.Progress(id, st.State)
		}
		last = st.State
		if final[st.State] {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return JobState{}, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// State reads a job's state with scontrol.
func (a Attempter) State(ctx context.Context, id string) (JobState, error) {
	var stdout, stderr bytes.Buffer
	cmd := a.command(ctx, "scontrol", "show", "job", "-o", id)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return JobState{}, fmt.Errorf("scontrol show job %s: %w: %s", id, err, strings.TrimSpace(stderr.String()))
	}
	var st JobState
	for _, f := range strings.Fields(stdout.String()) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "JobState":
			st.State = v
		case "ExitCode":
			st.ExitCode = v
		case "Reason":
			st.Reason = v
		}
	}
	if st.State == "" {
		return JobState{}, fmt.Errorf("scontrol show job %s: no JobState in %q", id, stdout.String())
	}
	return st, nil
}

// collect turns a finished job into the attempt's result.
func (a Attempter) collect(in attempt.Inputs, out, run, id string, st JobState) (*result.Result, error) {
	switch st.State {
	case "COMPLETED", "FAILED":
		// run-task wrote a verdict (exit 0 or 1) or a task or infrastructure fault of its own:
		// its run folder becomes the attempt's.
		if r, err := result.Read(filepath.Join(run, "result.json")); err == nil {
			if err := os.CopyFS(out, os.DirFS(run)); err != nil {
				return nil, fmt.Errorf("job %s: copying its run folder: %w", id, err)
			}
			r.SetIdentity(in.Identity())
			return r, result.Write(filepath.Join(out, "result.json"), r)
		}
		return a.write(in, out, result.Phase{Name: "slurm", Status: result.StatusError,
			Detail: fmt.Sprintf("job %s %s (exit %s) without a result: see slurm/job.log", id, st.State, st.ExitCode)})
	case "TIMEOUT":
		return a.write(in, out, result.Phase{Name: "slurm", Status: result.StatusTimeout,
			Detail: fmt.Sprintf("job %s hit its time limit of %d minutes", id, RequestOf(in).Minutes)})
	case "OUT_OF_MEMORY":
		return a.write(in, out, result.Phase{Name: "slurm", Status: result.StatusOOM,
			Detail: fmt.Sprintf("job %s ran out of its memory", id)})
	}
	// NODE_FAIL, PREEMPTED, BOOT_FAIL, CANCELLED by someone else, DEADLINE: Slurm's doing.
	return a.write(in, out, result.Phase{Name: "infra", Status: result.StatusError,
		Detail: fmt.Sprintf("slurm job %s ended %s (%s)", id, st.State, st.Reason)})
}

// write records a result the job itself could not write.
func (a Attempter) write(in attempt.Inputs, out string, p result.Phase) (*result.Result, error) {
	keys, err := a.Keys.Digests(in)
	if err != nil {
		return nil, err
	}
	return grade.Record(in, keys, p, out)
}

func (a Attempter) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), a.Env...)
	return cmd
}

func mkdir(p string) string {
	_ = os.MkdirAll(p, 0o755)
	return p
}

func abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
