package report_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/joshdk/go-junit"

	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
)

func res(model, id, class string, testsPassed bool, cats ...string) *result.Result {
	r := &result.Result{Model: model, InstanceID: id, FailureClass: class, Resolved: class == "", FailedProbeCategories: cats}
	st := result.StatusFailed
	if testsPassed {
		st = result.StatusPassed
	}
	r.Phases = []result.Phase{{Name: "apply", Status: "passed"}, {Name: "tests", Status: st}}
	return r
}

func TestSummarize(t *testing.T) {
	rs := []*result.Result{
		res("m1", "t1", "", true),
		res("m1", "t2", result.ProbesFailed, true, "state"),
		res("m1", "t3", result.OfficialTestsFailed, false),
		res("m1", "t4", result.InfraError, false),
		res("m2", "t1", result.ProbesFailed, true, "memory", "state"),
	}
	rs[2].EmptyPatch = true
	s := report.Summarize("r", rs)
	if len(s.Models) != 2 {
		t.Fatalf("models = %d", len(s.Models))
	}
	m1 := s.Models[0]
	if m1.ResolvedInstances != 1 || m1.CompletedInstances != 3 || m1.ErrorInstances != 1 || m1.EmptyPatchInstances != 1 {
		t.Errorf("m1 counts = %+v", m1)
	}
	if m1.ResolutionRate != 1.0/3 {
		t.Errorf("resolution rate = %v, want 1/3 (infra errors left out)", m1.ResolutionRate)
	}
	if m1.PassedOfficialTests != 2 || m1.ProbeRejected != 1 || m1.ProbeRejectionRate != 0.5 {
		t.Errorf("probe figures = %d %d %v, want 2 1 0.5", m1.PassedOfficialTests, m1.ProbeRejected, m1.ProbeRejectionRate)
	}
	if m1.Instances[1].Verdict != "not resolved (probe: state)" || m1.Instances[2].Verdict != "not resolved (tests)" {
		t.Errorf("verdicts = %+v", m1.Instances)
	}
	if s.Models[1].ProbeCategories["memory"] != 1 || s.Models[1].ProbeRejectionRate != 1 {
		t.Errorf("m2 = %+v", s.Models[1])
	}
	var buf bytes.Buffer
	if err := report.WriteTable(&buf, s); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "m1     4          1         33.3%") {
		t.Errorf("table:\n%s", buf.String())
	}
}

func TestJUnitIsReadableByAJUnitParser(t *testing.T) {
	rs := []*result.Result{res("m", "ok", "", true), res("m", "bad", result.OfficialTestsFailed, false), res("m", "infra", result.InfraError, false)}
	var buf bytes.Buffer
	if err := report.WriteJUnit(&buf, rs); err != nil {
		t.Fatal(err)
	}
	suites, err := junit.Ingest(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]junit.Status{}
	for _, s := range suites {
		for _, c := range s.Tests {
			got[s.Name] = c.Status
		}
	}
	want := map[string]junit.Status{"m/ok": junit.StatusPassed, "m/bad": junit.StatusFailed, "m/infra": junit.StatusError}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("suite %s verdict = %s, want %s", k, got[k], v)
		}
	}
}

func TestFlaky(t *testing.T) {
	run := func(outcomes ...string) *result.Result {
		p := result.Phase{Name: "tests"}
		for i, o := range outcomes {
			p.Tests = append(p.Tests, result.TestOutcome{ID: string(rune('a' + i)), Outcome: o})
		}
		return &result.Result{Phases: []result.Phase{p}}
	}
	got := report.Flaky([]*result.Result{run("passed", "passed", "failed"), run("passed", "failed", "failed"), run("passed", "passed", "failed")})
	if strings.Join(got, ",") != "b" {
		t.Errorf("Flaky() = %v, want [b]", got)
	}
	if got := report.Flaky([]*result.Result{run("passed"), run("passed")}); len(got) != 0 {
		t.Errorf("Flaky() = %v on identical runs", got)
	}
}
