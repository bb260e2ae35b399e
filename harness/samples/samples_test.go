package samples_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/samples"
)

func probesDir(t *testing.T, samplesYAML string) (string, *probe.Set) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"probes.yaml": `schema: infradev.probes/v1
task: t-1
runner: pytest
probes:
  - {id: keeps-state, category: state, test: test_p.py::test_a}
  - {id: wired, category: structural, test: test_p.py::test_b}
  - {id: small, category: memory, test: test_p.py::test_c, budget: {peak_memory: 1.5x}}
`,
		"test_p.py":          "def test_a(): pass\n",
		"samples/leak.patch": "diff --git a/x b/x\n",
		"samples/both.patch": "diff --git a/y b/y\n",
	}
	if samplesYAML != "" {
		files["samples.yaml"] = samplesYAML
	}
	for name, body := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := probe.Load(dir, "t-1")
	if err != nil {
		t.Fatal(err)
	}
	return dir, ps
}

const good = `schema: infradev.samples/v1
task: t-1
samples:
  - {name: leak, patch: samples/leak.patch, want: probes_failed, failing_probes: [keeps-state]}
  - {name: both, patch: samples/both.patch, want: probes_failed, failing_probes: [wired, small]}
`

func TestLoadAndCoverage(t *testing.T) {
	dir, ps := probesDir(t, good)
	s, err := samples.Load(dir, "t-1", ps)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Uncovered(ps); len(got) != 0 {
		t.Errorf("Uncovered() = %v, want none", got)
	}
	patch, err := s.Read(s.Samples[0], nil)
	if err != nil || string(patch) != "diff --git a/x b/x\n" {
		t.Errorf("Read = %q, %v", patch, err)
	}
	// A sample written on the gold tree is composed with gold; without a composer it says why.
	onGold := s.Samples[0]
	onGold.On = "gold"
	if _, err := s.Read(onGold, nil); err == nil || !strings.Contains(err.Error(), "written on gold") {
		t.Errorf("Read(on gold, no composer) error = %v", err)
	}
	composed, err := s.Read(onGold, func(d []byte) ([]byte, error) { return append([]byte("gold+"), d...), nil })
	if err != nil || string(composed) != "gold+diff --git a/x b/x\n" {
		t.Errorf("Read(on gold) = %q, %v", composed, err)
	}

	partial := strings.Replace(good, "  - {name: both, patch: samples/both.patch, want: probes_failed, failing_probes: [wired, small]}\n", "", 1)
	dir, ps = probesDir(t, partial)
	s, err = samples.Load(dir, "t-1", ps)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.Uncovered(ps), ","); got != "wired,small" {
		t.Errorf("Uncovered() = %s, want wired,small", got)
	}
}

func TestNoSamplesFile(t *testing.T) {
	dir, ps := probesDir(t, "")
	s, err := samples.Load(dir, "t-1", ps)
	if s != nil || err != nil {
		t.Fatalf("Load = %v, %v; want nil, nil", s, err)
	}
	if got := len(s.Uncovered(ps)); got != 3 {
		t.Errorf("a task without samples leaves %d probes uncovered, want all 3", got)
	}
}

func TestBadSamples(t *testing.T) {
	dir, ps := probesDir(t, `schema: infradev.samples/v1
task: t-2
samples:
  - {name: gold, patch: samples/leak.patch, want: resolved}
  - {name: leak, patch: ../outside.patch, want: probes_failed}
  - {name: leak, patch: samples/missing.patch, want: broken}
  - {name: ok, patch: samples/both.patch, want: official_tests_failed, failing_probes: [wired]}
  - {name: typo, patch: samples/both.patch, want: probes_failed, failing_probes: [wird]}
`)
	_, err := samples.Load(dir, "t-1", ps)
	if err == nil {
		t.Fatal("Load accepted a bad samples.yaml")
	}
	for _, want := range []string{
		`samples.yaml:2: task: must be the task's id "t-1", got "t-2"`,
		`samples.yaml:4: samples[0].name: "gold" is taken`,
		`samples.yaml:5: samples[1].patch: "../outside.patch" is not a file`,
		`samples.yaml:5: samples[1].failing_probes: must name the probes that fail`,
		`samples.yaml:6: samples[2].name: "leak" is taken`,
		`samples.yaml:6: samples[2].patch: "samples/missing.patch" is not a file`,
		`samples.yaml:6: samples[2].want: must be one of`,
		`samples.yaml:7: samples[3].failing_probes: is only for want: probes_failed`,
		`samples.yaml:8: samples[4].failing_probes[0]: "wird" is not a probe of t-1`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func probesResult(class string, outcomes map[string]string) *result.Result {
	r := &result.Result{Resolved: class == "", FailureClass: class, Reason: "why"}
	p := result.Phase{Name: "probes"}
	for id, o := range outcomes {
		p.Tests = append(p.Tests, result.TestOutcome{ID: "test_p.py::" + id, Probe: id, Outcome: o})
	}
	r.Phases = append(r.Phases, p)
	return r
}

func TestCheck(t *testing.T) {
	sm := samples.Sample{Name: "both", Want: result.ProbesFailed, FailingProbes: []string{"wired", "small"}}
	for _, tc := range []struct {
		name string
		r    *result.Result
		want string
	}{
		{"as built", probesResult(result.ProbesFailed, map[string]string{"wired": "failed", "small": result.OverBudget, "keeps-state": "passed"}), ""},
		{"one probe short", probesResult(result.ProbesFailed, map[string]string{"wired": "failed", "small": "passed"}), "probes failed [wired], want [small wired]"},
		{"an extra probe", probesResult(result.ProbesFailed, map[string]string{"wired": "failed", "small": "failed", "keeps-state": "error"}), "probes failed [keeps-state small wired]"},
		{"resolved instead", probesResult("", map[string]string{"wired": "passed"}), "got resolved (why), want probes_failed"},
		{"tests failed instead", &result.Result{FailureClass: result.OfficialTestsFailed, Reason: "t"}, "got official_tests_failed (t)"},
	} {
		got := sm.Check(tc.r)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: Check() = %q, want %q", tc.name, got, tc.want)
		}
	}
}
