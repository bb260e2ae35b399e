package resultstore

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/infradev/infradev/harness/attempt"
	"github.com/infradev/infradev/harness/result"
)

// Cached wraps an Attempter with a results store: an attempt whose inputs already have a
// stored result is not run again (the stored run folder is copied to the run folder), and a
// finished attempt is stored. Infrastructure errors are never stored. This is how a task test
// under `bazel test` and `infradev eval` share results through one server: both key them by
// the same input digests.
type Cached struct {
	attempt.Attempter
	Store Backend
	// Log, when set, is told when a result comes from the store.
	Log io.Writer
}

// Run implements attempt.Attempter: the stored result when there is one, else the attempt,
// stored unless it ended in an infrastructure error.
func (c Cached) Run(ctx context.Context, in attempt.Inputs, out string) (*result.Result, error) {
	if c.Store == nil {
		return c.Attempter.Run(ctx, in, out)
	}
	key, err := c.Key(in)
	if err != nil {
		return nil, err
	}
	if r, err := c.lookup(key, in, out); r != nil || err != nil {
		return r, err
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

// Key is the store key of in's result.
func (c Cached) Key(in attempt.Inputs) (string, error) {
	keys, err := c.Attempter.Digests(in)
	if err != nil {
		return "", err
	}
	return Key(keys), nil
}

// Lookup copies the stored result of in to out, relabelled as in's; nil (and no error) when
// the store has none.
func (c Cached) Lookup(in attempt.Inputs, out string) (*result.Result, error) {
	if c.Store == nil {
		return nil, nil
	}
	key, err := c.Key(in)
	if err != nil {
		return nil, err
	}
	return c.lookup(key, in, out)
}

func (c Cached) lookup(key string, in attempt.Inputs, out string) (*result.Result, error) {
	r, err := c.Store.CopyOut(key, out, in.Identity())
	switch {
	case err == nil:
		if c.Log != nil {
			fmt.Fprintf(c.Log, "%s: result from the results store (key %s)\n", in.Identity().InstanceID, key[:16])
		}
		return r, nil
	case errors.Is(err, ErrNotStored):
		return nil, nil
	}
	return nil, err
}
