package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/infradev/infradev/harness/grade"
	"github.com/infradev/infradev/harness/pytestproto"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/sandbox"
)

// Survey runs every test of the given repository test files once, over patch applied with the
// official test patch, and returns each test's outcome by pytest node id (passed, failed,
// error, skipped). Modules that fail to import report none of their tests. It is how a task's
// fail-to-pass and pass-to-pass tests are found: the code it runs is upstream's (the base, or
// the merge commit's change), never a submission's, so the report is not sealed and no
// canaries are planted. deselect names node ids not to run (tests known to hang on this
// hardware). out receives the logs.
func (r *Runner) Survey(ctx context.Context, in Inputs, files, deselect []string, out string) (map[string]string, error) {
	for _, d := range []string{filepath.Join(out, "logs"), filepath.Join(out, "raw")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	in.GPUs = nil
	a, err := r.open(ctx, in)
	if err != nil {
		return nil, err
	}
	defer a.close()
	a.files = files
	p, _, err := a.apply(ctx, out, in.Patch, nil, nil)
	if err != nil {
		return nil, err
	}
	if p.Status != result.StatusPassed {
		return nil, fmt.Errorf("setting up the repository: %s (%s)", p.Detail, filepath.Join(out, "logs", "apply.log"))
	}
	dir := filepath.Join(a.work, "in-survey")
	if err := pytestproto.StageTests(dir); err != nil {
		return nil, err
	}
	args := append(append(pytestproto.Command(nil, ""), pytestproto.Plugins(in.Task)...), "--infradev-outcomes="+outDir+"/outcomes-{rank}.json")
	for _, d := range deselect {
		args = append(args, "--deselect", d)
	}
	ranks := max(1, in.Task.Tests.Ranks)
	raw, err := a.run(ctx, out, "survey", a.base, []sandbox.Mount{{Source: dir, Dest: inDir, ReadOnly: true}},
		pytestproto.Launch(ranks, append(args, files...)), in.Task.Timeouts.TestsD, ranks, nil)
	if err != nil {
		return nil, err
	}
	if raw.Run.TimedOut {
		return nil, fmt.Errorf("the tests ran past %s (%s)", in.Task.Timeouts.TestsD, filepath.Join(out, "logs", "survey.log"))
	}
	// With several ranks a test's outcome is its worst on any rank, and a test some rank did
	// not report is an error: as the official tests are graded.
	var outcomes map[string]string
	for r := range ranks {
		data, err := os.ReadFile(filepath.Join(a.work, "out-survey", fmt.Sprintf("outcomes-%d.json", r)))
		if err != nil {
			return nil, fmt.Errorf("rank %d of the test run recorded no outcomes (exit %d; %s)", r, raw.Run.ExitCode, filepath.Join(out, "logs", "survey.log"))
		}
		var got map[string]string
		if err := json.Unmarshal(data, &got); err != nil {
			return nil, fmt.Errorf("rank %d's outcomes: %w", r, err)
		}
		if r == 0 {
			outcomes = got
			continue
		}
		for id, o := range got {
			if _, ok := outcomes[id]; !ok {
				outcomes[id] = result.StatusError
			} else {
				outcomes[id] = grade.WorseOutcome(o, outcomes[id])
			}
		}
		for id := range outcomes {
			if _, ok := got[id]; !ok {
				outcomes[id] = result.StatusError
			}
		}
	}
	return outcomes, nil
}
