// Package result owns result.json: the versioned record of one task attempt, holding the digests
// of every input, the verdict and failure class, and per phase the status, per-test outcomes and
// resource figures. Everything a report needs; nothing a report must re-run.
package result

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/infradev/infradev/harness/atomicfile"
)

// Schema is the schema version written and read.
const Schema = "infradev.result/v1"

// Failure classes. The empty class means resolved.
const (
	PatchApplyFailed    = "patch_apply_failed"
	OfficialTestsFailed = "official_tests_failed"
	ProbesFailed        = "probes_failed"
	Timeout             = "timeout"
	OOM                 = "oom"
	// Tampered means the official tests' outcomes were forged: a canary got the wrong outcome,
	// the sealed report was missing or broken, or it reported tests that never ran. Counted
	// against the submission.
	Tampered = "tampered"
	// InfraError is a sandbox or harness fault: never counted against the submission.
	InfraError = "infra_error"
	// TaskError is a fault of the task itself (e.g. its repository is not at the base commit).
	TaskError = "task_error"
	// NotRun is an attempt this machine cannot run (e.g. it needs more GPUs than it has):
	// reported apart, never counted against the submission.
	NotRun = "not_run"
)

// IsSubmissionFailure reports whether a failure class counts against the submission.
func IsSubmissionFailure(class string) bool {
	switch class {
	case PatchApplyFailed, OfficialTestsFailed, ProbesFailed, Timeout, OOM, Tampered:
		return true
	}
	return false
}

// Result is one attempt of one submission on one task.
type Result struct {
	Schema     string `json:"schema"`
	InstanceID string `json:"instance_id"`
	Model      string `json:"model_name_or_path,omitempty"`
	Project    string `json:"project,omitempty"`
	// PromptVariant is the prompt the submission came from (e.g. instruction, pr_description).
	PromptVariant string `json:"prompt_variant,omitempty"`
	// Attempt numbers an agent's repeated attempts at one task from 1; 0 for a submission
	// made elsewhere (a plain predictions file).
	Attempt int    `json:"attempt,omitempty"`
	Inputs  Inputs `json:"inputs"`

	Resolved     bool   `json:"resolved"`
	FailureClass string `json:"failure_class,omitempty"`
	Reason       string `json:"reason,omitempty"`
	// EmptyPatch is set when the submission changed nothing.
	EmptyPatch bool `json:"empty_patch,omitempty"`
	// FailedProbeCategories lists the categories of failed probes, sorted, without repeats.
	FailedProbeCategories []string `json:"failed_probe_categories,omitempty"`

	// RetriedInfraErrors are the reasons of earlier attempts of the same inputs that ended in
	// an infrastructure error and were run again.
	RetriedInfraErrors []string `json:"retried_infra_errors,omitempty"`

	// FailToPass is how many official tests are fail-to-pass (listed first in the tests phase).
	FailToPass int       `json:"fail_to_pass_count"`
	Phases     []Phase   `json:"phases"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// Identity is who a result belongs to: what a shared or stored verdict is relabelled with.
// None of it can change a verdict, so none of it is in the result's key.
type Identity struct {
	Model, InstanceID, PromptVariant string
	Attempt                          int
}

// Identity returns r's identity.
func (r *Result) Identity() Identity {
	return Identity{Model: r.Model, InstanceID: r.InstanceID, PromptVariant: r.PromptVariant, Attempt: r.Attempt}
}

// SetIdentity relabels r as the result of id.
func (r *Result) SetIdentity(id Identity) {
	r.Model, r.InstanceID, r.PromptVariant, r.Attempt = id.Model, id.InstanceID, id.PromptVariant, id.Attempt
}

// Inputs are the digests of everything that can change a verdict.
type Inputs struct {
	Task        string `json:"task"`
	Environment string `json:"environment"`
	Probes      string `json:"probes"`
	Patch       string `json:"patch"`
	Harness     string `json:"harness"`
	Hardware    string `json:"hardware"`
}

// Phase statuses.
const (
	StatusPassed  = "passed"
	StatusFailed  = "failed"
	StatusTimeout = "timeout"
	StatusOOM     = "oom"
	StatusError   = "error"
	StatusSkipped = "skipped"
	// StatusTampered is a test phase whose report shows forged outcomes.
	StatusTampered = "tampered"
	// OverBudget is a test outcome: the probe passed but used more than its budget.
	OverBudget = "over_budget"
)

// Phase is one step of an attempt: apply, tests or probes.
type Phase struct {
	Name            string  `json:"name"`
	Status          string  `json:"status"`
	ExitCode        int     `json:"exit_code"`
	Detail          string  `json:"detail,omitempty"`
	WallSeconds     float64 `json:"wall_seconds"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
	// GPUPeakMemory is the leased GPUs' peak memory use above idle, where GPUs were leased.
	GPUPeakMemory int64         `json:"gpu_peak_memory_bytes,omitempty"`
	Tests         []TestOutcome `json:"tests,omitempty"`
	// Canaries is the check of the canary tests planted among the official tests.
	Canaries *Canaries `json:"canaries,omitempty"`
	Log      string    `json:"log,omitempty"`
	JUnit    string    `json:"junit,omitempty"`
}

// Canaries records the canary tests of a phase: how many were planted and those whose
// outcome was not the one they must get ("test_x (unittest, must fail): passed").
type Canaries struct {
	Planted int      `json:"planted"`
	Wrong   []string `json:"wrong,omitempty"`
}

// TestOutcome is the graded outcome of one expected test or probe.
type TestOutcome struct {
	ID string `json:"id"`
	// Outcome is passed, failed, error, skipped, missing (expected but not reported) or
	// over_budget (passed, but used more than its budget allows).
	Outcome  string `json:"outcome"`
	Probe    string `json:"probe,omitempty"`
	Category string `json:"category,omitempty"`
	Message  string `json:"message,omitempty"`
	// Figures of a budgeted probe's own run.
	PeakMemoryBytes int64   `json:"peak_memory_bytes,omitempty"`
	WallSeconds     float64 `json:"wall_seconds,omitempty"`
	CPUSeconds      float64 `json:"cpu_seconds,omitempty"`
}

// Phase returns the phase with this name, or nil.
func (r *Result) Phase(name string) *Phase {
	for i := range r.Phases {
		if r.Phases[i].Name == name {
			return &r.Phases[i]
		}
	}
	return nil
}

// Write writes r to path atomically.
func Write(path string, r *Result) error { return atomicfile.WriteJSON(path, r) }

// Read reads a result.json and checks its schema version.
func Read(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// Parse decodes a result.json's bytes and checks its schema version.
func Parse(data []byte) (*Result, error) {
	var r Result
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	if r.Schema != Schema {
		return nil, fmt.Errorf("schema %q, want %q", r.Schema, Schema)
	}
	return &r, nil
}
