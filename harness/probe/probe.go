// Package probe owns the hidden-probe spec: probes/<project>/<id>/probes.yaml and the probe
// files beside it. Probes are kept apart from tasks/ so nothing agent-facing can include them.
package probe

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/infradev/infradev/harness/specfile"
)

// Schema is the schema version this package reads.
const Schema = "infradev.probes/v1"

// Categories are the kinds of fault a probe can catch.
var Categories = []string{"structural", "state", "memory", "time", "traffic", "interface"}

// Set is a task's probes.
type Set struct {
	Schema string  `yaml:"schema"`
	Task   string  `yaml:"task"`
	Runner string  `yaml:"runner"`
	Probes []Probe `yaml:"probes"`

	// Dir is the probes directory; probe test ids are relative to it.
	Dir string `yaml:"-"`
	// Baseline is gold's measured figures (baseline.json), nil when not measured yet.
	Baseline *Baseline `yaml:"-"`
}

// Probe is one hidden check: one test id in a probe file.
type Probe struct {
	ID          string  `yaml:"id"`
	Category    string  `yaml:"category"`
	Test        string  `yaml:"test"`
	Description string  `yaml:"description"`
	Budget      *Budget `yaml:"budget"`
}

// Budget bounds a probe's resource use relative to the gold patch's measured baseline. A probe
// with a budget runs alone, so the figures of its sandbox run are its own.
type Budget struct {
	// PeakMemory is a factor such as "1.3x": peak memory at most 1.3 times gold's.
	PeakMemory string `yaml:"peak_memory"`
	// Wall is a factor such as "2x": wall time at most twice gold's.
	Wall string `yaml:"wall"`
	// CPU is a factor of gold's CPU time (user and system, every process of the run): unlike
	// wall time, it hardly moves when other work shares the machine.
	CPU string `yaml:"cpu"`

	PeakMemoryFactor, WallFactor, CPUFactor float64 `yaml:"-"`
}

var (
	idRe     = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)
	testIDRe = regexp.MustCompile(`^[^\s:][^\s]*\.py(::[^\s]+)+$`)
)

// Load reads and checks the probes in dir (which holds probes.yaml) for task taskID.
func Load(dir, taskID string) (*Set, error) {
	s := &Set{}
	doc := specfile.ReadFile(filepath.Join(dir, "probes.yaml"), s)
	if !doc.Parsed() {
		return nil, doc.Errs.Err()
	}
	s.Dir = dir
	if s.Schema != Schema {
		doc.Errorf("schema", "must be %q, got %q", Schema, s.Schema)
	}
	if s.Task != taskID {
		doc.Errorf("task", "must be the task's id %q, got %q", taskID, s.Task)
	}
	if s.Runner != "pytest" {
		doc.Errorf("runner", "must be \"pytest\", got %q", s.Runner)
	}
	if len(s.Probes) == 0 {
		doc.Errorf("probes", "must list at least one probe")
	}
	ids, tests := map[string]bool{}, map[string]bool{}
	for i, p := range s.Probes {
		at := func(f string) string { return fmt.Sprintf("probes[%d].%s", i, f) }
		if !idRe.MatchString(p.ID) {
			doc.Errorf(at("id"), "must match %s, got %q", idRe, p.ID)
		} else if ids[p.ID] {
			doc.Errorf(at("id"), "%q is used twice", p.ID)
		}
		ids[p.ID] = true
		if !isCategory(p.Category) {
			doc.Errorf(at("category"), "must be one of %s, got %q", strings.Join(Categories, ", "), p.Category)
		}
		file := strings.SplitN(p.Test, "::", 2)[0]
		switch {
		case !testIDRe.MatchString(p.Test) || !filepath.IsLocal(file):
			doc.Errorf(at("test"), "%q is not a pytest node id inside the probes directory", p.Test)
		case tests[p.Test]:
			doc.Errorf(at("test"), "%q is used by two probes", p.Test)
		default:
			if fi, err := os.Stat(filepath.Join(dir, file)); err != nil || !fi.Mode().IsRegular() {
				doc.Errorf(at("test"), "probe file %s does not exist", file)
			}
		}
		tests[p.Test] = true
		if p.Budget != nil {
			checkBudget(doc, i, &s.Probes[i])
		}
	}
	if err := doc.Errs.Err(); err != nil {
		return nil, err
	}
	b, err := ReadBaseline(dir)
	if err != nil {
		return nil, err
	}
	s.Baseline = b
	return s, nil
}

var factorRe = regexp.MustCompile(`^([0-9]+(\.[0-9]+)?)x$`)

func checkBudget(doc *specfile.Doc, i int, p *Probe) {
	at := func(f string) string { return fmt.Sprintf("probes[%d].budget.%s", i, f) }
	b := p.Budget
	parse := func(field, v string, dst *float64) {
		if v == "" {
			return
		}
		m := factorRe.FindStringSubmatch(v)
		if m == nil {
			doc.Errorf(at(field), "must be a factor of gold's figure such as 1.5x, got %q", v)
			return
		}
		f, _ := strconv.ParseFloat(m[1], 64)
		if f < 1 {
			doc.Errorf(at(field), "must be at least 1x (gold itself must fit), got %q", v)
			return
		}
		*dst = f
	}
	parse("peak_memory", b.PeakMemory, &b.PeakMemoryFactor)
	parse("wall", b.Wall, &b.WallFactor)
	parse("cpu", b.CPU, &b.CPUFactor)
	if b.PeakMemory == "" && b.Wall == "" && b.CPU == "" {
		doc.Errorf(fmt.Sprintf("probes[%d].budget", i), "must set peak_memory, wall or cpu")
	}
	if p.Category != "memory" && p.Category != "time" {
		doc.Errorf(fmt.Sprintf("probes[%d].category", i), "a probe with a budget must be in category memory or time, got %q", p.Category)
	}
}

// IDs returns every probe's test id, in spec order.
func (s *Set) IDs() []string {
	ids := make([]string, len(s.Probes))
	for i, p := range s.Probes {
		ids[i] = p.Test
	}
	return ids
}

func isCategory(c string) bool {
	for _, k := range Categories {
		if c == k {
			return true
		}
	}
	return false
}
