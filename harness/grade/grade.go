// Package grade owns verdicts: a pure function from the raw outcome of an attempt's phases
// (exit statuses, JUnit XML, resource figures) and the task's expectations to a graded result.
// It never reads stdout; old raw results can be graded again.
package grade

import (
	"fmt"
	"sort"
	"strings"

	"github.com/joshdk/go-junit"

	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/tamper"
)

// Exit codes of the harness's own setup scripts inside the sandbox.
const (
	ExitPatchDoesNotApply = 20 // git apply refused the submission
	ExitNotAtBase         = 30 // the task repository is not at its base commit
	ExitTestsDoNotApply   = 32 // the official test patch does not apply after reset
)

// Raw is what one phase produced.
type Raw struct {
	Run *sandbox.Result
	// JUnit is the report the test runner wrote; nil when it wrote none.
	JUnit []byte
	// ReportProblem says why no trustworthy report arrived, when one did not.
	ReportProblem string
	Log           string
	// GPUPeakMemory is the peak GPU memory the phase used above idle (0 without GPUs).
	GPUPeakMemory uint64
}

// Expected names the tests a phase must report and, for probes, what each one is.
type Expected struct {
	IDs []string
	// Probes maps a test id to its probe id and category (probe phases only).
	Probes map[string]ProbeInfo
}

// ProbeInfo describes the probe behind a test id.
type ProbeInfo struct{ ID, Category string }

// Apply grades the phase that applies the submission (and puts the official tests in place).
func Apply(raw Raw) result.Phase {
	p := phase("apply", raw)
	switch {
	case raw.Run.TimedOut:
		p.Status, p.Detail = result.StatusTimeout, "applying the patch timed out"
	case raw.Run.ExitCode == 0:
		p.Status = result.StatusPassed
	case raw.Run.ExitCode == ExitPatchDoesNotApply:
		p.Status, p.Detail = result.StatusFailed, "the patch does not apply (git apply)"
	case raw.Run.ExitCode == ExitNotAtBase:
		p.Status, p.Detail = result.StatusError, "task repository is not at its base commit"
	case raw.Run.ExitCode == ExitTestsDoNotApply:
		p.Status, p.Detail = result.StatusError, "the official test patch does not apply at the base commit"
	default:
		p.Status, p.Detail = result.StatusError, fmt.Sprintf("setup script exited %d", raw.Run.ExitCode)
	}
	return p
}

// Integrity grades the static checks of a submission: any finding fails it.
func Integrity(findings []tamper.Finding) result.Phase {
	p := result.Phase{Name: "integrity", Status: result.StatusPassed}
	if len(findings) > 0 {
		var msgs []string
		for _, f := range findings {
			msgs = append(msgs, f.String())
		}
		p.Status = result.StatusFailed
		p.Detail = "the patch tampers with the test runner: " + strings.Join(msgs, "; ")
	}
	return p
}

// Tests grades a test phase (official tests or probes) from its JUnit report. Every expected
// id must be reported as passed; an id that is not reported counts as failed ("missing").
// A report of all passes from a runner that exited non-zero is not trusted.
func Tests(name string, raw Raw, want Expected) result.Phase {
	p := phase(name, raw)
	switch {
	case raw.Run.TimedOut:
		p.Status, p.Detail = result.StatusTimeout, name+" timed out"
	case raw.Run.OOM:
		p.Status, p.Detail = result.StatusOOM, name+" ran out of memory"
	}
	got := map[string]junit.Status{}
	msgs := map[string]string{}
	if raw.JUnit != nil {
		suites, err := junit.Ingest(raw.JUnit)
		if err != nil {
			p.Detail = join(p.Detail, "JUnit report is unreadable: "+err.Error())
		}
		for _, t := range allTests(suites) {
			id := t.Classname + "::" + t.Name
			// Any non-pass for an id wins over a pass: a duplicated pass cannot hide a failure.
			if prev, seen := got[id]; !seen || prev == junit.StatusPassed {
				got[id] = t.Status
				msgs[id] = firstLine(t.Message)
			}
		}
	} else if p.Status == "" {
		problem := raw.ReportProblem
		if problem == "" {
			problem = "the test runner wrote no JUnit report"
		}
		p.Detail = join(p.Detail, "no trustworthy test report: "+problem)
	}
	allPassed := true
	for _, id := range want.IDs {
		o := result.TestOutcome{ID: id, Outcome: "missing"}
		if st, ok := got[junitKey(id)]; ok {
			o.Outcome, o.Message = outcome(st), msgs[junitKey(id)]
		}
		if pi, ok := want.Probes[id]; ok {
			o.Probe, o.Category = pi.ID, pi.Category
		}
		if o.Outcome != result.StatusPassed {
			allPassed = false
		}
		p.Tests = append(p.Tests, o)
	}
	if p.Status != "" {
		return p
	}
	switch {
	case allPassed && raw.Run.ExitCode == 0:
		p.Status = result.StatusPassed
	case allPassed:
		p.Status = result.StatusFailed
		p.Detail = join(p.Detail, fmt.Sprintf("the JUnit report shows every test passed but the runner exited %d", raw.Run.ExitCode))
	default:
		p.Status = result.StatusFailed
	}
	return p
}

// Budget checks a budgeted probe's outcome against gold's figures. The probe must already
// pass; base nil means no baseline was measured, which is the task's fault. measureOnly
// records the figures without judging them (used to measure gold).
func Budget(o *result.TestOutcome, run *sandbox.Result, b probe.Budget, base *probe.Figures, measureOnly bool) {
	o.PeakMemoryBytes, o.WallSeconds = run.PeakMemory, run.Wall.Seconds()
	if o.Outcome != result.StatusPassed || measureOnly {
		return
	}
	if base == nil {
		o.Outcome, o.Message = result.StatusError, "no gold baseline for this budget: run infradev validate"
		return
	}
	var over []string
	if b.PeakMemoryFactor > 0 && float64(run.PeakMemory) > b.PeakMemoryFactor*float64(base.PeakMemoryBytes) {
		over = append(over, fmt.Sprintf("peak memory %s is %.2fx gold's %s (budget %.2fx)", mib(run.PeakMemory),
			float64(run.PeakMemory)/float64(base.PeakMemoryBytes), mib(base.PeakMemoryBytes), b.PeakMemoryFactor))
	}
	if b.WallFactor > 0 && run.Wall.Seconds() > b.WallFactor*base.WallSeconds {
		over = append(over, fmt.Sprintf("wall time %.2fs is %.2fx gold's %.2fs (budget %.2fx)", run.Wall.Seconds(),
			run.Wall.Seconds()/base.WallSeconds, base.WallSeconds, b.WallFactor))
	}
	if len(over) > 0 {
		o.Outcome, o.Message = result.OverBudget, strings.Join(over, "; ")
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

// Merge folds the phase of one probe's own run into the probes phase: tests appended, times
// added, peak memory the larger, and the worse status kept.
func Merge(into *result.Phase, p result.Phase) {
	into.Tests = append(into.Tests, p.Tests...)
	into.WallSeconds += p.WallSeconds
	into.CPUSeconds += p.CPUSeconds
	into.PeakMemoryBytes = max(into.PeakMemoryBytes, p.PeakMemoryBytes)
	into.GPUPeakMemory = max(into.GPUPeakMemory, p.GPUPeakMemory)
	into.Detail = join(into.Detail, p.Detail)
	for _, t := range p.Tests {
		if t.Outcome != result.StatusPassed && p.Status == result.StatusPassed {
			p.Status = result.StatusFailed
		}
	}
	if severity(p.Status) > severity(into.Status) {
		into.Status, into.ExitCode = p.Status, p.ExitCode
	}
}

func severity(status string) int {
	switch status {
	case result.StatusPassed:
		return 0
	case result.StatusFailed:
		return 1
	case result.StatusOOM:
		return 2
	case result.StatusTimeout:
		return 3
	}
	return 4
}

// Verdict fills r's verdict from its phases: resolved only if every phase passed. The failure
// class is that of the first phase that did not pass.
func Verdict(r *result.Result) {
	r.Resolved, r.FailureClass, r.Reason, r.FailedProbeCategories = false, "", "", nil
	for _, p := range r.Phases {
		if p.Status == result.StatusPassed {
			continue
		}
		r.FailureClass, r.Reason = classify(p), reason(p)
		if p.Name == "probes" {
			r.FailedProbeCategories = failedCategories(p)
		}
		return
	}
	if len(r.Phases) == 0 {
		r.FailureClass, r.Reason = result.InfraError, "no phase ran"
		return
	}
	r.Resolved = true
}

func classify(p result.Phase) string {
	switch p.Status {
	case result.StatusTimeout:
		return result.Timeout
	case result.StatusOOM:
		return result.OOM
	case result.StatusError:
		if p.ExitCode == ExitNotAtBase || p.ExitCode == ExitTestsDoNotApply {
			return result.TaskError
		}
		return result.InfraError
	}
	switch p.Name {
	case "integrity":
		// The official tests' outcome cannot be trusted for such a patch.
		return result.OfficialTestsFailed
	case "apply":
		return result.PatchApplyFailed
	case "tests":
		return result.OfficialTestsFailed
	case "probes":
		return result.ProbesFailed
	}
	return result.InfraError
}

func reason(p result.Phase) string {
	var failed []string
	for _, t := range p.Tests {
		if t.Outcome != result.StatusPassed {
			id := t.ID
			if t.Probe != "" {
				id = fmt.Sprintf("%s (%s)", t.Probe, t.Category)
			}
			entry := id + ": " + t.Outcome
			if t.Outcome == result.OverBudget {
				entry += " (" + t.Message + ")"
			}
			failed = append(failed, entry)
		}
	}
	parts := []string{}
	if p.Detail != "" {
		parts = append(parts, p.Detail)
	}
	if len(failed) > 0 {
		parts = append(parts, strings.Join(failed, "; "))
	}
	if len(parts) == 0 {
		return p.Name + " " + p.Status
	}
	return p.Name + ": " + strings.Join(parts, "; ")
}

func failedCategories(p result.Phase) []string {
	set := map[string]bool{}
	for _, t := range p.Tests {
		if t.Outcome != result.StatusPassed && t.Category != "" {
			set[t.Category] = true
		}
	}
	var out []string
	for c := range set {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

func phase(name string, raw Raw) result.Phase {
	return result.Phase{
		Name:            name,
		ExitCode:        raw.Run.ExitCode,
		WallSeconds:     raw.Run.Wall.Seconds(),
		CPUSeconds:      raw.Run.CPU.Seconds(),
		PeakMemoryBytes: raw.Run.PeakMemory,
		GPUPeakMemory:   int64(raw.GPUPeakMemory),
		Log:             raw.Log,
	}
}

// junitKey maps a pytest node id to the classname::name pair pytest's JUnit report uses:
// "tests/unit/test_x.py::TestA::test_b[1]" -> "tests.unit.test_x.TestA::test_b[1]".
func junitKey(id string) string {
	parts := strings.Split(id, "::")
	mod := strings.ReplaceAll(strings.TrimSuffix(parts[0], ".py"), "/", ".")
	class := append([]string{mod}, parts[1:len(parts)-1]...)
	return strings.Join(class, ".") + "::" + parts[len(parts)-1]
}

func allTests(suites []junit.Suite) []junit.Test {
	var out []junit.Test
	for _, s := range suites {
		out = append(out, s.Tests...)
		out = append(out, allTests(s.Suites)...)
	}
	return out
}

func outcome(s junit.Status) string {
	switch s {
	case junit.StatusPassed:
		return result.StatusPassed
	case junit.StatusSkipped:
		return result.StatusSkipped
	case junit.StatusError:
		return result.StatusError
	}
	return result.StatusFailed
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
