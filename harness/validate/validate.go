// Package validate owns checking a task end to end before anyone is scored on it: the task's
// own check (repository at base, test patch, canaries, probes that judge out of process),
// gold resolving every time, the base failing every fail-to-pass test and passing every
// pass-to-pass one, every sample getting the verdict it was built for, and the tamper check:
// every sample, and the empty patch, run again with a universal in-process cheat added, and
// the verdict must stay a rejection, with the probes alone rejecting the empty patch.
package validate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/cheat"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/samples"
	"github.com/infradev/infradev/harness/task"
)

// Runner is what validation runs attempts with: a runner that can also check a task alone.
type Runner interface {
	runner.Attempter
	CheckTask(ctx context.Context, in runner.Inputs) (string, error)
}

// Options tune a validation.
type Options struct {
	// Runs is how many times gold must resolve. Default 3.
	Runs int
	// Out is where the attempts' run folders go (Out/<task>/<name>).
	Out string
	// Tamper runs the tamper check (default on through the CLI).
	Tamper bool
	// OnGold composes samples written on the gold tree (upstream tasks); nil otherwise.
	OnGold samples.OnGold
	// Baseline is called with gold's results when the task has budgeted probes, to write or
	// keep the baseline; it returns what it did and the probes to judge budgets with.
	Baseline func(golds []*result.Result) (string, *probe.Set, error)
	// GPUs is how many GPUs validation may give an attempt. A task needing more gets only
	// the checks that need none (the task check: base commit, test patch and gold apply,
	// official test files and probes import and are collected on CPU) and is reported
	// Pending.
	GPUs int
	// GoldOnly stops after the task check and gold's runs (budgets included) for a task that
	// needs no GPU: its record then says cpu-pending, a first step after its probes changed.
	GoldOnly bool
}

// Report is one task's validation.
type Report struct {
	Task string
	// Fault is the task check's finding; when set nothing else ran.
	Fault string
	// Pending: the task needs more GPUs than validation had; only the task check ran (and
	// passed, unless Fault is set).
	Pending bool
	// GoldOnly: only the task check and gold's runs ran (Options.GoldOnly).
	GoldOnly     bool
	GoldResolved int
	GoldRuns     int
	Empty        string // the empty patch's failure class
	SamplesOK    int
	Samples      int
	TamperRuns   int
	TamperOK     int
	// Forgeries counts the forgery runs (gold's children replayed, mixed, NaN) and ForgeriesOK
	// those every probe withstood.
	Forgeries     int
	ForgeriesOK   int
	BaselineNote  string
	Problems      []string
	WallSeconds   float64
	AttemptsCount int
}

// OK reports whether every check passed.
func (r *Report) OK() bool { return r.Fault == "" && len(r.Problems) == 0 }

// Task validates one task. in carries the task, probes and environment; its Patch is ignored.
// An error is an infrastructure fault (an attempt that could not run).
func Task(ctx context.Context, rn Runner, in runner.Inputs, ss *samples.Set, gold []byte, o Options) (*Report, error) {
	start := time.Now()
	if o.Runs == 0 {
		o.Runs = 3
	}
	t := in.Task
	rep := &Report{Task: t.ID, GoldRuns: o.Runs}
	defer func() { rep.WallSeconds = time.Since(start).Seconds() }()
	fault, err := rn.CheckTask(ctx, in)
	if err != nil {
		return nil, err
	}
	if fault != "" {
		rep.Fault = fault
		return rep, nil
	}
	if t.Resources.GPUs.Count > o.GPUs {
		rep.Pending, rep.GoldRuns = true, 0
		return rep, nil
	}
	run := func(name string, patch []byte, mod func(*runner.Inputs)) (*result.Result, error) {
		a := in
		a.Patch, a.Model = patch, name
		// Validation is for the task's authors: the probes' logs and the children's output stay.
		a.Probe.Authors = true
		if mod != nil {
			mod(&a)
		}
		rep.AttemptsCount++
		return rn.Run(ctx, a, filepath.Join(o.Out, t.ID, name))
	}
	problem := func(format string, args ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...)) }

	var golds []*result.Result
	for i := 0; i < o.Runs; i++ {
		res, err := run(fmt.Sprintf("gold-%d", i+1), gold, func(a *runner.Inputs) {
			a.MeasureBudgets = true
			a.Probe.Record = i == 0 // what gold's children send, for the forgery check
		})
		if err != nil {
			return nil, err
		}
		golds = append(golds, res)
		if res.Resolved {
			rep.GoldResolved++
		} else {
			problem("gold run %d: %s", i+1, res.Reason)
		}
	}
	if flaky := report.Flaky(golds); len(flaky) > 0 {
		problem("flaky across gold runs: %s", strings.Join(flaky, ", "))
	}
	if len(in.Probes.Budgeted()) > 0 && rep.GoldResolved == o.Runs && o.Baseline != nil {
		note, ps, err := o.Baseline(golds)
		if err != nil {
			return nil, err
		}
		rep.BaselineNote, in.Probes = note, ps
		judged, err := run("gold-budgets", gold, nil)
		if err != nil {
			return nil, err
		}
		if !judged.Resolved {
			problem("gold fails its own budgets: %s", judged.Reason)
		}
	}

	if o.GoldOnly && t.Resources.GPUs.Count == 0 {
		rep.GoldOnly = true
		return rep, nil
	}

	// The base: every fail-to-pass test fails there and every pass-to-pass test passes.
	empty, err := run("empty", nil, nil)
	if err != nil {
		return nil, err
	}
	rep.Empty = empty.FailureClass
	if empty.FailureClass != result.OfficialTestsFailed {
		problem("the empty patch must fail the official tests, got %q (%s)", empty.FailureClass, empty.Reason)
	} else if tp := empty.Phase("tests"); tp != nil {
		for i, o := range tp.Tests {
			switch {
			case i < empty.FailToPass && o.Outcome == result.StatusPassed:
				problem("fail-to-pass %s passes at the base", o.ID)
			case i >= empty.FailToPass && o.Outcome != result.StatusPassed:
				problem("pass-to-pass %s does not pass at the base: %s", o.ID, o.Outcome)
			}
		}
	}

	var samplesList []samples.Sample
	if ss != nil {
		samplesList = ss.Samples
	}
	rep.Samples = len(samplesList)
	patches := map[string][]byte{}
	for _, sm := range samplesList {
		patch, err := ss.Read(sm, o.OnGold)
		if err != nil {
			return nil, err
		}
		patches[sm.Name] = patch
		res, err := run("sample-"+sm.Name, patch, nil)
		if err != nil {
			return nil, err
		}
		if msg := sm.Check(res); msg != "" {
			problem("sample %s", msg)
		} else {
			rep.SamplesOK++
		}
	}

	if o.Tamper {
		if err := tamperCheck(rep, run, samplesList, patches, problem); err != nil {
			return nil, err
		}
		if len(golds) > 0 && golds[0].Resolved {
			recording := filepath.Join(o.Out, t.ID, "gold-1", "raw", "probe-record")
			if err := forgeryCheck(rep, run, in.Probes, recording, samplesList, patches, problem); err != nil {
				return nil, err
			}
		}
	}
	return rep, nil
}

// forgeryCheck runs the probes with their children forging from gold's recording: gold's
// messages replayed verbatim (every probe must fail: nothing of this attempt's inputs is in
// them), and the code under test's own values with gold's scalars, and every float NaN, over
// the empty patch (every probe the empty patch fails must still fail) and, mixing, over every
// sample built to fail probes (its failing probes must still fail). A probe that passes so
// decides from what the child reports; it is refused with its file and line.
func forgeryCheck(rep *Report, run func(string, []byte, func(*runner.Inputs)) (*result.Result, error),
	ps *probe.Set, recording string, list []samples.Sample, patches map[string][]byte, problem func(string, ...any)) error {
	// What the empty patch's probes say unforged: a probe the base passes (a behaviour the
	// change must keep) passes a forgery built on the base's own values too.
	plain, err := run("empty+probes", nil, func(a *runner.Inputs) { a.Probe.Only = true })
	if err != nil {
		return err
	}
	var baseFails []string
	if p := plain.Phase("probes"); p != nil {
		for _, o := range p.Tests {
			if o.Outcome != result.StatusPassed {
				baseFails = append(baseFails, o.Probe)
			}
		}
	} else {
		problem("the empty patch did not reach its probes: %s", plain.Reason)
		return nil
	}
	type job struct {
		name, forge string
		patch       []byte
		all         bool     // every probe must fail
		mustFail    []string // else these probe ids must fail
	}
	jobs := []job{{"empty", "replay", nil, true, nil}, {"empty", "mix", nil, false, baseFails}, {"empty", "nan", nil, false, baseFails}}
	for _, sm := range list {
		if sm.Want == result.ProbesFailed {
			jobs = append(jobs, job{"sample-" + sm.Name, "mix", patches[sm.Name], false, sm.FailingProbes})
		}
	}
	for _, j := range jobs {
		res, err := run(j.name+"+forge-"+j.forge, j.patch, func(a *runner.Inputs) {
			a.Probe.Forge, a.Probe.Recorded, a.Probe.Only = j.forge, recording, true
		})
		if err != nil {
			return err
		}
		rep.Forgeries++
		if res.FailureClass == result.TaskError || res.FailureClass == result.InfraError {
			problem("%s with the %s forgery: %s: %s", j.name, j.forge, res.FailureClass, res.Reason)
			continue
		}
		p := res.Phase("probes")
		if p == nil {
			// Refused before the probes ran (the scan, a patch that does not apply): nothing
			// was forged, nothing to learn.
			rep.ForgeriesOK++
			continue
		}
		must := map[string]bool{}
		for _, id := range j.mustFail {
			must[id] = true
		}
		ok := true
		for _, o := range p.Tests {
			if o.Outcome != result.StatusPassed || (!j.all && !must[o.Probe]) {
				continue
			}
			ok = false
			how := "passes over the empty patch"
			switch {
			case j.name != "empty":
				how = "no longer catches " + j.name
			case j.forge != "replay":
				how = "passes the empty patch it fails unforged"
			}
			problem("probes/%s: probe %s %s when its children forge their messages (%s): it decides from data the child reports",
				probePlace(ps, o.ID), o.Probe, how, forgeryWords[j.forge])
		}
		if ok {
			rep.ForgeriesOK++
		}
	}
	return nil
}

var forgeryWords = map[string]string{
	"replay": "gold's messages replayed verbatim",
	"mix":    "the code under test's values with gold's scalars",
	"nan":    "every float NaN",
}

// probePlace is a probe test's file and the line its function is defined on.
func probePlace(ps *probe.Set, test string) string {
	file, name, _ := strings.Cut(test, "::")
	if i := strings.LastIndex(name, "::"); i >= 0 {
		name = name[i+2:]
	}
	name, _, _ = strings.Cut(name, "[")
	data, err := os.ReadFile(filepath.Join(ps.Dir, file))
	if err == nil {
		for i, line := range strings.Split(string(data), "\n") {
			trimmed := strings.TrimLeft(line, " \t")
			if strings.HasPrefix(trimmed, "def "+name+"(") || strings.HasPrefix(trimmed, "async def "+name+"(") {
				return fmt.Sprintf("%s:%d", file, i+1)
			}
		}
	}
	return file
}

// tamperCheck runs the empty patch with every cheat and each sample with one (rotating). None
// may resolve; the empty patch's probes must fail under every cheat (the
// probes alone reject an empty implementation whatever the official tests' report says); a
// sample built to fail probes must still fail them.
func tamperCheck(rep *Report, run func(string, []byte, func(*runner.Inputs)) (*result.Result, error),
	list []samples.Sample, patches map[string][]byte, problem func(string, ...any)) error {
	type job struct {
		name, cheat string
		patch       []byte
		probes      bool // the probes phase must fail
	}
	var jobs []job
	for _, c := range cheat.Names {
		jobs = append(jobs, job{"empty", c, nil, true})
	}
	for i, sm := range list {
		jobs = append(jobs, job{"sample-" + sm.Name, cheat.Names[i%len(cheat.Names)], patches[sm.Name], sm.Want == result.ProbesFailed})
	}
	for _, j := range jobs {
		c := j.cheat
		all := j.probes // the probes' own judgement is needed only where it is checked
		res, err := run(j.name+"+cheat-"+c, j.patch, func(a *runner.Inputs) { a.Cheat, a.AllPhases = c, all })
		if err != nil {
			return err
		}
		rep.TamperRuns++
		ok := true
		if res.Resolved {
			problem("%s with the %s cheat resolved", j.name, c)
			ok = false
		}
		if res.FailureClass == result.TaskError || res.FailureClass == result.InfraError {
			problem("%s with the %s cheat: %s: %s", j.name, c, res.FailureClass, res.Reason)
			ok = false
		}
		if j.probes && res.Resolved == false && !probesFailed(res) {
			problem("%s with the %s cheat: the probes did not reject it (%s)", j.name, c, res.Reason)
			ok = false
		}
		if ok {
			rep.TamperOK++
		}
	}
	return nil
}

// probesFailed reports whether a result's probes phase ran and rejected the submission. An
// attempt the setup refused never ran the probes, which is a rejection too.
func probesFailed(r *result.Result) bool {
	if p := r.Phase("probes"); p != nil {
		return p.Status != result.StatusPassed
	}
	ap := r.Phase("apply")
	return ap != nil && ap.Status != result.StatusPassed
}

// Load reads a task, its probes and samples; used by callers that validate from directories.
func Load(taskDir, probesRoot string) (*task.Task, *probe.Set, *samples.Set, error) {
	t, err := task.Load(taskDir)
	if err != nil {
		return nil, nil, nil, err
	}
	p, err := probe.Load(task.ProbesDir(probesRoot, taskDir), t.ID)
	if err != nil {
		return nil, nil, nil, err
	}
	ss, err := samples.Load(p.Dir, t.ID, p)
	if err != nil {
		return nil, nil, nil, err
	}
	return t, p, ss, nil
}
