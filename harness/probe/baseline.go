package probe

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/infradev/infradev/harness/atomicfile"
)

// BaselineSchema is the schema version of baseline.json.
const BaselineSchema = "infradev.baseline/v1"

// BaselineFile is where a task's gold figures live, beside its probes.
const BaselineFile = "baseline.json"

// Baseline is what the gold patch measured for each budgeted probe, as written by
// `infradev validate`: the largest figure over its runs.
type Baseline struct {
	Schema      string             `json:"schema"`
	Task        string             `json:"task"`
	Environment string             `json:"environment"`
	Harness     string             `json:"harness"`
	Runs        int                `json:"runs"`
	Probes      map[string]Figures `json:"probes"`
}

// Figures are one probe's measured resource use.
type Figures struct {
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`
	WallSeconds     float64 `json:"wall_seconds"`
	CPUSeconds      float64 `json:"cpu_seconds,omitempty"`
}

// ReadBaseline reads dir/baseline.json; it returns nil, nil when there is none.
func ReadBaseline(dir string) (*Baseline, error) {
	path := filepath.Join(dir, BaselineFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var b Baseline
	if err := json.Unmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if b.Schema != BaselineSchema {
		return nil, fmt.Errorf("%s: schema %q, want %q", path, b.Schema, BaselineSchema)
	}
	return &b, nil
}

// WriteBaseline writes dir/baseline.json atomically.
func WriteBaseline(dir string, b *Baseline) error {
	b.Schema = BaselineSchema
	return atomicfile.WriteJSON(filepath.Join(dir, BaselineFile), b)
}

// Budgeted returns the probes that carry a budget.
func (s *Set) Budgeted() []Probe {
	var out []Probe
	for _, p := range s.Probes {
		if p.Budget != nil {
			out = append(out, p)
		}
	}
	return out
}
