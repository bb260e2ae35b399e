package grade_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/infradev/infradev/harness/grade"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/pytestproto"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/tamper"
)

func junit(cases ...string) []byte {
	return []byte(`<?xml version="1.0"?><testsuites><testsuite name="pytest">` + strings.Join(cases, "") + `</testsuite></testsuites>`)
}

const (
	passA  = `<testcase classname="tests.test_a" name="test_one"/>`
	passB  = `<testcase classname="tests.test_a.TestK" name="test_two[1]"/>`
	failB  = `<testcase classname="tests.test_a.TestK" name="test_two[1]"><failure message="assert 1 == 2">trace</failure></testcase>`
	skipB  = `<testcase classname="tests.test_a.TestK" name="test_two[1]"><skipped message="no"/></testcase>`
	errorB = `<testcase classname="tests.test_a.TestK" name="test_two[1]"><error message="boom"/></testcase>`
)

var ids = []string{"tests/test_a.py::test_one", "tests/test_a.py::TestK::test_two[1]"}

func TestTests(t *testing.T) {
	cases := []struct {
		name     string
		run      sandbox.Result
		xml      []byte
		status   string
		outcomes []string
	}{
		{"all pass", sandbox.Result{}, junit(passA, passB), result.StatusPassed, []string{"passed", "passed"}},
		{"one fails", sandbox.Result{ExitCode: 1}, junit(passA, failB), result.StatusFailed, []string{"passed", "failed"}},
		{"skipped is not passed", sandbox.Result{}, junit(passA, skipB), result.StatusFailed, []string{"passed", "skipped"}},
		{"error", sandbox.Result{ExitCode: 1}, junit(passA, errorB), result.StatusFailed, []string{"passed", "error"}},
		{"missing test", sandbox.Result{}, junit(passA), result.StatusFailed, []string{"passed", "missing"}},
		{"duplicate pass cannot hide a failure", sandbox.Result{ExitCode: 1}, junit(passA, failB, passB), result.StatusFailed, []string{"passed", "failed"}},
		{"all pass but runner failed", sandbox.Result{ExitCode: 1}, junit(passA, passB), result.StatusFailed, []string{"passed", "passed"}},
		{"unsealed: a pass for a test not asked for is ignored", sandbox.Result{}, junit(passA, passB, `<testcase classname="x" name="y"/>`), result.StatusPassed, []string{"passed", "passed"}},
		{"no report", sandbox.Result{ExitCode: 2}, nil, result.StatusFailed, []string{"missing", "missing"}},
		{"garbage report", sandbox.Result{}, []byte("PASSED PASSED"), result.StatusFailed, []string{"missing", "missing"}},
		{"timeout", sandbox.Result{TimedOut: true, ExitCode: 137}, nil, result.StatusTimeout, []string{"missing", "missing"}},
		{"oom", sandbox.Result{OOM: true, ExitCode: 137}, junit(passA), result.StatusOOM, []string{"passed", "missing"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := c.run
			p := grade.Tests("tests", grade.Raw{Run: &run, JUnit: c.xml}, grade.Expected{IDs: ids})
			if p.Status != c.status {
				t.Errorf("status = %s, want %s (detail %q)", p.Status, c.status, p.Detail)
			}
			var got []string
			for _, o := range p.Tests {
				got = append(got, o.Outcome)
			}
			if diff := cmp.Diff(c.outcomes, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestVerdict(t *testing.T) {
	ok := result.Phase{Name: "apply", Status: result.StatusPassed}
	cases := []struct {
		name   string
		phases []result.Phase
		class  string
		cats   []string
	}{
		{"resolved", []result.Phase{ok, {Name: "tests", Status: "passed"}, {Name: "probes", Status: "passed"}}, "", nil},
		{"patch", []result.Phase{{Name: "apply", Status: "failed", ExitCode: pytestproto.ExitPatchDoesNotApply}}, result.PatchApplyFailed, nil},
		{"tests", []result.Phase{ok, {Name: "tests", Status: "failed"}, {Name: "probes", Status: "failed"}}, result.OfficialTestsFailed, nil},
		{"probes", []result.Phase{ok, {Name: "tests", Status: "passed"}, {Name: "probes", Status: "failed", Tests: []result.TestOutcome{
			{ID: "a", Outcome: "failed", Category: "state"}, {ID: "b", Outcome: "passed", Category: "memory"}, {ID: "c", Outcome: "missing", Category: "traffic"}}}},
			result.ProbesFailed, []string{"state", "traffic"}},
		{"timeout", []result.Phase{ok, {Name: "tests", Status: "timeout"}}, result.Timeout, nil},
		{"oom", []result.Phase{ok, {Name: "tests", Status: "oom"}}, result.OOM, nil},
		{"infra", []result.Phase{{Name: "infra", Status: "error"}}, result.InfraError, nil},
		{"task", []result.Phase{{Name: "apply", Status: "error", ExitCode: pytestproto.ExitNotAtBase}}, result.TaskError, nil},
		{"nothing ran", nil, result.InfraError, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &result.Result{Phases: c.phases}
			grade.Verdict(r)
			if r.FailureClass != c.class || r.Resolved != (c.class == "") {
				t.Errorf("class = %q resolved = %v, want %q", r.FailureClass, r.Resolved, c.class)
			}
			if diff := cmp.Diff(c.cats, r.FailedProbeCategories); diff != "" {
				t.Errorf("categories (-want +got):\n%s", diff)
			}
		})
	}
}

func TestApplyClassifiesSetupExits(t *testing.T) {
	for code, want := range map[int]string{0: "passed", pytestproto.ExitPatchDoesNotApply: "failed", pytestproto.ExitNotAtBase: "error", 1: "error"} {
		p := grade.Apply(grade.Raw{Run: &sandbox.Result{ExitCode: code}})
		if p.Status != want {
			t.Errorf("Apply(exit %d) = %s, want %s", code, p.Status, want)
		}
	}
}

func TestBudget(t *testing.T) {
	base := &probe.Figures{PeakMemoryBytes: 100 << 20, WallSeconds: 2}
	b := probe.Budget{PeakMemoryFactor: 1.3, WallFactor: 2}
	cases := []struct {
		name    string
		outcome string
		run     sandbox.Result
		base    *probe.Figures
		measure bool
		want    string
	}{
		{"within", "passed", sandbox.Result{PeakMemory: 120 << 20, Wall: 3 * time.Second}, base, false, "passed"},
		{"double memory", "passed", sandbox.Result{PeakMemory: 200 << 20, Wall: time.Second}, base, false, "over_budget"},
		{"too slow", "passed", sandbox.Result{PeakMemory: 50 << 20, Wall: 5 * time.Second}, base, false, "over_budget"},
		{"failed stays failed", "failed", sandbox.Result{PeakMemory: 500 << 20}, base, false, "failed"},
		{"no baseline is the task's fault", "passed", sandbox.Result{PeakMemory: 1}, nil, false, "error"},
		{"measuring gold judges nothing", "passed", sandbox.Result{PeakMemory: 500 << 20}, nil, true, "passed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := result.TestOutcome{Outcome: c.outcome}
			run := c.run
			grade.Budget(&o, &run, b, c.base, c.measure)
			if o.Outcome != c.want {
				t.Errorf("outcome %q (%s), want %q", o.Outcome, o.Message, c.want)
			}
			if o.PeakMemoryBytes != c.run.PeakMemory {
				t.Errorf("figures not recorded: %d", o.PeakMemoryBytes)
			}
		})
	}
	o := result.TestOutcome{Outcome: "passed"}
	grade.Budget(&o, &sandbox.Result{PeakMemory: 200 << 20}, b, base, false)
	if !strings.Contains(o.Message, "peak memory 200.0MiB is 2.00x gold's 100.0MiB (budget 1.30x)") {
		t.Errorf("message %q", o.Message)
	}
}

func TestMergeKeepsTheWorse(t *testing.T) {
	into := result.Phase{Name: "probes", Status: "passed", WallSeconds: 1, PeakMemoryBytes: 10}
	grade.Merge(&into, result.Phase{Status: "passed", WallSeconds: 2, PeakMemoryBytes: 30,
		Tests: []result.TestOutcome{{ID: "x", Outcome: result.OverBudget, Category: "memory"}}})
	if into.Status != "failed" || into.WallSeconds != 3 || into.PeakMemoryBytes != 30 || len(into.Tests) != 1 {
		t.Errorf("merged = %+v", into)
	}
	grade.Merge(&into, result.Phase{Status: "timeout"})
	if into.Status != "timeout" {
		t.Errorf("status %q after a timed-out probe run, want timeout", into.Status)
	}
}

// TestSealedTestsDetectForgery grades the official tests' report with canaries planted:
// one must pass (test_c1), one must fail (test_c2).
func TestSealedTestsDetectForgery(t *testing.T) {
	canaries := map[string]string{"tests/test_a.py::test_c1": "passed", "tests/test_a.py::test_c2": "failed"}
	styles := map[string]string{"tests/test_a.py::test_c1": "assert", "tests/test_a.py::test_c2": "unittest"}
	c1ok := `<testcase classname="tests.test_a" name="test_c1"/>`
	c1bad := `<testcase classname="tests.test_a" name="test_c1"><failure message="x"/></testcase>`
	c2ok := `<testcase classname="tests.test_a" name="test_c2"><failure message="assert 1 == 2"/></testcase>`
	c2bad := `<testcase classname="tests.test_a" name="test_c2"/>`
	extra := `<testcase classname="tests.test_z" name="test_never_run"/>`
	extraFailed := `<testcase classname="" name="tests.test_z"><error message="collection failure"/></testcase>`
	cases := []struct {
		name    string
		run     sandbox.Result
		xml     []byte
		problem string
		status  string
	}{
		{"honest pass", sandbox.Result{ExitCode: 1}, junit(passA, passB, c1ok, c2ok), "", result.StatusPassed},
		{"honest failure", sandbox.Result{ExitCode: 1}, junit(passA, failB, c1ok, c2ok), "", result.StatusFailed},
		{"must-fail canary passed", sandbox.Result{ExitCode: 0}, junit(passA, passB, c1ok, c2bad), "", result.StatusTampered},
		{"must-fail canary passed while an official test failed", sandbox.Result{ExitCode: 1}, junit(passA, failB, c1ok, c2bad), "", result.StatusTampered},
		{"canaries missing from an all-pass report", sandbox.Result{ExitCode: 0}, junit(passA, passB), "", result.StatusTampered},
		{"must-pass canary failed in an all-pass report", sandbox.Result{ExitCode: 1}, junit(passA, passB, c1bad, c2ok), "", result.StatusTampered},
		{"canaries lost with a broken module are honest", sandbox.Result{ExitCode: 2}, junit(passA), "", result.StatusFailed},
		{"exit 0 though a canary failed", sandbox.Result{ExitCode: 0}, junit(passA, passB, c1ok, c2ok), "", result.StatusTampered},
		{"a pass for a test never asked for", sandbox.Result{ExitCode: 1}, junit(passA, passB, c1ok, c2ok, extra), "", result.StatusTampered},
		{"an error for something not asked for is not", sandbox.Result{ExitCode: 1}, junit(passA, passB, c1ok, c2ok, extraFailed), "", result.StatusPassed},
		{"no report", sandbox.Result{ExitCode: 0}, nil, "the report does not end with the harness's trailer", result.StatusTampered},
		{"crash without a report", sandbox.Result{ExitCode: 139}, nil, "no report was sent", result.StatusFailed},
		{"timeout without a report", sandbox.Result{ExitCode: 137, TimedOut: true}, nil, "", result.StatusTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := c.run
			p := grade.Tests("tests", grade.Raw{Run: &run, JUnit: c.xml, ReportProblem: c.problem},
				grade.Expected{IDs: ids, Canaries: canaries, CanaryStyles: styles, Sealed: true})
			if p.Status != c.status {
				t.Errorf("status = %s, want %s (detail %q)", p.Status, c.status, p.Detail)
			}
		})
	}
	r := &result.Result{Phases: []result.Phase{{Name: "apply", Status: "passed"}, {Name: "tests", Status: result.StatusTampered}}}
	grade.Verdict(r)
	if r.FailureClass != result.Tampered || !result.IsSubmissionFailure(r.FailureClass) {
		t.Errorf("class %q: tampering must be its own class and count against the submission", r.FailureClass)
	}
}

func TestTaskFaultsAreDecidedWithoutTheSubmission(t *testing.T) {
	cases := map[string]result.Phase{
		result.TaskError:        grade.TaskFault("probes/test_x.py:3: syntax error"),
		result.PatchApplyFailed: grade.Apply(grade.Raw{Run: &sandbox.Result{ExitCode: pytestproto.ExitSetupOverPatch}}),
		result.Tampered:         grade.Integrity([]tamper.Finding{{File: "a\nb.py", Reason: "the path has control characters"}}),
	}
	for want, p := range cases {
		r := &result.Result{Phases: []result.Phase{p}}
		grade.Verdict(r)
		if r.FailureClass != want {
			t.Errorf("phase %s/%s: class %q, want %q", p.Name, p.Status, r.FailureClass, want)
		}
	}
}

// TestRanks: a phase run as several rank processes passes only if every rank's report shows
// every test passed; a test takes its worst rank's outcome, naming the rank; a forged or
// missing report on any one rank is tampering.
func TestRanks(t *testing.T) {
	canaries := map[string]string{"tests/test_a.py::test_c2": "failed"}
	styles := map[string]string{"tests/test_a.py::test_c2": "unittest"}
	c2ok := `<testcase classname="tests.test_a" name="test_c2"><failure message="assert 1 == 2"/></testcase>`
	c2bad := `<testcase classname="tests.test_a" name="test_c2"/>`
	rep := func(xml []byte) grade.RankReport { return grade.RankReport{JUnit: xml} }
	cases := []struct {
		name     string
		ranks    []grade.RankReport
		status   string
		outcomes []string
		message  string
	}{
		{"every rank passed", []grade.RankReport{rep(junit(passA, passB, c2ok)), rep(junit(passA, passB, c2ok))}, result.StatusPassed, []string{"passed", "passed"}, ""},
		{"one rank failed a test", []grade.RankReport{rep(junit(passA, passB, c2ok)), rep(junit(passA, failB, c2ok))}, result.StatusFailed, []string{"passed", "failed"}, "rank 1: assert 1 == 2"},
		{"one rank skipped, another errored", []grade.RankReport{rep(junit(passA, skipB, c2ok)), rep(junit(passA, errorB, c2ok)), rep(junit(passA, passB, c2ok))}, result.StatusFailed, []string{"passed", "error"}, "rank 1: boom"},
		{"a test one rank never reported", []grade.RankReport{rep(junit(passA, passB, c2ok)), rep(junit(passA, c2ok))}, result.StatusFailed, []string{"passed", "missing"}, "rank 1"},
		{"a forged canary on one rank", []grade.RankReport{rep(junit(passA, passB, c2ok)), rep(junit(passA, passB, c2bad))}, result.StatusTampered, []string{"passed", "passed"}, ""},
		{"one rank's report did not arrive", []grade.RankReport{rep(junit(passA, passB, c2ok)), {Problem: "the report does not end with the harness's trailer"}}, result.StatusTampered, []string{"missing", "missing"}, "rank 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run := sandbox.Result{ExitCode: 1}
			p := grade.Tests("tests", grade.Raw{Run: &run, Ranks: c.ranks},
				grade.Expected{IDs: ids, Canaries: canaries, CanaryStyles: styles, Sealed: true})
			if p.Status != c.status {
				t.Errorf("status = %s, want %s (detail %q)", p.Status, c.status, p.Detail)
			}
			var got []string
			for _, o := range p.Tests {
				got = append(got, o.Outcome)
			}
			if diff := cmp.Diff(c.outcomes, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			if c.message != "" && p.Tests[1].Message != c.message {
				t.Errorf("message = %q, want %q", p.Tests[1].Message, c.message)
			}
			if c.status == result.StatusTampered && !strings.Contains(p.Detail, "rank 1: ") {
				t.Errorf("detail %q does not name the rank", p.Detail)
			}
		})
	}
}
