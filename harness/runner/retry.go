package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/infradev/infradev/harness/attempt"
	"github.com/infradev/infradev/harness/result"
)

// Attempter runs attempts (package attempt).
type Attempter = attempt.Attempter

// Retry runs an attempt again when it ends in an infrastructure error: such a fault is the
// harness's, never the submission's. The failed attempts' folders are kept inside the final
// run folder as infra-attempt-N/, and their reasons are recorded in the result.
type Retry struct {
	Attempter
	// Max is how many times to retry. Default 1.
	Max int
}

// CheckTask checks the task alone (see Runner.CheckTask), when the wrapped Attempter can; an
// infrastructure fault is retried like an attempt's.
func (r Retry) CheckTask(ctx context.Context, in Inputs) (string, error) {
	c, ok := r.Attempter.(interface {
		CheckTask(context.Context, Inputs) (string, error)
	})
	if !ok {
		return "", nil
	}
	fault, err := c.CheckTask(ctx, in)
	for i := 0; err != nil && ctx.Err() == nil && i < max(r.Max, 1); i++ {
		fault, err = c.CheckTask(ctx, in)
	}
	return fault, err
}

// Survey runs test files over upstream code (see Runner.Survey), when the wrapped Attempter can.
func (r Retry) Survey(ctx context.Context, in Inputs, files, deselect []string, out string) (map[string]string, error) {
	s, ok := r.Attempter.(interface {
		Survey(context.Context, Inputs, []string, []string, string) (map[string]string, error)
	})
	if !ok {
		return nil, fmt.Errorf("this runner cannot survey tests")
	}
	return s.Survey(ctx, in, files, deselect, out)
}

// Sweep cleans up after attempts of dead processes, when the wrapped Attempter can.
func (r Retry) Sweep() int {
	if s, ok := r.Attempter.(interface{ Sweep() int }); ok {
		return s.Sweep()
	}
	return 0
}

// Run implements Attempter.
func (r Retry) Run(ctx context.Context, in Inputs, out string) (*result.Result, error) {
	max := r.Max
	if max == 0 {
		max = 1
	}
	var reasons, kept []string
	for {
		res, err := r.Attempter.Run(ctx, in, out)
		if err != nil {
			return nil, err
		}
		if res.FailureClass == result.InfraError && len(kept) < max {
			keep := fmt.Sprintf("%s.infra-%d", out, len(kept)+1)
			_ = os.RemoveAll(keep)
			if err := os.Rename(out, keep); err != nil {
				return nil, fmt.Errorf("keeping the failed attempt: %w", err)
			}
			reasons, kept = append(reasons, res.Reason), append(kept, keep)
			continue
		}
		if len(kept) == 0 {
			return res, nil
		}
		for i, dir := range kept {
			if err := os.Rename(dir, filepath.Join(out, fmt.Sprintf("infra-attempt-%d", i+1))); err != nil {
				return nil, err
			}
		}
		res.RetriedInfraErrors = reasons
		if err := result.Write(filepath.Join(out, "result.json"), res); err != nil {
			return nil, err
		}
		return res, nil
	}
}
