// Package attempt owns the shared vocabulary of grading one submission: the inputs of an
// attempt and the Attempter interface that runners, retries, result caches and leases
// implement by wrapping one another. It holds types only, so that every layer above the
// specs can name an attempt without importing the runner.
package attempt

import (
	"context"

	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/task"
)

// Attempter runs attempts and names the key under which their results may be reused.
type Attempter interface {
	Run(ctx context.Context, in Inputs, out string) (*result.Result, error)
	Digests(in Inputs) (result.Inputs, error)
}

// Identity is who the attempt's result belongs to.
func (in Inputs) Identity() result.Identity {
	instance := in.InstanceID
	if instance == "" && in.Task != nil {
		instance = in.Task.ID
	}
	return result.Identity{Model: in.Model, InstanceID: instance, PromptVariant: in.PromptVariant, Attempt: in.Attempt}
}

// Inputs are everything an attempt depends on.
type Inputs struct {
	Task   *task.Task
	Probes *probe.Set
	// Layout is the OCI image layout holding the environment; Image its manifest digest.
	Layout string
	Image  string
	// Patch is the submission, a unified diff; empty means no change.
	Patch      []byte
	InstanceID string
	Model      string
	// MeasureBudgets records budgeted probes' figures without judging them: how gold's
	// baseline is measured.
	MeasureBudgets bool
	// GPUs are the device indices leased to this attempt (CUDA_VISIBLE_DEVICES inside).
	GPUs []int
	// PromptVariant names the prompt the submission was made from, and Attempt which of an
	// agent's repeated attempts it is (both recorded only).
	PromptVariant string
	Attempt       int
	// Cheat names an in-process cheat (package cheat) the harness adds to the submission, as
	// the code under test would carry it: how validation checks that canaries and probes hold.
	Cheat string
	// AllPhases runs the official tests and probes even after a phase fails (the verdict is
	// the same): validation uses it to see the probes' own judgement of every sample.
	AllPhases bool
	// Probe is how validation runs the probes; the zero value is a scored attempt's.
	Probe ProbeMode
}

// ProbeMode is how the probes of an attempt run for validation rather than for a score.
type ProbeMode struct {
	// Authors keeps the probe phases' logs and the children's output and tracebacks in the run
	// folder. Off for a scored attempt: what the code under test prints (the driver's source,
	// its inputs) must not reach what a submitter reads.
	Authors bool
	// Record keeps what every probe child sent (raw/probe-record/), for Forge runs to replay.
	Record bool
	// Forge makes every child over the submission forge its message from the recording in
	// Recorded (a folder a Record run wrote): "replay" sends gold's messages verbatim, "mix" the
	// code under test's values with gold's scalars, "nan" every float NaN (infradev_probe).
	Forge    string
	Recorded string
	// Only runs the apply phase and the probes (no official tests): a forgery run judges
	// the probes alone.
	Only bool
}

// Validation reports whether the attempt runs for validation (its result is never the
// submission's own and is keyed apart).
func (in Inputs) Validation() bool {
	return in.Cheat != "" || in.AllPhases || in.Probe != (ProbeMode{})
}
