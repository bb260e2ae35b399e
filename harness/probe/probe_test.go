package probe_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/probe"
)

func write(t *testing.T, yaml string) string {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "probes.yaml"), []byte(yaml), 0o644)
	os.WriteFile(filepath.Join(dir, "test_p.py"), []byte("def test_a(): pass\n"), 0o644)
	return dir
}

func TestBudgets(t *testing.T) {
	dir := write(t, `schema: infradev.probes/v1
task: t-1
runner: pytest
probes:
  - {id: mem, category: memory, test: test_p.py::test_a, budget: {peak_memory: 1.25x, wall: 3x}}
  - {id: plain, category: state, test: test_p.py::test_b}
`)
	s, err := probe.Load(dir, "t-1")
	if err != nil {
		t.Fatal(err)
	}
	if b := s.Probes[0].Budget; b.PeakMemoryFactor != 1.25 || b.WallFactor != 3 {
		t.Errorf("budget = %+v", b)
	}
	if got := s.Budgeted(); len(got) != 1 || got[0].ID != "mem" {
		t.Errorf("Budgeted() = %v", got)
	}
	if s.Baseline != nil {
		t.Errorf("Baseline = %v, want nil before validate writes one", s.Baseline)
	}
	if err := probe.WriteBaseline(dir, &probe.Baseline{Task: "t-1", Probes: map[string]probe.Figures{"mem": {PeakMemoryBytes: 42}}}); err != nil {
		t.Fatal(err)
	}
	s, err = probe.Load(dir, "t-1")
	if err != nil || s.Baseline == nil || s.Baseline.Probes["mem"].PeakMemoryBytes != 42 {
		t.Errorf("after WriteBaseline: %+v, %v", s.Baseline, err)
	}
}

func TestBadBudgets(t *testing.T) {
	dir := write(t, `schema: infradev.probes/v1
task: t-1
runner: pytest
probes:
  - {id: a, category: state, test: test_p.py::test_a, budget: {peak_memory: lots}}
  - {id: b, category: memory, test: test_p.py::test_b, budget: {wall: 0.5x}}
  - {id: c, category: memory, test: test_p.py::test_c, budget: {}}
`)
	_, err := probe.Load(dir, "t-1")
	for _, want := range []string{
		"probes.yaml:5: probes[0].budget.peak_memory: must be a factor",
		"probes.yaml:5: probes[0].category: a probe with a budget must be in category memory or time",
		"probes.yaml:6: probes[1].budget.wall: must be at least 1x",
		"probes.yaml:7: probes[2].budget: must set peak_memory, wall or cpu",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
