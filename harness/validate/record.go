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
	"strings"
	"time"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/task"
)

// RecordSchema versions validation records.
const RecordSchema = "infradev.validation/v1"

// RecordFile is where a task's validation record is kept, beside its probes.
const RecordFile = "validation.json"

// Record is what a passing validation proved about a task, written by `infradev validate
// --record` and committed with the task: the digests of what was validated, the verdicts and
// the hardware. A record whose digests no longer match the task is stale.
type Record struct {
	Schema string `json:"schema"`
	Task   string `json:"task"`
	// Status is "cpu" (validated here, without GPUs) or "gpu" (on GPUs: Hardware names them).
	Status   string `json:"status"`
	Hardware string `json:"hardware"`
	// Digests of the task directory, the probes directory (samples included) and the
	// environment's locked manifest; Harness is the harness that validated.
	TaskDigest   string `json:"task_digest"`
	ProbesDigest string `json:"probes_digest"`
	Environment  string `json:"environment"`
	Harness      string `json:"harness"`

	GoldResolved int     `json:"gold_resolved"`
	GoldRuns     int     `json:"gold_runs"`
	Empty        string  `json:"empty"`
	Samples      int     `json:"samples"`
	TamperRuns   int     `json:"tamper_runs"`
	WallSeconds  float64 `json:"wall_seconds"`
	ValidatedAt  string  `json:"validated_at"`
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
	if !rep.OK() || rep.GoldRuns == 0 || rep.GoldResolved != rep.GoldRuns || rep.SamplesOK != rep.Samples ||
		rep.TamperOK != rep.TamperRuns || rep.Task != t.ID {
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
	if hardware != "cpu" {
		status = "gpu"
	}
	return &Record{Schema: RecordSchema, Task: t.ID, Status: status, Hardware: hardware, TaskDigest: td,
		ProbesDigest: pd, Environment: environment, Harness: harness, GoldResolved: rep.GoldResolved,
		GoldRuns: rep.GoldRuns, Empty: rep.Empty, Samples: rep.Samples, TamperRuns: rep.TamperRuns,
		WallSeconds: rep.WallSeconds, ValidatedAt: now.UTC().Format(time.RFC3339)}, nil
}

// WriteRecord writes probesDir/validation.json atomically.
func WriteRecord(probesDir string, r *Record) error {
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
	if r.Schema != RecordSchema {
		return nil, fmt.Errorf("%s: field schema: %q, want %q", p, r.Schema, RecordSchema)
	}
	if r.Status != "cpu" && r.Status != "gpu" {
		return nil, fmt.Errorf("%s: field status: %q, want cpu or gpu", p, r.Status)
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
