package runner

import (
	"context"
	"fmt"
	"sync"

	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/grade"
	"github.com/infradev/infradev/harness/lease"
	"github.com/infradev/infradev/harness/result"
)

// Leased leases each attempt's GPUs across processes (file locks under Dir) before the
// wrapped Attempter runs it, and releases them after: concurrent runners never share a GPU.
// GPUs set aside (SetAside, which gpu.Sandbox's OnFault calls on an Xid) are not leased again
// by this process, so a retry (Retry around Leased) runs on others. Attempts needing no GPUs
// pass straight through.
type Leased struct {
	Attempter
	Dir     string
	Machine *gpu.Machine

	mu     sync.Mutex
	faulty []int
}

// SetAside keeps GPUs out of this process's later leases.
func (l *Leased) SetAside(indices []int) {
	l.mu.Lock()
	l.faulty = append(l.faulty, indices...)
	l.mu.Unlock()
}

func (l *Leased) excluded() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int{}, l.faulty...)
}

// Run implements Attempter. A lease that cannot be had is the machine's fault: the attempt's
// result is an infrastructure error, retried like any other.
func (l *Leased) Run(ctx context.Context, in Inputs, out string) (*result.Result, error) {
	g := in.Task.Resources.GPUs
	if g.Count == 0 || l.Machine == nil {
		return l.Attempter.Run(ctx, in, out)
	}
	ls, err := lease.Acquire(ctx, l.Dir, l.Machine, lease.Request{Count: g.Count,
		MinMemory: uint64(g.MinMemoryBytes), Connected: g.Connected, Exclude: l.excluded()})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return l.infra(in, out, fmt.Errorf("leasing %d GPUs: %w", g.Count, err))
	}
	defer ls.Release()
	in.GPUs = ls.Indices
	return l.Attempter.Run(ctx, in, out)
}

// infra writes the result of an attempt that could not start.
func (l *Leased) infra(in Inputs, out string, cause error) (*result.Result, error) {
	keys, err := l.Attempter.Digests(in)
	if err != nil {
		return nil, err
	}
	return grade.Record(in, keys, result.Phase{Name: "infra", Status: result.StatusError, Detail: cause.Error()}, out)
}

// CheckTask, Survey and Sweep reach the wrapped Attempter's, where it has them.
func (l *Leased) CheckTask(ctx context.Context, in Inputs) (string, error) {
	if c, ok := l.Attempter.(interface {
		CheckTask(context.Context, Inputs) (string, error)
	}); ok {
		return c.CheckTask(ctx, in)
	}
	return "", nil
}

func (l *Leased) Survey(ctx context.Context, in Inputs, files, deselect []string, out string) (map[string]string, error) {
	s, ok := l.Attempter.(interface {
		Survey(context.Context, Inputs, []string, []string, string) (map[string]string, error)
	})
	if !ok {
		return nil, fmt.Errorf("the runner cannot survey tests")
	}
	return s.Survey(ctx, in, files, deselect, out)
}

func (l *Leased) Sweep() int {
	if s, ok := l.Attempter.(interface{ Sweep() int }); ok {
		return s.Sweep()
	}
	return 0
}
