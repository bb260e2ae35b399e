// Package eval owns evaluating predictions: for every prediction it finds the task, builds (or
// finds built) the task's environment, runs the attempt unless a result for exactly the same
// inputs is already stored, and returns every result. Results live at
// <out>/<run id>/<model>/<instance>/result.json, so an interrupted evaluation resumes.
package eval

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/predictions"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/task"
)

// Config is one evaluation.
type Config struct {
	Predictions []string
	RunID       string
	// TasksRoot, ProbesRoot and EnvsRoot are the suite's directories.
	TasksRoot, ProbesRoot, EnvsRoot string
	Store                           image.Store
	// Out is the results root; results go under Out/RunID.
	Out string
	// Runner runs attempts (e.g. a runner.Retry around a runner.Runner).
	Runner runner.Attempter
	// Log receives one line per attempt. Default: discarded.
	Log io.Writer
}

var safeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Run evaluates every prediction of every file in order, reusing stored results whose inputs
// are identical.
func Run(ctx context.Context, c Config) ([]*result.Result, error) {
	log := c.Log
	if log == nil {
		log = io.Discard
	}
	var preds []predictions.Prediction
	for _, f := range c.Predictions {
		ps, err := predictions.Read(f)
		if err != nil {
			return nil, err
		}
		preds = append(preds, ps...)
	}
	dirs, err := task.Find(c.TasksRoot)
	if err != nil {
		return nil, err
	}
	s := &session{c: c, dirs: dirs, tasks: map[string]*loaded{}, images: map[string]string{}, log: log}
	var out []*result.Result
	for i, p := range preds {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		r, cached, err := s.one(ctx, p)
		if err != nil {
			return out, fmt.Errorf("%s / %s: %w", p.Model, p.InstanceID, err)
		}
		state := "ran"
		if cached {
			state = "cached"
		}
		fmt.Fprintf(log, "[%d/%d] %s %s: %s (%s)\n", i+1, len(preds), p.Model, p.InstanceID, verdictWord(r), state)
		out = append(out, r)
	}
	return out, nil
}

type loaded struct {
	t *task.Task
	p *probe.Set
}

type session struct {
	c      Config
	dirs   map[string]string
	tasks  map[string]*loaded
	images map[string]string // environment name -> manifest digest
	log    io.Writer
}

func (s *session) one(ctx context.Context, p predictions.Prediction) (*result.Result, bool, error) {
	l, err := s.task(p.InstanceID)
	if err != nil {
		return nil, false, err
	}
	img, err := s.image(ctx, l.t.Environment)
	if err != nil {
		return nil, false, err
	}
	in := runner.Inputs{Task: l.t, Probes: l.p, Layout: s.c.Store.Layout(), Image: img,
		Patch: []byte(p.Patch), InstanceID: p.InstanceID, Model: p.Model}
	dir := filepath.Join(s.c.Out, safeName.ReplaceAllString(s.c.RunID, "_"),
		safeName.ReplaceAllString(p.Model, "_"), safeName.ReplaceAllString(p.InstanceID, "_"))
	want, err := s.c.Runner.Digests(in)
	if err != nil {
		return nil, false, err
	}
	if prev, err := result.Read(filepath.Join(dir, "result.json")); err == nil && prev.Inputs == want &&
		prev.FailureClass != result.InfraError {
		return prev, true, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, false, err
	}
	r, err := s.c.Runner.Run(ctx, in, dir)
	return r, false, err
}

func (s *session) task(id string) (*loaded, error) {
	if l, ok := s.tasks[id]; ok {
		return l, nil
	}
	dir, ok := s.dirs[id]
	if !ok {
		return nil, fmt.Errorf("no task %q under %s", id, s.c.TasksRoot)
	}
	t, err := task.Load(dir)
	if err != nil {
		return nil, err
	}
	ps, err := probe.Load(task.ProbesDir(s.c.ProbesRoot, dir), t.ID)
	if err != nil {
		return nil, err
	}
	l := &loaded{t: t, p: ps}
	s.tasks[id] = l
	return l, nil
}

func (s *session) image(ctx context.Context, name string) (string, error) {
	if d, ok := s.images[name]; ok {
		return d, nil
	}
	env, err := envspec.Load(filepath.Join(s.c.EnvsRoot, name))
	if err != nil {
		return "", err
	}
	b, err := image.Build(ctx, env, s.c.Store, image.Options{Log: s.log})
	if err != nil {
		return "", err
	}
	s.images[name] = b.Manifest
	return b.Manifest, nil
}

func verdictWord(r *result.Result) string {
	if r.Resolved {
		return "resolved"
	}
	return "not resolved: " + r.FailureClass
}
