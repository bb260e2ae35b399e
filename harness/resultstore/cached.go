package resultstore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
)

// Cached wraps an Attempter with a results store: an attempt whose inputs already have a
// stored result is not run again (the stored run folder is copied to the run folder), and a
// finished attempt is stored. Infrastructure errors are never stored. This is how a task test
// under `bazel test` and `infradev eval` share results through one server: both key them by
// the same input digests.
type Cached struct {
	runner.Attempter
	Store Backend
	// Log, when set, is told when a result comes from the store.
	Log io.Writer
}

// Run implements runner.Attempter.
func (c Cached) Run(ctx context.Context, in runner.Inputs, out string) (*result.Result, error) {
	if c.Store == nil {
		return c.Attempter.Run(ctx, in, out)
	}
	keys, err := c.Attempter.Digests(in)
	if err != nil {
		return nil, err
	}
	key := Key(keys)
	instance := in.InstanceID
	if instance == "" {
		instance = in.Task.ID
	}
	switch r, err := c.Store.CopyOut(key, out, result.Identity{Model: in.Model, InstanceID: instance, PromptVariant: in.PromptVariant, Attempt: in.Attempt}); {
	case err == nil:
		if c.Log != nil {
			fmt.Fprintf(c.Log, "%s: result from the results store (key %s)\n", instance, key[:16])
		}
		return r, nil
	case !errors.Is(err, ErrNotStored):
		return nil, err
	}
	r, err := c.Attempter.Run(ctx, in, out)
	if err != nil || r.FailureClass == result.InfraError {
		return r, err
	}
	if err := c.Store.Put(key, out); err != nil {
		return nil, fmt.Errorf("storing the result: %w", err)
	}
	return r, nil
}
