package validate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/task"
)

// RecordSchema versions validation records.
const RecordSchema = "infradev.validation/v2"

// LegacySchema is the schema of records written before validation ran the forgery check: such a
// record still pins what was validated and is current while its digests are, but it proves less
// (its probes were not shown to withstand children that forge their messages), so it is read
// with Legacy set and said so wherever it is shown.
const LegacySchema = "infradev.validation/v1"

// Statuses are what a record may say of its task (see Record.Status).
var Statuses = []string{"cpu", "cpu-pending", "gpu", "gpu-pending"}

// RecordFile is where a task's validation record is kept, beside its probes.
const RecordFile = "validation.json"

// Record is what a passing validation proved about a task, written by `infradev validate
// --record` and committed with the task: the digests of what was validated, the verdicts and
// the hardware. A record whose digests no longer match the task is stale.
type Record struct {
	Schema string `json:"schema"`
	Task   string `json:"task"`
	// Status is "cpu" (fully validated without GPUs), "gpu" (a task needing GPUs, fully
	// validated on them: Hardware names the machine class) or "gpu-pending" (a task needing
	// GPUs that got every check that needs none: see Options.GPUs) or "cpu-pending" (a task
	// needing no GPU that got the task check and gold's runs alone: see Options.GoldOnly).
	Status   string `json:"status"`
	Hardware string `json:"hardware"`
	// Digests of the task directory, the probes directory (samples included) and the
	// environment's locked manifest; Harness is the harness that validated.
	TaskDigest   string `json:"task_digest"`
	ProbesDigest string `json:"probes_digest"`
	Environment  string `json:"environment"`
	Harness      string `json:"harness"`

	GoldResolved int    `json:"gold_resolved"`
	GoldRuns     int    `json:"gold_runs"`
	Empty        string `json:"empty"`
	Samples      int    `json:"samples"`
	TamperRuns   int    `json:"tamper_runs"`
	// ForgeryRuns are the probe runs whose children forged gold's recording, all withstood.
	ForgeryRuns int     `json:"forgery_runs"`
	WallSeconds float64 `json:"wall_seconds"`
	ValidatedAt string  `json:"validated_at"`

	// Legacy is set when the record was read from a LegacySchema file (never written).
	Legacy bool `json:"-"`
}

// Digests are the current digests of a task's directory and its probes' (everything but the
// Bazel files and the record itself).
func Digests(t *task.Task, probesDir string) (taskDigest, probesDigest string, err error) {
	skip := func(rel string) bool {
		base := path.Base(rel)
		return base == "BUILD.bazel" || base == "__pycache__" || rel == RecordFile
	}
	if taskDigest, err = digest.Files(t.Dir, skip); err != nil {
		return "", "", err
	}
	probesDigest, err = digest.Files(probesDir, skip)
	return taskDigest, probesDigest, err
}

// NewRecord makes the record of a passing validation of the task and probes whose digests
// (Digests) were taken before it ran; it refuses when they are no longer the current ones (a
// file changed while the validation ran) or when any check did not pass.
func NewRecord(rep *Report, t *task.Task, probesDir, taskDigest, probesDigest, environment, harness, hardware string, now time.Time) (*Record, error) {
	// A full validation ran the tamper and forgery checks, and every run of them held.
	full := rep.GoldRuns > 0 && rep.GoldResolved == rep.GoldRuns && rep.SamplesOK == rep.Samples &&
		rep.TamperRuns > 0 && rep.TamperOK == rep.TamperRuns && rep.Forgeries > 0 && rep.ForgeriesOK == rep.Forgeries
	pending := rep.Pending && t.Resources.GPUs.Count > 0
	goldOnly := rep.GoldOnly && t.Resources.GPUs.Count == 0 && rep.GoldRuns > 0 && rep.GoldResolved == rep.GoldRuns
	if !rep.OK() || rep.Task != t.ID || (!full && !pending && !goldOnly) || (rep.Pending && !pending) || (rep.GoldOnly && !goldOnly) {
		return nil, fmt.Errorf("task %s did not validate: no record", t.ID)
	}
	td, pd, err := Digests(t, probesDir)
	if err != nil {
		return nil, err
	}
	if td != taskDigest || pd != probesDigest {
		return nil, fmt.Errorf("task %s: %s or %s changed while it was validated: no record (validate again)", t.ID, t.Dir, probesDir)
	}
	status := "cpu"
	switch {
	case pending:
		status = "gpu-pending"
	case goldOnly:
		status = "cpu-pending"
	case t.Resources.GPUs.Count > 0:
		if hardware == "cpu" {
			return nil, fmt.Errorf("task %s needs %d GPU(s) but was validated without one: no record", t.ID, t.Resources.GPUs.Count)
		}
		status = "gpu"
	}
	return &Record{Schema: RecordSchema, Task: t.ID, Status: status, Hardware: hardware, TaskDigest: td,
		ProbesDigest: pd, Environment: environment, Harness: harness, GoldResolved: rep.GoldResolved,
		GoldRuns: rep.GoldRuns, Empty: rep.Empty, Samples: rep.Samples, TamperRuns: rep.TamperRuns,
		ForgeryRuns: rep.Forgeries, WallSeconds: rep.WallSeconds, ValidatedAt: now.UTC().Format(time.RFC3339)}, nil
}

// WriteRecord writes probesDir/validation.json atomically.
func WriteRecord(probesDir string, r *Record) error {
	if r.Schema != RecordSchema {
		return fmt.Errorf("%s: a record of schema %q is not written (want %q)", filepath.Join(probesDir, RecordFile), r.Schema, RecordSchema)
	}
	return atomicfile.WriteJSON(filepath.Join(probesDir, RecordFile), r)
}

// ReadRecord reads probesDir/validation.json; nil, nil when there is none.
func ReadRecord(probesDir string) (*Record, error) {
	p := filepath.Join(probesDir, RecordFile)
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	switch r.Schema {
	case RecordSchema:
	case LegacySchema:
		r.Legacy = true
	default:
		return nil, fmt.Errorf("%s: field schema: %q, want %q", p, r.Schema, RecordSchema)
	}
	if !slices.Contains(Statuses, r.Status) {
		return nil, fmt.Errorf("%s: field status: %q, want one of %s", p, r.Status, strings.Join(Statuses, ", "))
	}
	return &r, nil
}

// Stale names what changed since the record was written: the task, its probes (samples
// included) or the environment's locked manifest; "" when the record still describes the task
// as it is.
func (r *Record) Stale(t *task.Task, probesDir, environment string) (string, error) {
	td, pd, err := Digests(t, probesDir)
	if err != nil {
		return "", err
	}
	var changed []string
	if r.Task != t.ID {
		changed = append(changed, "task id")
	}
	if r.TaskDigest != td {
		changed = append(changed, "task")
	}
	if r.ProbesDigest != pd {
		changed = append(changed, "probes")
	}
	if r.Environment != environment {
		changed = append(changed, "environment")
	}
	return strings.Join(changed, ", "), nil
}

// CheckRecord says what is wrong with the task's validation record against the task as it is
// and its environment's locked manifest: none, stale, or a status its GPU needs do not allow
// ("" when the record is current). A current record that proves less than a full validation
// does now (of the legacy schema, or cpu-pending) is no problem but comes back with a note
// saying what it lacks ("" otherwise).
func CheckRecord(t *task.Task, probesDir, environment string) (problem, note string, err error) {
	rec, err := ReadRecord(probesDir)
	if err != nil {
		return "", "", err
	}
	file := filepath.Join(probesDir, RecordFile)
	if rec == nil {
		return fmt.Sprintf("%s: no validation record (infradev validate --record writes it)", file), "", nil
	}
	changed, err := rec.Stale(t, probesDir, environment)
	if err != nil {
		return "", "", err
	}
	if changed != "" {
		return fmt.Sprintf("%s: stale: %s changed since it was written (validate again)", file, changed), "", nil
	}
	needs := t.Resources.GPUs.Count > 0
	if needs == strings.HasPrefix(rec.Status, "cpu") {
		return fmt.Sprintf("%s: field status: %q, but the task needs %d GPU(s)", file, rec.Status, t.Resources.GPUs.Count), "", nil
	}
	switch {
	case rec.Legacy:
		note = fmt.Sprintf("%s: schema %q: validated before the forgery check (validate --record again to prove its probes withstand forging children)", file, LegacySchema)
	case rec.Status == "cpu-pending":
		note = fmt.Sprintf("%s: cpu-pending: gold resolves %d/%d under these probes; the empty patch, samples, tamper and forgery checks are still to run (validate --record)", file, rec.GoldResolved, rec.GoldRuns)
	}
	return "", note, nil
}

// StatusText is how a current record's status is shown: its status, marked when the record
// predates the forgery check.
func (r *Record) StatusText() string {
	if r.Legacy {
		return r.Status + " (before the forgery check)"
	}
	return r.Status
}
