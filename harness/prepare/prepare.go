// Package prepare owns turning a loaded task into what its attempts run on: for a task that
// references an upstream change, its derived files (gold patch, official test patch, PR
// description) and its image, the framework environment with the task's repository at the
// base commit as one more layer; for a task whose environment provides its repository (the
// demo suite), the environment's image. Images are built once per process and environment.
package prepare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/mirror"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/upstream"
)

// Preparer prepares tasks. The zero value is not usable: set Store and EnvsRoot.
type Preparer struct {
	Store    image.Store
	EnvsRoot string
	Mirrors  mirror.Map
	// Log receives the image builders' lines. Default: discarded.
	Log io.Writer
	// Locked holds every environment to its env.lock when set.
	Locked bool

	mu     sync.Mutex
	images map[string]*once
}

type once struct {
	sync.Once
	digest string
	err    error
}

// Task attaches an upstream task's derived files and returns the manifest digest of the image
// its attempts run in.
func (p *Preparer) Task(ctx context.Context, t *task.Task) (string, error) {
	if err := upstream.Attach(ctx, p.Store.Dir, t, p.Mirrors); err != nil {
		return "", err
	}
	key := t.Environment
	if t.Upstream() {
		key = t.Environment + "@" + t.Repo.URL + "@" + t.Repo.BaseCommit + "@" + t.Repo.Path
	}
	p.mu.Lock()
	if p.images == nil {
		p.images = map[string]*once{}
	}
	o := p.images[key]
	if o == nil {
		o = &once{}
		p.images[key] = o
	}
	p.mu.Unlock()
	o.Do(func() { o.digest, o.err = p.build(ctx, t) })
	return o.digest, o.err
}

func (p *Preparer) build(ctx context.Context, t *task.Task) (string, error) {
	env, err := envspec.Load(filepath.Join(p.EnvsRoot, t.Environment))
	if err != nil {
		return "", err
	}
	opts := image.Options{Log: p.Log, Mirrors: p.Mirrors}
	if p.Locked {
		lock, err := image.ReadLock(env.Dir)
		if err != nil {
			return "", err
		}
		opts.Locked = lock
	}
	if !t.Upstream() {
		b, err := image.Build(ctx, env, p.Store, opts)
		if err != nil {
			return "", &BuildError{Err: err}
		}
		return b.Manifest, nil
	}
	b, err := image.BuildTask(ctx, env, image.TaskRepo{Name: "task-" + t.ID, URL: t.Repo.URL,
		Commit: t.Repo.BaseCommit, Dest: t.Repo.Path}, p.Store, opts)
	if err != nil {
		return "", &BuildError{Err: fmt.Errorf("task %s: %w", t.ID, err)}
	}
	return b.Manifest, nil
}

// BuildError is an image that could not be built: an infrastructure fault, unless the mirror
// lacks the task's commits (mirror.ErrNotFound, which it wraps then).
type BuildError struct{ Err error }

func (e *BuildError) Error() string { return e.Err.Error() }

// FaultClass implements fault.Classified: a build that failed is the machine's fault; a
// mirror that lacks the task's commits is the caller's (the mirror map given).
func (e *BuildError) FaultClass() fault.Class {
	if errors.Is(e.Err, mirror.ErrNotFound) {
		return fault.Input
	}
	return fault.ClassOf(e.Err)
}
func (e *BuildError) Unwrap() error { return e.Err }
