// Package skill owns distilling a failure analysis into a skill an agent can be given: a folder
// in the Agent Skills layout (SKILL.md with name and description front matter, and a reference
// file per project) holding a checklist ordered by what the probes and official tests caught
// most often, per project. It is built from failure classes, probe categories and counts only,
// never from probe ids, probe code, failure messages or gold patches, so giving it to an agent
// cannot leak a hidden check.
package skill

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/analyze"
	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/patchread"
	"github.com/infradev/infradev/harness/result"
)

// Name is the skill's name (lower case and hyphens, as the Agent Skills layout asks).
const Name = "infra-change-checklist"

// Guidance is the checklist item for each probe category and submission failure class:
// general advice about changes to training, inference and RL frameworks, written once.
var Guidance = map[string]string{
	"structural": "Put the change where the instruction says: the modules, classes, functions and signatures it names. " +
		"Do not move, rename or re-export existing public names, and keep old import paths working.",
	"state": "Check what state outlives a call. Returned tensors and buffers must not alias live internal state unless the " +
		"interface says so; save/load round-trips must restore everything (step counts, RNG and scheduler state); caches " +
		"must be invalidated when what they cache changes; per-rank state stays per-rank.",
	"interface": "Honour the interface exactly: argument names and defaults, return types and shapes, the errors raised on " +
		"bad input, and the edge cases the instruction mentions (empty inputs, None, missing keys, one rank).",
	"memory": "Do not add copies of large tensors or of whole state on the changed path; free what you no longer need. " +
		"Measure the path's peak memory (torch.cuda.max_memory_allocated, tracemalloc) before and after your change.",
	"time": "Do not add passes over the data, host-device synchronisation or Python loops over elements on the changed " +
		"path; time it (time.perf_counter, CUDA events) against the code it replaces.",
	"traffic": "Count the collectives: do not add all-reduce, all-gather or broadcast calls, or make them move more data, " +
		"than the change needs. Test with torch.distributed mocked to count calls and bytes.",
	result.OfficialTestsFailed: "Before you stop, run the repository's existing tests for every module you touched, and write " +
		"the tests the instruction implies: the hidden tests check the behaviour it specifies.",
	result.PatchApplyFailed: "Leave your work as changes in the working tree of the repository you were given: do not " +
		"reset or rewrite its history, and keep generated or binary files out of it.",
	result.Tampered: "Never edit test infrastructure (conftest.py, pytest configuration, assertion helpers) to make tests " +
		"pass: the outcome is checked independently and such a change fails the task.",
	result.Timeout: "Keep the changed code's running time close to the original's: runaway loops and waits on ranks that " +
		"never arrive time out.",
	result.OOM: "Watch memory on the changed path: an attempt that runs out of memory fails.",
}

// Item is one checklist item: what it is about, how often it was seen, and the guidance.
type Item struct {
	Topic string // a probe category or a failure class
	Count int
	Text  string
}

// Project is one project's checklist.
type Project struct {
	Name   string
	Graded int
	Items  []Item
}

// Skill is a distilled skill.
type Skill struct {
	RunID    string
	Projects []Project
	// OwnTests is the share of test-adding submissions whose tests measured memory, time or
	// traffic, per measure, over the run.
	OwnTests map[string]float64
}

// Distill builds the skill from an analysis: per project, the probe categories and failure
// classes seen, most frequent first, each with its guidance.
func Distill(a *analyze.Analysis) *Skill {
	s := &Skill{RunID: a.RunID, OwnTests: map[string]float64{}}
	for _, r := range a.Taxonomy {
		if r.Project == "" {
			continue
		}
		p := Project{Name: r.Project, Graded: r.Graded}
		seen := map[string]int{}
		for c, n := range r.Categories {
			seen[c] += n
		}
		for c, n := range r.Classes {
			if c != result.ProbesFailed { // the categories say more than the class
				seen[c] += n
			}
		}
		for topic, n := range seen {
			if text, ok := Guidance[topic]; ok && n > 0 {
				p.Items = append(p.Items, Item{Topic: topic, Count: n, Text: text})
			}
		}
		sort.Slice(p.Items, func(i, j int) bool {
			if p.Items[i].Count != p.Items[j].Count {
				return p.Items[i].Count > p.Items[j].Count
			}
			return p.Items[i].Topic < p.Items[j].Topic
		})
		s.Projects = append(s.Projects, p)
	}
	with, checks := 0, map[string]int{}
	for _, o := range a.OwnTests {
		with += o.WithTests
		for m, n := range o.Checks {
			checks[m] += n
		}
	}
	for _, m := range patchread.Measures {
		if with > 0 {
			s.OwnTests[m] = float64(checks[m]) / float64(with)
		}
	}
	return s
}

// Write writes the skill into dir: SKILL.md and references/<project>.md.
func (s *Skill) Write(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "references"), 0o755); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "---\nname: %s\ndescription: %s\n---\n\n", Name, s.description())
	b.WriteString("# Checklist for changes to training, inference and RL frameworks\n\n")
	b.WriteString("Hidden checks judge such changes on more than the tests in the repository: the structure the\n" +
		"instruction names, the state that outlives a call, the exact interface, memory, time and\n" +
		"collective traffic. Work through the checklist for the project you are changing before you stop.\n\n")
	b.WriteString("## Always\n\n")
	b.WriteString("- Read the instruction's interface section twice; implement every name, argument and behaviour it lists.\n")
	b.WriteString("- " + Guidance[result.OfficialTestsFailed] + "\n")
	var weak []string
	for _, m := range patchread.Measures {
		if share, ok := s.OwnTests[m]; ok && share < 0.5 {
			weak = append(weak, m)
		}
	}
	if len(weak) > 0 {
		fmt.Fprintf(&b, "- Add a test of your own that measures %s on the changed path; most tests written for these changes did not.\n", strings.Join(weak, ", "))
	}
	for _, p := range s.Projects {
		fmt.Fprintf(&b, "\n## %s\n\nWhat was caught most often first (details: references/%s.md).\n\n", p.Name, p.Name)
		if len(p.Items) == 0 {
			b.WriteString("- Nothing was caught in this project; follow the general items above.\n")
		}
		for _, it := range p.Items {
			fmt.Fprintf(&b, "- [ ] **%s**: %s\n", it.Topic, it.Text)
		}
		var ref strings.Builder
		fmt.Fprintf(&ref, "# %s: what the checks caught\n\nFrom %d graded attempts of run %s, counted by failure class and by the category of the\nprobe that failed.\n\n| topic | times caught |\n|---|---:|\n", p.Name, p.Graded, s.RunID)
		for _, it := range p.Items {
			fmt.Fprintf(&ref, "| %s | %d |\n", it.Topic, it.Count)
		}
		if err := atomicfile.Write(filepath.Join(dir, "references", p.Name+".md"), []byte(ref.String())); err != nil {
			return err
		}
	}
	return atomicfile.Write(filepath.Join(dir, "SKILL.md"), []byte(b.String()))
}

func (s *Skill) description() string {
	var names []string
	for _, p := range s.Projects {
		names = append(names, p.Name)
	}
	return fmt.Sprintf("Checklist for changing training, inference and RL-framework code (%s): structure, state, "+
		"interfaces, memory, time and collective traffic, ordered by what hidden checks caught most often. Use it "+
		"before finishing such a change.", strings.Join(names, ", "))
}
