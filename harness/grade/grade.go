// Package grade owns verdicts: a pure function from the raw outcome of an attempt's phases
// (exit statuses, JUnit XML, resource figures) and the task's expectations to a graded result.
// It never reads stdout; old raw results can be graded again.
package grade

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/joshdk/go-junit"

	"github.com/infradev/infradev/harness/attempt"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/pytestproto"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/tamper"
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
	// Ranks holds each rank's report, rank 0 first, when the phase ran as several rank
	// processes (tests.ranks); JUnit and ReportProblem are then unused.
	Ranks []RankReport
}

// RankReport is what one rank's report channel delivered.
type RankReport struct {
	JUnit   []byte
	Problem string
}

// Expected names the tests a phase must report and, for probes, what each one is.
type Expected struct {
	IDs []string
	// Probes maps a test id to its probe id and category (probe phases only).
	Probes map[string]ProbeInfo
	// Canaries maps each canary's node id to the outcome it must get (official tests only);
	// CanaryStyles to its assertion style.
	Canaries, CanaryStyles map[string]string
	// Sealed marks a phase whose report the submission's code could have forged: the official
	// tests. A missing or broken report, or one that reports passes for tests that were not
	// asked for, is then tampering.
	Sealed bool
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
	case raw.Run.ExitCode == pytestproto.ExitPatchDoesNotApply:
		p.Status, p.Detail = result.StatusFailed, "the patch does not apply (git apply)"
	case raw.Run.ExitCode == pytestproto.ExitSetupOverPatch:
		p.Status, p.Detail = result.StatusFailed, "the official tests could not be put in place over the patch"
	case raw.Run.ExitCode == pytestproto.ExitNotAtBase:
		p.Status, p.Detail = result.StatusError, "task repository is not at its base commit"
	case raw.Run.ExitCode == pytestproto.ExitTestsDoNotApply:
		p.Status, p.Detail = result.StatusError, "the official test patch does not apply at the base commit"
	case raw.Run.ExitCode == pytestproto.ExitGoldDoesNotApply:
		p.Status, p.Detail = result.StatusError, "the gold patch does not apply over the official tests"
	default:
		p.Status, p.Detail = result.StatusError, fmt.Sprintf("setup script exited %d", raw.Run.ExitCode)
	}
	return p
}

// TaskPhase names the phase that records a fault of the task found by its own check (the
// preflight), decided without the submission.
const TaskPhase = "task"

// TaskFault is the phase recording that the task itself is broken.
func TaskFault(detail string) result.Phase {
	return result.Phase{Name: TaskPhase, Status: result.StatusError, Detail: detail}
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
		p.Detail = "the patch is refused by the static scan: " + strings.Join(msgs, "; ")
	}
	return p
}

// Tests grades a test phase (official tests or probes) from its JUnit report. Every expected
// id must be reported as passed; an id that is not reported counts as failed ("missing").
// A report of all passes from a runner that exited non-zero is not trusted. For the official
// tests (want.Sealed), the report is checked for forgery: the canaries must get their
// outcomes, the runner must have exited as they imply, and no test may be reported passed that
// was not asked for; a report that never arrived or was tampered with is forgery too, unless
// the test process was killed by a fault signal.
func Tests(name string, raw Raw, want Expected) result.Phase {
	if len(raw.Ranks) > 0 {
		return ranks(name, raw, want)
	}
	p := phase(name, raw)
	switch {
	case raw.Run.TimedOut:
		p.Status, p.Detail = result.StatusTimeout, name+" timed out"
	case raw.Run.OOM:
		p.Status, p.Detail = result.StatusOOM, name+" ran out of memory"
	}
	got := map[string]junit.Status{}
	msgs := map[string]string{}
	var unasked []string
	if raw.JUnit != nil {
		suites, err := junit.Ingest(raw.JUnit)
		if err != nil {
			p.Detail = join(p.Detail, "JUnit report is unreadable: "+err.Error())
		}
		asked := askedKeys(want)
		for _, t := range AllTests(suites) {
			id := t.Classname + "::" + t.Name
			if t.Status == junit.StatusPassed && !asked.has(t.Classname, t.Name) {
				unasked = append(unasked, id)
			}
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
	if want.Sealed {
		if forged := forgery(raw, want, got, unasked, allPassed, &p); forged != "" {
			p.Status, p.Detail = result.StatusTampered, join(p.Detail, forged)
			return p
		}
	}
	// With canaries planted, some tests fail by design: pytest then exits 1.
	wantExit := 0
	if hasFailingCanary(want) {
		wantExit = 1
	}
	switch {
	case allPassed && raw.Run.ExitCode == wantExit:
		p.Status = result.StatusPassed
	case allPassed:
		p.Status = result.StatusFailed
		p.Detail = join(p.Detail, fmt.Sprintf("the JUnit report shows every test passed but the runner exited %d", raw.Run.ExitCode))
	default:
		p.Status = result.StatusFailed
	}
	return p
}

// faultSignals are the exits of a process killed by a fault of its own (segmentation fault,
// abort, bus error, floating-point error, illegal instruction): a crash, not a forgery.
var faultSignals = map[int]bool{128 + 4: true, 128 + 6: true, 128 + 7: true, 128 + 8: true, 128 + 11: true}

// forgery says how a sealed phase's report shows forged outcomes, or "". It records the
// canary check in p.
func forgery(raw Raw, want Expected, got map[string]junit.Status, unasked []string, allPassed bool, p *result.Phase) string {
	if raw.JUnit == nil {
		if faultSignals[raw.Run.ExitCode] {
			p.Detail = join(p.Detail, fmt.Sprintf("the test process crashed (exit %d)", raw.Run.ExitCode))
			return ""
		}
		return "the sealed test report is missing or broken"
	}
	if len(unasked) > 0 {
		sort.Strings(unasked)
		return fmt.Sprintf("the report shows %d test(s) passed that were never asked for (%s)", len(unasked), firstN(unasked, 3))
	}
	if len(want.Canaries) == 0 {
		return ""
	}
	c := &result.Canaries{Planted: len(want.Canaries)}
	p.Canaries = c
	forged := false
	ids := make([]string, 0, len(want.Canaries))
	for id := range want.Canaries {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		w := want.Canaries[id]
		st, reported := got[junitKey(id)]
		o := "missing"
		if reported {
			o = outcome(st)
		}
		if o == w {
			continue
		}
		c.Wrong = append(c.Wrong, fmt.Sprintf("%s (%s, must be %s): %s", id, want.CanaryStyles[id], w, o))
		// A must-fail canary that passed is forgery whatever else happened; other misses
		// count only when the official tests all passed (a broken module takes its canaries
		// down with its tests, honestly).
		if (w == canaryFail && o == result.StatusPassed) || allPassed {
			forged = true
		}
	}
	if forged {
		return "canaries got the wrong outcome: " + firstN(c.Wrong, 3)
	}
	if allPassed && hasFailingCanary(want) && raw.Run.ExitCode == 0 {
		return "the test runner exited 0 although canaries failed"
	}
	return ""
}

const canaryFail = result.StatusFailed

func hasFailingCanary(want Expected) bool {
	for _, w := range want.Canaries {
		if w == canaryFail {
			return true
		}
	}
	return false
}

func firstN(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:n], "; ") + fmt.Sprintf("; and %d more", len(items)-n)
}

// asked is the set of tests a phase asked for, as JUnit keys: a reported test is asked for
// when its key is, or it is a parameter case of an asked test ("test_a[1]" of "test_a").
type asked map[string]bool

func askedKeys(want Expected) asked {
	a := asked{}
	for _, id := range want.IDs {
		a[junitKey(id)] = true
	}
	for id := range want.Canaries {
		a[junitKey(id)] = true
	}
	return a
}

func (a asked) has(classname, name string) bool {
	key := classname + "::" + name
	if a[key] {
		return true
	}
	if base, _, ok := strings.Cut(name, "["); ok && a[classname+"::"+base] {
		return true
	}
	return false
}

// Budget checks a budgeted probe's outcome against gold's figures. The probe must already
// pass; base nil means no baseline was measured, which is the task's fault. measureOnly
// records the figures without judging them (used to measure gold).
func Budget(o *result.TestOutcome, run *sandbox.Result, b probe.Budget, base *probe.Figures, measureOnly bool) {
	o.PeakMemoryBytes, o.WallSeconds, o.CPUSeconds = run.PeakMemory, run.Wall.Seconds(), run.CPU.Seconds()
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
	if b.CPUFactor > 0 && base.CPUSeconds <= 0 {
		o.Outcome, o.Message = result.StatusError, "the gold baseline has no CPU time for this budget: run infradev validate --update-baseline"
		return
	}
	if b.CPUFactor > 0 && run.CPU.Seconds() > b.CPUFactor*base.CPUSeconds {
		over = append(over, fmt.Sprintf("CPU time %.2fs is %.2fx gold's %.2fs (budget %.2fx)", run.CPU.Seconds(),
			run.CPU.Seconds()/base.CPUSeconds, base.CPUSeconds, b.CPUFactor))
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
	case result.StatusTampered:
		return 2
	case result.StatusOOM:
		return 3
	case result.StatusTimeout:
		return 4
	}
	return 5
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
	case result.StatusTampered:
		return result.Tampered
	case result.StatusError:
		if p.Name == TaskPhase || (p.Name == "apply" && (p.ExitCode == pytestproto.ExitNotAtBase ||
			p.ExitCode == pytestproto.ExitTestsDoNotApply || p.ExitCode == pytestproto.ExitGoldDoesNotApply)) {
			return result.TaskError
		}
		return result.InfraError
	}
	switch p.Name {
	case "integrity":
		// A patch that reaches for the runner or hides code from the scan is refused as
		// tampering before it runs.
		return result.Tampered
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

// AllTests is every test of a JUnit report, nested suites' included, in document order.
func AllTests(suites []junit.Suite) []junit.Test {
	var out []junit.Test
	for _, s := range suites {
		out = append(out, s.Tests...)
		out = append(out, AllTests(s.Suites)...)
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

// Record writes the result of an attempt that ended in one phase the harness graded itself
// (a lease that could not be had, a job the cluster failed or timed out), labelled as in's,
// keyed by keys, graded, to out/result.json.
func Record(in attempt.Inputs, keys result.Inputs, p result.Phase, out string) (*result.Result, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	r := &result.Result{Schema: result.Schema, Inputs: keys, Project: in.Task.Project, FailToPass: len(in.Task.Tests.FailToPass),
		EmptyPatch: len(bytes.TrimSpace(in.Patch)) == 0, Phases: []result.Phase{p}, StartedAt: now, FinishedAt: now}
	r.SetIdentity(in.Identity())
	Verdict(r)
	return r, result.Write(filepath.Join(out, "result.json"), r)
}

// ranks grades a phase that ran as several rank processes: each rank's report is graded as a
// phase of its own, and a test passes only if it passed on every rank. The phase takes the
// most severe status of any rank (the run's timeout and OOM are every rank's; tampered on
// one rank is tampered), each test the worst
// outcome any rank gave it, with that rank named in its message.
func ranks(name string, raw Raw, want Expected) result.Phase {
	var out result.Phase
	for r, rep := range raw.Ranks {
		one := raw
		one.Ranks, one.JUnit, one.ReportProblem = nil, rep.JUnit, rep.Problem
		p := Tests(name, one, want)
		if p.Detail != "" {
			p.Detail = fmt.Sprintf("rank %d: %s", r, p.Detail)
		}
		if r == 0 {
			out = p
			for i := range out.Tests {
				if out.Tests[i].Outcome != result.StatusPassed {
					out.Tests[i].Message = onRank(0, out.Tests[i].Message)
				}
			}
			continue
		}
		if severity(p.Status) > severity(out.Status) {
			out.Status = p.Status
		}
		if p.Detail != "" && !strings.Contains(out.Detail, strings.SplitN(p.Detail, ": ", 2)[1]) {
			out.Detail = join(out.Detail, p.Detail)
		}
		if p.Canaries != nil && len(p.Canaries.Wrong) > 0 && (out.Canaries == nil || len(out.Canaries.Wrong) == 0) {
			out.Canaries = p.Canaries
		}
		for i, t := range p.Tests {
			if WorseOutcome(t.Outcome, out.Tests[i].Outcome) != out.Tests[i].Outcome {
				out.Tests[i].Outcome, out.Tests[i].Message = t.Outcome, onRank(r, t.Message)
			}
		}
	}
	return out
}

// outcomeRank orders test outcomes, best first.
var outcomeRank = map[string]int{result.StatusPassed: 0, result.StatusSkipped: 1, result.StatusFailed: 2, result.StatusError: 3, "missing": 4}

// WorseOutcome is the worse of two test outcomes (passed, skipped, failed, error, missing):
// a test run on several ranks is as good as its worst rank.
func WorseOutcome(a, b string) string {
	if outcomeRank[a] > outcomeRank[b] {
		return a
	}
	return b
}

func onRank(r int, msg string) string {
	if msg == "" {
		return fmt.Sprintf("rank %d", r)
	}
	return fmt.Sprintf("rank %d: %s", r, msg)
}
