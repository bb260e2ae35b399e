package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/canary"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/grade"
	"github.com/infradev/infradev/harness/judge"
	"github.com/infradev/infradev/harness/pytestproto"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/sandbox"
)

// taskCheckSchema versions what CheckTask checks: a change to the checks changes every key.
const taskCheckSchema = "infradev.taskcheck/v1"

// CheckTask checks, once per task and without any submission, what every attempt of the task
// relies on: the repository is at its base commit and the official test patch applies there;
// the gold patch applies and passes the static scan; canaries get their outcomes in every
// official test file; every probe module parses and imports nothing from the repository in
// the judging process; every probe the task declares is collected. It returns the task's fault
// ("" when there is none), naming file and line where there is one; an error is an
// infrastructure fault. Outcomes are kept per task, probes, environment and harness (in
// TaskChecks when set), so a fault is decided once and never by a submission.
func (r *Runner) CheckTask(ctx context.Context, in Inputs) (string, error) {
	key, err := r.taskCheckKey(in)
	if err != nil {
		return "", err
	}
	v, _ := r.checks.LoadOrStore(key, &taskCheck{})
	c := v.(*taskCheck)
	c.once.Do(func() { c.fault, c.err = r.checkTask(ctx, in, key) })
	if c.err != nil {
		r.checks.Delete(key) // an infrastructure fault is not an outcome: check again next time
	}
	return c.fault, c.err
}

type taskCheck struct {
	once  sync.Once
	fault string
	err   error
}

type taskCheckRecord struct {
	Schema string `json:"schema"`
	Task   string `json:"task"`
	Fault  string `json:"fault,omitempty"`
}

func (r *Runner) taskCheckKey(in Inputs) (string, error) {
	td, err := taskDigest(in.Task)
	if err != nil {
		return "", err
	}
	pd, err := digest.Files(in.Probes.Dir, notAnInput)
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(digest.Bytes([]byte(strings.Join([]string{taskCheckSchema, td, pd, in.Image, r.Harness}, "\n"))), "sha256:"), nil
}

func (r *Runner) checkTask(ctx context.Context, in Inputs, key string) (string, error) {
	dir := r.TaskChecks
	if dir == "" {
		dir = filepath.Join(r.Scratch, "task-checks")
	}
	record := filepath.Join(dir, key+".json")
	if data, err := os.ReadFile(record); err == nil {
		var rec taskCheckRecord
		if json.Unmarshal(data, &rec) == nil && rec.Schema == taskCheckSchema {
			return rec.Fault, nil
		}
	}
	out := filepath.Join(dir, key)
	if err := os.RemoveAll(out); err != nil {
		return "", err
	}
	for _, d := range []string{filepath.Join(out, "logs"), filepath.Join(out, "raw")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	fault, err := r.runTaskCheck(ctx, in, out)
	if err != nil {
		return "", err
	}
	if fault != "" {
		fault = fmt.Sprintf("task %s: %s (logs: %s)", in.Task.ID, fault, filepath.Join(out, "logs"))
	}
	return fault, atomicfile.WriteJSON(record, taskCheckRecord{Schema: taskCheckSchema, Task: in.Task.ID, Fault: fault})
}

func (r *Runner) runTaskCheck(ctx context.Context, in Inputs, out string) (string, error) {
	t := in.Task
	gold, err := os.ReadFile(t.GoldFile())
	if err != nil {
		return "", fmt.Errorf("task %s: %w", t.ID, err)
	}
	in.GPUs = nil // nothing here runs the code under test's GPU work
	a, err := r.open(ctx, in)
	if err != nil {
		return "", err
	}
	defer a.close()

	// The repository, the official test patch and gold, with canaries in every official file.
	c, err := canary.New(nil, officialFiles(t), true)
	if err != nil {
		return err.Error(), nil
	}
	p, findings, err := a.apply(ctx, out, gold, c, nil)
	if err != nil {
		return "", err
	}
	switch {
	case p.Status == result.StatusError:
		return p.Detail, nil
	case p.Status != result.StatusPassed:
		return "the gold patch: " + p.Detail, nil
	case len(findings) > 0:
		return "the gold patch is refused by the static scan: " + grade.Integrity(findings).Detail, nil
	}

	// Canaries alone: each must get its outcome in every official test file.
	raw, err := a.tests(ctx, out, "canaries", c.IDs())
	if err != nil {
		return "", err
	}
	cp := grade.Tests("canaries", raw, grade.Expected{Canaries: c.Want, CanaryStyles: c.Style, Sealed: true})
	if cp.Status != result.StatusPassed || (cp.Canaries != nil && len(cp.Canaries.Wrong) > 0) {
		detail := cp.Detail
		if cp.Canaries != nil && len(cp.Canaries.Wrong) > 0 {
			detail = strings.Join(cp.Canaries.Wrong, "; ")
		}
		return "canary tests do not get their outcomes among the official tests: " + detail, nil
	}

	// The probes: they parse, import nothing from the repository, and are all collected.
	problems, err := a.checkProbes(ctx, out, in)
	if err != nil {
		return "", err
	}
	if len(problems) > 0 {
		msgs := make([]string, len(problems))
		for i, p := range problems {
			msgs[i] = "probes/" + p.String()
		}
		return strings.Join(msgs, "; "), nil
	}
	return "", nil
}

// checkProbes runs the static check of the probe modules and collects the probes in the
// judge's configuration.
func (a *attemptEnv) checkProbes(ctx context.Context, out string, in Inputs) ([]judge.Problem, error) {
	dir := filepath.Join(a.work, "in-probes")
	if err := pytestproto.StageProbes(dir); err != nil {
		return nil, err
	}
	files := map[string]bool{}
	for _, p := range in.Probes.Probes {
		files[strings.SplitN(p.Test, "::", 2)[0]] = true
	}
	var paths []string
	for f := range files {
		paths = append(paths, shellQuote(probesMount+"/"+f))
	}
	sort.Strings(paths)
	script := fmt.Sprintf(`python3 -I %[1]s/check_probes.py %[2]s %[3]s > %[4]s/check.json || exit 1
INFRADEV_COLLECT_OUT=%[4]s/collect.json python3 -m pytest --collect-only -q -p no:cacheprovider -p %[5]s -p %[6]s -c %[1]s/probes.ini --rootdir=%[3]s --confcutdir=%[3]s %[7]s
exit 0
`, inDir, shellQuote(in.Task.Repo.Path), probesMount, outDir, judge.CollectModule, judge.LibraryModule, strings.Join(paths, " "))
	mounts := []sandbox.Mount{{Source: dir, Dest: inDir, ReadOnly: true}, {Source: a.probeDir, Dest: probesMount, ReadOnly: true}}
	spec, _ := a.judgeSpec()
	raw, err := a.run(ctx, out, "probe-check", spec, mounts, []string{"/bin/sh", "-c", script}, in.Task.Timeouts.ProbesD, 0, nil)
	if err != nil {
		return nil, err
	}
	if raw.Run.TimedOut {
		return []judge.Problem{{File: ".", Msg: "checking the probes timed out"}}, nil
	}
	res := filepath.Join(a.work, "out-probe-check")
	data, err := os.ReadFile(filepath.Join(res, "check.json"))
	if err != nil {
		return []judge.Problem{{File: ".", Msg: fmt.Sprintf("the probe check did not run (exit %d; see logs/probe-check.log)", raw.Run.ExitCode)}}, nil
	}
	problems, err := judge.ParseCheck(data)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return problems, nil // collection would only repeat a syntax error less precisely
	}
	data, err = os.ReadFile(filepath.Join(res, "collect.json"))
	if errors.Is(err, os.ErrNotExist) {
		return []judge.Problem{{File: ".", Msg: "the probes could not be collected (see logs/probe-check.log)"}}, nil
	}
	if err != nil {
		return nil, err
	}
	var c judge.Collected
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("probe collection: %w", err)
	}
	return judge.CollectionProblems(c, in.Probes.IDs(), probesMount), nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
