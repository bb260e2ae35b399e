// Package analyze owns the failure analysis of a run: a pure reading of its stored results and
// submissions (nothing is run). It gives the failure taxonomy per model, prompt variant,
// project and probe category with examples linked to their folders; the agents' own tests
// (which submissions added tests, and whether those tests measure memory, time or traffic,
// read statically from the diff); and contamination: the submissions whose non-test code
// reproduces the upstream change near-verbatim, so a resolution rate can be read with and
// without them. Package skill distils guidance from an Analysis.
package analyze

import (
	"errors"
	"os"
	"path/filepath"
	"sort"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/patchread"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
)

// Schema is the schema version of analysis.json.
const Schema = "infradev.analysis/v1"

// Analysis is the failure analysis of one run.
type Analysis struct {
	Schema string `json:"schema"`
	RunID  string `json:"run_id"`
	// Taxonomy, PassAtK and Comparisons are the report's (package report).
	Taxonomy    []report.TaxonomyRow `json:"taxonomy"`
	PassAtK     []report.PassAtK     `json:"pass_at_k,omitempty"`
	Comparisons []report.Comparison  `json:"variant_comparisons,omitempty"`
	// Examples are failed attempts, a few per model and failure (class, or probe category).
	Examples []Example `json:"examples"`
	// OwnTests are the agents' own tests, per model and prompt variant.
	OwnTests []OwnTests `json:"own_tests"`
	// Contamination is per model and prompt variant.
	Contamination []Contamination `json:"contamination"`
	// Threshold is the similarity to gold above which a submission counts as near-verbatim.
	Threshold float64 `json:"contamination_threshold"`
}

// Example is one failed attempt.
type Example struct {
	Model         string   `json:"model"`
	PromptVariant string   `json:"prompt_variant,omitempty"`
	Attempt       int      `json:"attempt,omitempty"`
	InstanceID    string   `json:"instance_id"`
	Project       string   `json:"project"`
	Failure       string   `json:"failure"` // a failure class, or "probe: <category>"
	FailedProbes  []string `json:"failed_probes,omitempty"`
	Reason        string   `json:"reason,omitempty"`
	// Dir is the graded attempt's folder, relative to the run folder; AgentDir the agent's
	// attempt folder (transcript, logs), where the run was an agent's.
	Dir      string `json:"dir"`
	AgentDir string `json:"agent_dir,omitempty"`
}

// OwnTests is what one model's submissions did about tests.
type OwnTests struct {
	Model         string `json:"model"`
	PromptVariant string `json:"prompt_variant,omitempty"`
	// Submissions are the non-empty graded submissions; WithTests those adding or changing a
	// test file.
	Submissions int `json:"submissions"`
	WithTests   int `json:"with_tests"`
	// Checks counts, per measure (memory, time, traffic), the submissions with tests whose
	// added test code measures it.
	Checks map[string]int `json:"checks"`
	// Shares: WithTests / Submissions, and each check / WithTests.
	WithTestsShare float64            `json:"with_tests_share"`
	CheckShares    map[string]float64 `json:"check_shares"`
	Instances      []OwnTestsInstance `json:"instances,omitempty"`
}

// OwnTestsInstance is one submission's tests.
type OwnTestsInstance struct {
	InstanceID string                `json:"instance_id"`
	Attempt    int                   `json:"attempt,omitempty"`
	Tests      []patchread.AddedTest `json:"tests"`
}

// Contamination is how many of a model's submissions reproduce the upstream change.
type Contamination struct {
	Model         string `json:"model"`
	PromptVariant string `json:"prompt_variant,omitempty"`
	// Compared are the non-empty graded submissions whose task's gold was available.
	Compared     int          `json:"compared"`
	NearVerbatim []Similarity `json:"near_verbatim"`
	// Resolved and ResolutionRate over every graded submission; the Without figures leave
	// the near-verbatim ones out.
	Graded                int     `json:"graded"`
	Resolved              int     `json:"resolved"`
	ResolutionRate        float64 `json:"resolution_rate"`
	GradedWithout         int     `json:"graded_without"`
	ResolvedWithout       int     `json:"resolved_without"`
	ResolutionRateWithout float64 `json:"resolution_rate_without"`
	// Unavailable lists tasks whose gold could not be read (e.g. an upstream task whose
	// derivation is neither stored nor derivable without its mirror).
	Unavailable []string `json:"gold_unavailable,omitempty"`
}

// Similarity is one submission's similarity to gold.
type Similarity struct {
	InstanceID string  `json:"instance_id"`
	Attempt    int     `json:"attempt,omitempty"`
	Value      float64 `json:"similarity"`
	Resolved   bool    `json:"resolved"`
}

// Config is what an analysis reads.
type Config struct {
	// RunDir is the run folder (results at <run>/<model>/<instance>/result.json).
	RunDir string
	// Gold returns a task's gold patch; an error leaves the task out of the contamination
	// check (and names it).
	Gold func(instanceID string) ([]byte, error)
	// ExamplesPer bounds examples per model and failure. Default 3.
	ExamplesPer int
}

// Run analyses a run folder.
func Run(c Config) (*Analysis, error) {
	stored, err := report.LoadRun(c.RunDir)
	if err != nil {
		return nil, err
	}
	if len(stored) == 0 {
		return nil, fault.Inputf("%s holds no results (<run>/<model>/<instance>/result.json)", c.RunDir)
	}
	results := make([]*result.Result, len(stored))
	for i, s := range stored {
		results[i] = s.Result
	}
	sum := report.Summarize(filepath.Base(c.RunDir), results)
	a := &Analysis{Schema: Schema, RunID: sum.RunID, Taxonomy: sum.Taxonomy, PassAtK: sum.PassAtK,
		Comparisons: sum.Comparisons, Threshold: patchread.Contaminated, Examples: []Example{}}
	per := c.ExamplesPer
	if per == 0 {
		per = 3
	}
	seen := map[[2]string]int{}
	own := map[[2]string]*OwnTests{}
	contam := map[[2]string]*Contamination{}
	var keys [][2]string
	gold := map[string][]byte{}
	goldErr := map[string]error{}
	for _, s := range stored {
		r := s.Result
		if !r.Resolved && !result.IsSubmissionFailure(r.FailureClass) {
			continue // not graded: an infrastructure or task fault says nothing of the submission
		}
		k := [2]string{r.Model, r.PromptVariant}
		if own[k] == nil {
			own[k] = &OwnTests{Model: r.Model, PromptVariant: r.PromptVariant, Checks: map[string]int{}, CheckShares: map[string]float64{}}
			contam[k] = &Contamination{Model: r.Model, PromptVariant: r.PromptVariant, NearVerbatim: []Similarity{}}
			keys = append(keys, k)
		}
		rel, _ := filepath.Rel(c.RunDir, s.Dir)
		if !r.Resolved {
			// A probe failure is filed under its categories, which say more than the class.
			failures := []string{r.FailureClass}
			if r.FailureClass == result.ProbesFailed && len(r.FailedProbeCategories) > 0 {
				failures = failures[:0]
				for _, cat := range r.FailedProbeCategories {
					failures = append(failures, "probe: "+cat)
				}
			}
			for _, f := range failures {
				fk := [2]string{r.Model, f}
				if seen[fk] >= per {
					continue
				}
				seen[fk]++
				a.Examples = append(a.Examples, Example{Model: r.Model, PromptVariant: r.PromptVariant, Attempt: r.Attempt,
					InstanceID: r.InstanceID, Project: r.Project, Failure: f, FailedProbes: failedProbes(r), Reason: r.Reason,
					Dir: rel, AgentDir: agentDir(c.RunDir, rel)})
			}
		}
		patch, err := os.ReadFile(filepath.Join(s.Dir, "submission.patch"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		ct := contam[k]
		ct.Graded++
		if r.Resolved {
			ct.Resolved++
		}
		if len(patch) == 0 || r.EmptyPatch {
			ct.GradedWithout++
			if r.Resolved {
				ct.ResolvedWithout++
			}
			continue
		}
		ot := own[k]
		ot.Submissions++
		tests, err := patchread.Tests(patch)
		if err == nil && len(tests) > 0 {
			ot.WithTests++
			measured := map[string]bool{}
			for _, t := range tests {
				for _, ch := range t.Checks {
					measured[ch] = true
				}
			}
			for ch := range measured {
				ot.Checks[ch]++
			}
			ot.Instances = append(ot.Instances, OwnTestsInstance{InstanceID: r.InstanceID, Attempt: r.Attempt, Tests: tests})
		}
		if _, ok := gold[r.InstanceID]; !ok && goldErr[r.InstanceID] == nil {
			if c.Gold == nil {
				goldErr[r.InstanceID] = errors.New("no gold reader")
			} else if g, err := c.Gold(r.InstanceID); err != nil {
				goldErr[r.InstanceID] = err
			} else {
				gold[r.InstanceID] = g
			}
		}
		near := false
		if g, ok := gold[r.InstanceID]; ok {
			if sim, err := patchread.Similarity(patch, g); err == nil {
				ct.Compared++
				if sim >= patchread.Contaminated {
					near = true
					ct.NearVerbatim = append(ct.NearVerbatim, Similarity{InstanceID: r.InstanceID, Attempt: r.Attempt, Value: sim, Resolved: r.Resolved})
				}
			}
		} else if !contains(ct.Unavailable, r.InstanceID) {
			ct.Unavailable = append(ct.Unavailable, r.InstanceID)
		}
		if !near {
			ct.GradedWithout++
			if r.Resolved {
				ct.ResolvedWithout++
			}
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		ot := own[k]
		ot.WithTestsShare = ratio(ot.WithTests, ot.Submissions)
		for _, m := range patchread.Measures {
			ot.CheckShares[m] = ratio(ot.Checks[m], ot.WithTests)
		}
		a.OwnTests = append(a.OwnTests, *ot)
		ct := contam[k]
		ct.ResolutionRate = ratio(ct.Resolved, ct.Graded)
		ct.ResolutionRateWithout = ratio(ct.ResolvedWithout, ct.GradedWithout)
		sort.Strings(ct.Unavailable)
		a.Contamination = append(a.Contamination, *ct)
	}
	return a, nil
}

// Write writes analysis.json and analysis.md into the run folder.
func Write(runDir string, a *Analysis) error {
	if err := atomicfile.WriteJSON(filepath.Join(runDir, "analysis.json"), a); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(runDir, "analysis.md"), []byte(Markdown(a)))
}

// failedProbes names the probes that judged a submission wrong (a verdict of probes_failed).
func failedProbes(r *result.Result) []string {
	if r.FailureClass != result.ProbesFailed {
		return nil
	}
	var out []string
	for _, p := range r.Phases {
		for _, t := range p.Tests {
			if t.Probe != "" && (t.Outcome == "failed" || t.Outcome == "error" || t.Outcome == result.OverBudget || t.Outcome == "missing") {
				out = append(out, t.Probe)
			}
		}
	}
	sort.Strings(out)
	return out
}

// agentDir is the agent's attempt folder beside a graded attempt (agent/<same path>), if any.
func agentDir(runDir, rel string) string {
	d := filepath.Join("agent", rel)
	if _, err := os.Stat(filepath.Join(runDir, d, "agent.json")); err == nil {
		return d
	}
	return ""
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}
