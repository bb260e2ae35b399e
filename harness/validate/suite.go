package validate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/mirror"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/samples"
	"github.com/infradev/infradev/harness/specfile"
	"github.com/infradev/infradev/harness/suite"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/upstream"
)

// Item is one task to validate: its spec, probes and samples, loaded and checked.
type Item struct {
	Task    *task.Task
	Probes  *probe.Set
	Samples *samples.Set
	// TaskDigest and ProbesDigest are the task and its probes as validation found them (with
	// SpecOptions.Digests): a record vouches for these, and is refused if they change.
	TaskDigest, ProbesDigest string
}

// SpecOptions are what checking specs needs.
type SpecOptions struct {
	ProbesRoot string
	// Store holds upstream tasks' stored derivations; Mirrors their repositories.
	Store   string
	Mirrors mirror.Map
	// Digests computes each item's digests, for a record.
	Digests bool
}

// Specs loads and checks every task directory's spec, probes and samples, and returns the items
// and the upstream tasks that could only be checked offline (no mirror and nothing stored).
// Every problem of every file is collected and returned together, as specfile.Errors: the
// task's schema, its probes', the instruction naming the interfaces the probes use, nothing of
// the upstream repository checked in, and a sample built to fail each probe.
func Specs(ctx context.Context, dirs []string, o SpecOptions) ([]Item, []string, error) {
	var items []Item
	var offline []string
	var errs specfile.Errors
	collect := func(err error) {
		var se specfile.Errors
		if errors.As(err, &se) {
			errs = append(errs, se...)
		} else if err != nil {
			errs = append(errs, specfile.FieldError{Msg: err.Error()})
		}
	}
	for _, d := range dirs {
		t, err := task.Load(d)
		if err != nil {
			collect(err)
			continue
		}
		p, err := probe.Load(task.ProbesDir(o.ProbesRoot, d), t.ID)
		if err != nil {
			collect(err)
			continue
		}
		if t.Upstream() {
			err := upstream.Attach(ctx, o.Store, t, o.Mirrors)
			switch {
			case errors.Is(err, mirror.ErrNotFound):
				offline = append(offline, t.ID)
			case err != nil:
				return nil, nil, err
			}
			gitDir, _ := o.Mirrors.Resolve(t.Repo.URL, t.Repo.BaseCommit)
			problems, err := upstream.Provenance(ctx, []string{t.Dir, p.Dir}, gitDir)
			if err != nil {
				return nil, nil, err
			}
			for _, pr := range problems {
				errs = append(errs, specfile.FieldError{Msg: pr})
			}
		}
		if err := suite.CheckInstruction(t, p); err != nil {
			errs = append(errs, specfile.FieldError{File: t.File(t.Instruction), Msg: err.Error()})
			continue
		}
		ss, err := samples.Load(p.Dir, t.ID, p)
		if err != nil {
			collect(err)
			continue
		}
		if un := ss.Uncovered(p); len(un) > 0 {
			errs = append(errs, specfile.FieldError{File: filepath.Join(p.Dir, samples.File),
				Msg: fmt.Sprintf("no sample is built to fail probe(s) %s: add a wrong patch each of them catches", strings.Join(un, ", "))})
			continue
		}
		it := Item{Task: t, Probes: p, Samples: ss}
		if o.Digests {
			if it.TaskDigest, it.ProbesDigest, err = Digests(t, p.Dir); err != nil {
				return nil, nil, err
			}
		}
		items = append(items, it)
	}
	if err := errs.Err(); err != nil {
		return nil, nil, err
	}
	return items, offline, nil
}

// Baseline writes the budgeted probes' gold figures (the largest over the runs) to the probes'
// baseline.json when there is none or when update is set, and says what it did.
func Baseline(t *task.Task, ps *probe.Set, golds []*result.Result, image, harness string, update bool) (string, error) {
	if ps.Baseline != nil && !update {
		return "baseline.json kept (--update-baseline rewrites it)", nil
	}
	b := &probe.Baseline{Task: t.ID, Environment: image, Harness: harness, Runs: len(golds), Probes: map[string]probe.Figures{}}
	for _, g := range golds {
		p := g.Phase("probes")
		if p == nil {
			continue
		}
		for _, o := range p.Tests {
			f := b.Probes[o.Probe]
			f.PeakMemoryBytes = max(f.PeakMemoryBytes, o.PeakMemoryBytes)
			f.WallSeconds = max(f.WallSeconds, o.WallSeconds)
			f.CPUSeconds = max(f.CPUSeconds, o.CPUSeconds)
			if o.PeakMemoryBytes > 0 {
				b.Probes[o.Probe] = f
			}
		}
	}
	if err := probe.WriteBaseline(ps.Dir, b); err != nil {
		return "", err
	}
	var parts []string
	for id, f := range b.Probes {
		parts = append(parts, fmt.Sprintf("%s peak %.1fMiB wall %.2fs cpu %.2fs", id, float64(f.PeakMemoryBytes)/(1<<20), f.WallSeconds, f.CPUSeconds))
	}
	return "baseline.json written: " + strings.Join(parts, "; "), nil
}

// RecordPinned writes a passing task's validation record: the digests of what was validated,
// the environment's locked manifest, the harness and the hardware. It refuses when the
// environment's env.lock (in envDir) does not pin the image the validation ran on (an unlocked
// edit, or a lock rewritten while it ran): the record would vouch for an image nobody validated.
func RecordPinned(it Item, envDir, ranOn, harness, hardware string, rep *Report, now time.Time) error {
	lock, err := image.ReadLock(envDir)
	if err != nil {
		return err
	}
	if lock == nil || lock.Manifest != ranOn {
		pinned := "nothing"
		if lock != nil {
			pinned = lock.Manifest
		}
		return fmt.Errorf("%s: no validation record for %s: %s pins %s but the validation ran on %s (write the lock, then validate again)",
			it.Task.ID, it.Probes.Dir, filepath.Join(envDir, image.LockFile), pinned, ranOn)
	}
	rec, err := NewRecord(rep, it.Task, it.Probes.Dir, it.TaskDigest, it.ProbesDigest, lock.Manifest, harness, hardware, now)
	if err != nil {
		return err
	}
	if full := map[string]string{"gpu-pending": "gpu", "cpu-pending": "cpu"}[rec.Status]; full != "" {
		// A machine with too few GPUs, or a gold-only run, does not undo a full validation.
		if old, err := ReadRecord(it.Probes.Dir); err == nil && old != nil && old.Status == full && !old.Legacy {
			if changed, err := old.Stale(it.Task, it.Probes.Dir, lock.Manifest); err == nil && changed == "" {
				return nil
			}
		}
	}
	return WriteRecord(it.Probes.Dir, rec)
}
