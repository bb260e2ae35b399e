// Package samples owns a task's sample submissions: probes/<project>/<id>/samples.yaml lists
// patches made to check the task itself (wrong fixes that the probes must catch, a patch that
// does not apply, one that tampers with the tests), each with the verdict it must get. They
// give every probe evidence of discriminating power and feed the demo prediction files.
package samples

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/specfile"
)

// Schema is the schema version this package reads.
const Schema = "infradev.samples/v1"

// File is the samples file's name inside a task's probes directory.
const File = "samples.yaml"

// Wants are the verdicts a sample may be built to get.
var Wants = []string{"resolved", result.PatchApplyFailed, result.OfficialTestsFailed, result.ProbesFailed, result.Tampered}

// Set is a task's samples.
type Set struct {
	Schema  string   `yaml:"schema"`
	Task    string   `yaml:"task"`
	Samples []Sample `yaml:"samples"`

	// Dir is the directory the patch paths are relative to.
	Dir string `yaml:"-"`
}

// Sample is one patch and the verdict it was built to get.
type Sample struct {
	Name        string `yaml:"name"`
	Patch       string `yaml:"patch"`
	Description string `yaml:"description"`
	// Want is "resolved" or the failure class the sample must end in.
	Want string `yaml:"want"`
	// FailingProbes are exactly the probes that must fail, when Want is probes_failed.
	FailingProbes []string `yaml:"failing_probes"`
	// On is "gold" when the patch is written on top of the gold tree (how an upstream task's
	// samples are kept: a few lines over gold, no upstream file); empty means on the base.
	On string `yaml:"on"`
}

var nameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// Load reads dir/samples.yaml for task taskID and checks it against the task's probes. A task
// without the file has no samples: Load returns nil, nil.
func Load(dir, taskID string, ps *probe.Set) (*Set, error) {
	file := filepath.Join(dir, File)
	if _, err := os.Stat(file); os.IsNotExist(err) {
		return nil, nil
	}
	s := &Set{}
	doc := specfile.ReadFile(file, s)
	if !doc.Parsed() {
		return nil, doc.Errs.Err()
	}
	s.Dir = dir
	if s.Schema != Schema {
		doc.Errorf("schema", "must be %q, got %q", Schema, s.Schema)
	}
	if s.Task != taskID {
		doc.Errorf("task", "must be the task's id %q, got %q", taskID, s.Task)
	}
	probes := map[string]bool{}
	for _, p := range ps.Probes {
		probes[p.ID] = true
	}
	names := map[string]bool{}
	for i, sm := range s.Samples {
		at := func(f string) string { return fmt.Sprintf("samples[%d].%s", i, f) }
		switch {
		case !nameRe.MatchString(sm.Name):
			doc.Errorf(at("name"), "must match %s, got %q", nameRe, sm.Name)
		case names[sm.Name] || sm.Name == "gold" || sm.Name == "empty":
			doc.Errorf(at("name"), "%q is taken (gold and empty are implicit)", sm.Name)
		}
		names[sm.Name] = true
		if fi, err := os.Stat(filepath.Join(dir, sm.Patch)); sm.Patch == "" || !filepath.IsLocal(sm.Patch) || err != nil || !fi.Mode().IsRegular() {
			doc.Errorf(at("patch"), "%q is not a file inside %s", sm.Patch, dir)
		}
		if sm.On != "" && sm.On != "gold" {
			doc.Errorf(at("on"), "must be gold or left out, got %q", sm.On)
		}
		if !slices.Contains(Wants, sm.Want) {
			doc.Errorf(at("want"), "must be one of %s, got %q", strings.Join(Wants, ", "), sm.Want)
		}
		switch {
		case sm.Want == result.ProbesFailed && len(sm.FailingProbes) == 0:
			doc.Errorf(at("failing_probes"), "must name the probes that fail, since want is %s", result.ProbesFailed)
		case sm.Want != result.ProbesFailed && len(sm.FailingProbes) > 0:
			doc.Errorf(at("failing_probes"), "is only for want: %s", result.ProbesFailed)
		}
		for j, id := range sm.FailingProbes {
			if !probes[id] {
				doc.Errorf(fmt.Sprintf("samples[%d].failing_probes[%d]", i, j), "%q is not a probe of %s", id, taskID)
			}
		}
	}
	if err := doc.Errs.Err(); err != nil {
		return nil, err
	}
	return s, nil
}

// OnGold turns a diff written on top of the gold tree into a submission against the base
// (upstream.OnGold with the task's mirror); nil where no sample is written on gold.
type OnGold func(diff []byte) ([]byte, error)

// Read returns a sample's submission: its patch, or for a sample written on the gold tree, the
// patch composed with gold by onGold.
func (s *Set) Read(sm Sample, onGold OnGold) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(s.Dir, sm.Patch))
	if err != nil || sm.On != "gold" {
		return data, err
	}
	if onGold == nil {
		return nil, fmt.Errorf("sample %s is written on gold: its task's repository is needed (a mirror)", sm.Name)
	}
	out, err := onGold(data)
	if err != nil {
		return nil, fmt.Errorf("sample %s: %w", sm.Name, err)
	}
	return out, nil
}

// Uncovered returns, sorted, the probes that no sample is built to fail: probes without
// evidence that they can tell a wrong fix from a right one.
func (s *Set) Uncovered(ps *probe.Set) []string {
	covered := map[string]bool{}
	if s != nil {
		for _, sm := range s.Samples {
			for _, id := range sm.FailingProbes {
				covered[id] = true
			}
		}
	}
	var out []string
	for _, p := range ps.Probes {
		if !covered[p.ID] {
			out = append(out, p.ID)
		}
	}
	return out
}

// Verdict is what a result shows of a sample: "resolved" or its failure class, and the probes
// that failed (sorted).
func Verdict(r *result.Result) (string, []string) {
	want := r.FailureClass
	if r.Resolved {
		want = "resolved"
	}
	var failed []string
	if p := r.Phase("probes"); p != nil {
		for _, o := range p.Tests {
			if o.Outcome != result.StatusPassed && o.Probe != "" {
				failed = append(failed, o.Probe)
			}
		}
	}
	sort.Strings(failed)
	return want, failed
}

// Check compares a sample's result with what it was built to get; it returns "" on a match,
// else what differs.
func (sm Sample) Check(r *result.Result) string {
	got, failed := Verdict(r)
	if got != sm.Want {
		return fmt.Sprintf("%s: got %s (%s), want %s", sm.Name, got, r.Reason, sm.Want)
	}
	if sm.Want == result.ProbesFailed {
		want := slices.Clone(sm.FailingProbes)
		sort.Strings(want)
		if !slices.Equal(failed, want) {
			return fmt.Sprintf("%s: probes failed [%s], want [%s]", sm.Name, strings.Join(failed, " "), strings.Join(want, " "))
		}
	}
	return ""
}
