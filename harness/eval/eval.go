// Package eval owns evaluating predictions: it finds each prediction's task, builds (or finds
// built) the environments, and settles every prediction in one of four ways: its run folder
// already holds a result for exactly these inputs (resumed); the results store holds one
// (graded before, by any model or run); an identical submission in this evaluation is graded
// and shared; or an attempt runs, scheduled onto the machine's capacity. Results live at
// <out>/<run id>/<model>/<instance>/result.json, so an interrupted evaluation resumes.
package eval

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/flock"

	"github.com/infradev/infradev/harness/attempt"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/mirror"
	"github.com/infradev/infradev/harness/predictions"
	"github.com/infradev/infradev/harness/prepare"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/resultstore"
	"github.com/infradev/infradev/harness/schedule"
	"github.com/infradev/infradev/harness/task"
)

// Config is one evaluation.
type Config struct {
	Predictions []string
	RunID       string
	// TasksRoot, ProbesRoot and EnvsRoot are the suite's directories.
	TasksRoot, ProbesRoot, EnvsRoot string
	Store                           image.Store
	// Mirrors resolve upstream tasks' repositories (package mirror).
	Mirrors mirror.Map
	// Out is the results root; results go under Out/RunID.
	Out string
	// Runner runs attempts (e.g. a runner.Retry around a runner.Runner).
	Runner attempt.Attempter
	// Results is the content-addressed results store; nil disables it.
	Results resultstore.Backend
	// Capacity is what attempts are packed onto; Jobs caps how many run at once (0: no cap).
	Capacity schedule.Capacity
	Jobs     int
	// Select keeps the predictions whose task it accepts; nil keeps all.
	Select func(t *task.Task) bool
	// PromptVariant labels the predictions' prompt in results and reports.
	PromptVariant string
	// Progress is told each time a prediction is settled. Default: nothing.
	Progress func(Event)
}

// Event says one prediction was settled.
type Event struct {
	Done, Total     int
	Model, Instance string
	Verdict         string
	// How: "ran", "resumed" (run folder), "stored" (results store), "shared" (an identical
	// submission in this evaluation) or "not run".
	How     string
	Elapsed time.Duration
	// ETA is the estimated time left, from the attempts run so far; 0 when unknown.
	ETA time.Duration
}

var runIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

type item struct {
	pred predictions.Prediction
	in   attempt.Inputs
	keys result.Inputs // the digests of its inputs
	key  string        // their store key
	dir  string
	res  *result.Result
}

// Run evaluates every prediction and returns their results in input order (predictions whose
// task Select rejects are left out). If ctx ends, finished results are kept on disk and the
// error says the evaluation was interrupted.
func Run(ctx context.Context, c Config) ([]*result.Result, error) {
	if !runIDRe.MatchString(c.RunID) {
		return nil, &InputError{fmt.Errorf("run id %q: must match %s", c.RunID, runIDRe)}
	}
	var preds []predictions.Prediction
	from := map[predictions.Key]string{}
	for _, f := range c.Predictions {
		ps, err := predictions.Read(f)
		if err != nil {
			return nil, &InputError{err}
		}
		// One run folder per (model, instance): two predictions for it would share it.
		for _, p := range ps {
			k := p.Key()
			if prev, dup := from[k]; dup {
				return nil, &InputError{fmt.Errorf("%s:%d: %s already has a prediction for %s in %s", f, p.Line, p.Model, p.InstanceID, prev)}
			}
			from[k] = f
		}
		preds = append(preds, ps...)
	}
	dirs, err := task.Find(c.TasksRoot)
	if err != nil {
		return nil, err
	}
	s := &session{c: c, dirs: dirs, tasks: map[string]*loaded{}, start: time.Now(),
		prep: &prepare.Preparer{Store: c.Store, EnvsRoot: c.EnvsRoot, Mirrors: c.Mirrors}}
	var items []*item
	for _, p := range preds {
		if _, ok := dirs[p.InstanceID]; !ok {
			return nil, &InputError{fmt.Errorf("line %d: instance_id: no task %q under %s", p.Line, p.InstanceID, c.TasksRoot)}
		}
	}
	for _, p := range preds {
		it, err := s.prepare(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("%s / %s: %w", p.Model, p.InstanceID, err)
		}
		if it != nil {
			items = append(items, it)
		}
	}
	s.total = len(items)

	// Settle what needs no attempt; group the rest by key so each submission runs once.
	groups := map[string][]*item{}
	var keys []string
	for _, it := range items {
		if prev := s.finished(it); prev != nil {
			s.settle(it, prev, "resumed")
			continue
		}
		if r, err := s.cached().Lookup(it.in, it.dir); err != nil {
			return nil, err
		} else if r != nil {
			s.settle(it, r, "stored")
			continue
		}
		if groups[it.key] == nil {
			keys = append(keys, it.key)
		}
		groups[it.key] = append(groups[it.key], it)
	}

	reqs := make([]schedule.Request, len(keys))
	for i, k := range keys {
		r := groups[k][0].in.Task.Resources
		reqs[i] = schedule.Request{CPUs: r.CPUs, MemoryBytes: r.MemoryBytes, GPUs: r.GPUs.Count}
	}
	var errMu sync.Mutex
	var firstErr error
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	err = schedule.Run(ctx, c.Capacity, c.Jobs, reqs, func(ctx context.Context, i int, l schedule.Lease) {
		if err := s.attempt(ctx, groups[keys[i]], l); err != nil && ctx.Err() == nil {
			fail(err)
		}
	}, func(i int, why error) {
		for _, it := range groups[keys[i]] {
			if err := s.notRun(it, why); err != nil {
				fail(err)
			}
		}
	})
	if err != nil {
		return s.collected(items), fmt.Errorf("evaluation interrupted: %w (finished results are kept; the same command resumes)", err)
	}
	if firstErr != nil {
		return s.collected(items), firstErr
	}
	return s.collected(items), nil
}

type loaded struct {
	t *task.Task
	p *probe.Set
}

type session struct {
	c     Config
	dirs  map[string]string
	tasks map[string]*loaded
	prep  *prepare.Preparer

	mu               sync.Mutex
	done, total, ran int
	start            time.Time
	attemptTime      time.Duration
}

func (s *session) prepare(ctx context.Context, p predictions.Prediction) (*item, error) {
	l, err := s.task(p.InstanceID)
	if err != nil {
		return nil, err
	}
	if s.c.Select != nil && !s.c.Select(l.t) {
		return nil, nil
	}
	img, err := s.prep.Task(ctx, l.t)
	if err != nil {
		return nil, err
	}
	variant := p.PromptVariant
	if variant == "" {
		variant = s.c.PromptVariant
	}
	in := attempt.Inputs{Task: l.t, Probes: l.p, Layout: s.c.Store.Layout(), Image: img,
		Patch: []byte(p.Patch), InstanceID: p.InstanceID, Model: p.Model, PromptVariant: variant, Attempt: p.Attempt}
	keys, err := s.c.Runner.Digests(in)
	if err != nil {
		return nil, err
	}
	// Folder names map names one to one, so no two models or instances share a folder, and
	// the checked names never leave the run folder.
	dir := filepath.Join(s.runDir(), p.ModelFolder(), predictions.Folder(p.InstanceID))
	return &item{pred: p, in: in, keys: keys, key: resultstore.Key(keys), dir: dir}, nil
}

// cached is the evaluation's runner with its results store: the one path by which results are
// looked up and stored, as run-task uses it.
func (s *session) cached() resultstore.Cached {
	return resultstore.Cached{Attempter: s.c.Runner, Store: s.c.Results}
}

// runDir is this evaluation's run folder.
func (s *session) runDir() string { return filepath.Join(s.c.Out, s.c.RunID) }

// InputError is an evaluation refused for its input (a predictions file, a run id) before
// anything ran.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }

// FaultClass implements fault.Classified: the caller's input.
func (e *InputError) FaultClass() fault.Class { return fault.Input }
func (e *InputError) Unwrap() error           { return e.Err }

// attempt runs the first item of a group and gives its result to the others. It first claims
// the group's key across processes: a second evaluation of the same run (or of another run
// over the same output root) waits for the first to finish the attempt and then takes its
// result, rather than running it again.
func (s *session) attempt(ctx context.Context, group []*item, l schedule.Lease) error {
	claim, err := s.claim(ctx, group[0].key)
	if err != nil {
		return err
	}
	defer claim.Unlock()
	var left []*item
	for _, it := range group {
		if r := s.finished(it); r != nil {
			s.settle(it, r, "resumed")
			continue
		}
		if r, err := s.cached().Lookup(it.in, it.dir); err != nil {
			return err
		} else if r != nil {
			s.settle(it, r, "stored")
			continue
		}
		left = append(left, it)
	}
	if len(left) == 0 {
		return nil
	}
	group = left
	first := group[0]
	in := first.in
	in.GPUs = l.GPUs
	if err := s.clear(first.dir); err != nil {
		return err
	}
	start := time.Now()
	r, err := s.cached().Run(ctx, in, first.dir)
	if err != nil {
		if ctx.Err() != nil {
			_ = s.clear(first.dir) // an interrupted attempt leaves nothing that looks finished
		}
		return err
	}
	s.mu.Lock()
	s.ran++
	s.attemptTime += time.Since(start)
	s.mu.Unlock()
	s.settle(first, r, "ran")
	for _, it := range group[1:] {
		shared, err := s.cached().Lookup(it.in, it.dir)
		if err == nil && shared == nil {
			shared, err = copyResult(first.dir, it.dir, it.in.Identity())
		}
		if err != nil {
			return err
		}
		s.settle(it, shared, "shared")
	}
	return nil
}

// finished returns the result in it's run folder when it is for exactly these inputs and is a
// verdict (not an infrastructure error or an attempt that could not run), else nil.
func (s *session) finished(it *item) *result.Result {
	prev, err := result.Read(filepath.Join(it.dir, "result.json"))
	if err == nil && prev.Inputs == it.keys && prev.FailureClass != result.InfraError && prev.FailureClass != result.NotRun {
		return prev
	}
	return nil
}

// clear removes an attempt's folder before it runs again; it never removes anything outside
// the run folder.
func (s *session) clear(dir string) error {
	rel, err := filepath.Rel(s.runDir(), dir)
	if err != nil || !filepath.IsLocal(rel) || strings.Count(filepath.ToSlash(rel), "/") != 1 {
		return fmt.Errorf("refusing to clear %s: not an attempt folder of run %s", dir, s.runDir())
	}
	return os.RemoveAll(dir)
}

// claim takes the cross-process claim on an attempt key: a lock file under the output root,
// released by the kernel if this process dies.
func (s *session) claim(ctx context.Context, key string) (*flock.Flock, error) {
	dir := filepath.Join(s.c.Out, ".claims")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	l := flock.New(filepath.Join(dir, key+".lock"))
	if _, err := l.TryLockContext(ctx, 200*time.Millisecond); err != nil {
		return nil, fmt.Errorf("claiming attempt %s: %w", key, err)
	}
	return l, nil
}

func (s *session) notRun(it *item, why error) error {
	now := time.Now().UTC()
	r := &result.Result{Schema: result.Schema, InstanceID: it.pred.InstanceID, Model: it.pred.Model,
		Project: it.in.Task.Project, PromptVariant: it.in.PromptVariant, Attempt: it.in.Attempt, Inputs: it.keys,
		FailureClass: result.NotRun, Reason: why.Error(), StartedAt: now, FinishedAt: now}
	if err := os.MkdirAll(it.dir, 0o755); err != nil {
		return err
	}
	if err := result.Write(filepath.Join(it.dir, "result.json"), r); err != nil {
		return err
	}
	s.settle(it, r, "not run")
	return nil
}

func (s *session) settle(it *item, r *result.Result, how string) {
	s.mu.Lock()
	it.res = r
	s.done++
	ev := Event{Done: s.done, Total: s.total, Model: it.pred.Model, Instance: it.pred.InstanceID,
		Verdict: verdictWord(r), How: how, Elapsed: time.Since(s.start)}
	if s.ran > 0 {
		per := s.attemptTime / time.Duration(s.ran)
		jobs := max(1, s.c.Jobs)
		ev.ETA = per * time.Duration(s.total-s.done) / time.Duration(jobs)
	}
	s.mu.Unlock()
	if s.c.Progress != nil {
		s.c.Progress(ev)
	}
}

func (s *session) collected(items []*item) []*result.Result {
	var out []*result.Result
	for _, it := range items {
		if it.res != nil {
			out = append(out, it.res)
		}
	}
	return out
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

// copyResult copies a run folder's result.json to dst for another (model, instance).
func copyResult(src, dst string, id result.Identity) (*result.Result, error) {
	r, err := result.Read(filepath.Join(src, "result.json"))
	if err != nil {
		return nil, err
	}
	r.SetIdentity(id)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, err
	}
	return r, result.Write(filepath.Join(dst, "result.json"), r)
}

func verdictWord(r *result.Result) string {
	if r.Resolved {
		return "resolved"
	}
	return "not resolved: " + r.FailureClass
}

// Load reads every result.json under a run folder (Out/RunID/<model>/<instance>/), sorted by
// model and instance: what `infradev report` regenerates reports from.
func Load(runDir string) ([]*result.Result, error) {
	files, err := filepath.Glob(filepath.Join(runDir, "*", "*", "result.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []*result.Result
	for _, f := range files {
		r, err := result.Read(f)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
