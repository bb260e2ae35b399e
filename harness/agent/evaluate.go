package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/eval"
	"github.com/infradev/infradev/harness/predictions"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/task"
)

// Evaluation is an agent's run over tasks: every (task, prompt variant, attempt) is attempted
// (or found finished in the run folder), the submissions are written as SWE-bench
// predictions, and graded by eval into the same run folder:
//
//	OUT/RUN_ID/agent/<agent>@<variant>@<k>/<instance>/   agent.json, patch.diff, prompt/, transcript, logs
//	OUT/RUN_ID/predictions/<agent>.jsonl                  the submissions
//	OUT/RUN_ID/<agent>@<variant>@<k>/<instance>/           the graded attempt, as eval writes it
type Evaluation struct {
	Spec     *Spec
	Tasks    []*task.Task
	Variants []string
	Attempts int
	// Skill is the skill folder for the instruction+skill variant.
	Skill string
	// Jobs is how many agent attempts run at once. Default 1.
	Jobs   int
	Runner *Runner
	// Eval grades the submissions; its Predictions field is set here.
	Eval eval.Config
	// Progress is told of each attempt. Default: nothing.
	Progress func(done, total int, rec *Record, how string)
}

// Outcomes are what an evaluation produced.
type Outcomes struct {
	Records []*Record
	Results []*result.Result
	// Faults are the attempts that ended in an infrastructure fault: not graded; the same
	// command runs them again.
	Faults []*Record
}

// Evaluate runs the agent over the tasks and grades what it made.
func Evaluate(ctx context.Context, e Evaluation) (*Outcomes, error) {
	if e.Attempts < 1 || e.Attempts > predictions.MaxAttempts {
		return nil, &eval.InputError{Err: fmt.Errorf("--attempts must be 1 to %d, got %d", predictions.MaxAttempts, e.Attempts)}
	}
	for _, v := range e.Variants {
		if !knownVariant(v) {
			return nil, &eval.InputError{Err: fmt.Errorf("prompt variant %q: must be one of %v", v, Variants)}
		}
		if v == InstructionSkill {
			if _, err := os.Stat(filepath.Join(e.Skill, "SKILL.md")); err != nil {
				return nil, &eval.InputError{Err: fmt.Errorf("the instruction+skill variant needs --skill DIR holding SKILL.md: %v", err)}
			}
		}
	}
	runDir := filepath.Join(e.Eval.Out, e.Eval.RunID)
	type job struct {
		a  Attempt
		id predictions.Prediction
	}
	var jobs []job
	for _, t := range e.Tasks {
		for _, v := range e.Variants {
			for k := 1; k <= e.Attempts; k++ {
				p := predictions.Prediction{InstanceID: t.ID, Model: e.Spec.Name, PromptVariant: v, Attempt: k}
				out := filepath.Join(runDir, "agent", p.ModelFolder(), predictions.Folder(t.ID))
				jobs = append(jobs, job{a: Attempt{Spec: e.Spec, Task: t, Variant: v, Skill: e.Skill, Attempt: k, Out: out}, id: p})
			}
		}
	}
	recs := make([]*Record, len(jobs))
	var mu sync.Mutex
	done := 0
	report := func(rec *Record, how string) {
		mu.Lock()
		done++
		n := done
		mu.Unlock()
		if e.Progress != nil {
			e.Progress(n, len(jobs), rec, how)
		}
	}
	work := make(chan int)
	var wg sync.WaitGroup
	var firstErr error
	for w := 0; w < max(1, e.Jobs); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				j := jobs[i]
				if rec := Finished(j.a.Out); rec != nil && rec.AgentDigest == e.Spec.Digest {
					if pd, err := e.Runner.PromptDigest(ctx, j.a); err == nil && pd == rec.PromptDigest {
						recs[i] = rec
						report(rec, "resumed")
						continue
					}
				}
				rec, err := e.Runner.Run(ctx, j.a)
				if rec == nil && err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				recs[i] = rec
				report(rec, "ran")
			}
		}()
	}
	for i := range jobs {
		if ctx.Err() != nil {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("agent run interrupted: %w (finished attempts are kept; the same command resumes)", ctx.Err())
	}

	out := &Outcomes{}
	var lines bytes.Buffer
	for i, rec := range recs {
		out.Records = append(out.Records, rec)
		if rec.Outcome.Status == Error {
			out.Faults = append(out.Faults, rec)
			continue
		}
		patch, err := os.ReadFile(filepath.Join(jobs[i].a.Out, "patch.diff"))
		if err != nil {
			return nil, err
		}
		p := jobs[i].id
		p.Patch = string(patch)
		line, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		lines.Write(line)
		lines.WriteByte('\n')
	}
	predFile := filepath.Join(runDir, "predictions", predictions.Folder(e.Spec.Name)+".jsonl")
	if err := os.MkdirAll(filepath.Dir(predFile), 0o755); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(predFile, lines.Bytes()); err != nil {
		return nil, err
	}
	if lines.Len() == 0 {
		return out, nil
	}
	cfg := e.Eval
	cfg.Predictions = []string{predFile}
	results, err := eval.Run(ctx, cfg)
	out.Results = results
	return out, err
}

func knownVariant(v string) bool {
	for _, k := range Variants {
		if v == k {
			return true
		}
	}
	return false
}
