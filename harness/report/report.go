// Package report owns what is shown of many results: a pure function from results to a summary
// (SWE-bench's fields plus InfraDev's: probe rejection rate, failure classes, probe
// categories), written as a table, as JSON, or as JUnit XML.
package report

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/result"
)

// Schema is the schema version of the JSON report.
const Schema = "infradev.report/v1"

// Summary is the report of one run.
type Summary struct {
	Schema string         `json:"schema"`
	RunID  string         `json:"run_id"`
	Models []ModelSummary `json:"models"`
	// Projects and PromptVariants break the same results down another way.
	Projects       []Group `json:"projects"`
	PromptVariants []Group `json:"prompt_variants"`
	// Taxonomy counts every graded attempt's failure class and failed probe categories, per
	// model and prompt variant and per project.
	Taxonomy []TaxonomyRow `json:"taxonomy"`
	// PassAtK and Comparisons are for agents' runs (results with attempt numbers): pass@k per
	// model and variant, and each model's prompt variants compared over the same tasks.
	PassAtK     []PassAtK    `json:"pass_at_k,omitempty"`
	Comparisons []Comparison `json:"variant_comparisons,omitempty"`
}

// Group is the figures of the results sharing one project or prompt variant.
type Group struct {
	Name                string  `json:"name"`
	Submitted           int     `json:"submitted"`
	Completed           int     `json:"completed"`
	Resolved            int     `json:"resolved"`
	ResolutionRate      float64 `json:"resolution_rate"`
	PassedOfficialTests int     `json:"passed_official_tests"`
	ProbeRejected       int     `json:"probe_rejected"`
	ProbeRejectionRate  float64 `json:"probe_rejection_rate"`
	// Tampered counts submissions whose official tests' report showed forged outcomes.
	Tampered int `json:"tampered"`
}

// ModelSummary is one model's figures.
type ModelSummary struct {
	Model string `json:"model_name_or_path"`
	// PromptVariant is the prompt the submissions came from; Label names the row ("model", or
	// "model [variant]" where a model was given more than one prompt).
	PromptVariant       string `json:"prompt_variant,omitempty"`
	Label               string `json:"label"`
	SubmittedInstances  int    `json:"submitted_instances"`
	CompletedInstances  int    `json:"completed_instances"`
	ResolvedInstances   int    `json:"resolved_instances"`
	UnresolvedInstances int    `json:"unresolved_instances"`
	EmptyPatchInstances int    `json:"empty_patch_instances"`
	ErrorInstances      int    `json:"error_instances"`
	// ResolutionRate is resolved / completed; instances the harness could not run are left out.
	ResolutionRate float64 `json:"resolution_rate"`
	// PassedOfficialTests counts submissions that passed every official test.
	PassedOfficialTests int `json:"passed_official_tests"`
	// ProbeRejected counts those of them that a probe rejected.
	ProbeRejected      int     `json:"probe_rejected"`
	ProbeRejectionRate float64 `json:"probe_rejection_rate"`
	// TamperedInstances counts submissions caught forging outcomes (class tampered): counted
	// as unresolved, and shown apart.
	TamperedInstances int            `json:"tampered_instances"`
	FailureClasses    map[string]int `json:"failure_classes"`
	ProbeCategories   map[string]int `json:"failed_probe_categories"`
	// Resource use over the attempts that ran: mean wall time and the largest peak memory.
	MeanWallSeconds    float64 `json:"mean_wall_seconds"`
	MaxPeakMemoryBytes int64   `json:"max_peak_memory_bytes"`

	ResolvedIDs   []string   `json:"resolved_ids"`
	UnresolvedIDs []string   `json:"unresolved_ids"`
	EmptyPatchIDs []string   `json:"empty_patch_ids"`
	ErrorIDs      []string   `json:"error_ids"`
	TamperedIDs   []string   `json:"tampered_ids"`
	Instances     []Instance `json:"instances"`
}

// Instance is one row of the report.
type Instance struct {
	InstanceID   string `json:"instance_id"`
	Resolved     bool   `json:"resolved"`
	Verdict      string `json:"verdict"`
	FailureClass string `json:"failure_class,omitempty"`
	Reason       string `json:"reason,omitempty"`
	// Page is the instance's page, relative to the run folder (set by WriteRun).
	Page string `json:"page,omitempty"`
}

// Summarize builds the report of results (any order) for run runID. The per-model tables
// count each (model, prompt variant)'s first attempt at each task, as a single-attempt
// benchmark does; every attempt counts in the taxonomy and in pass@k.
func Summarize(runID string, results []*result.Result) Summary {
	type key struct{ model, variant string }
	byModel := map[key][]*result.Result{}
	variants := map[string]map[string]bool{}
	var first []*result.Result
	for _, r := range results {
		if r.Attempt > 1 {
			continue
		}
		first = append(first, r)
		k := key{r.Model, r.PromptVariant}
		byModel[k] = append(byModel[k], r)
		if variants[r.Model] == nil {
			variants[r.Model] = map[string]bool{}
		}
		variants[r.Model][r.PromptVariant] = true
	}
	keys := make([]key, 0, len(byModel))
	for k := range byModel {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].model != keys[j].model {
			return keys[i].model < keys[j].model
		}
		return keys[i].variant < keys[j].variant
	})
	s := Summary{Schema: Schema, RunID: runID}
	for _, k := range keys {
		rs := byModel[k]
		sort.Slice(rs, func(i, j int) bool { return rs[i].InstanceID < rs[j].InstanceID })
		ms := summarizeModel(k.model, rs)
		ms.PromptVariant, ms.Label = k.variant, k.model
		if len(variants[k.model]) > 1 {
			ms.Label = fmt.Sprintf("%s [%s]", k.model, k.variant)
		}
		s.Models = append(s.Models, ms)
	}
	s.Projects = groups(first, func(r *result.Result) string { return r.Project })
	s.PromptVariants = groups(first, func(r *result.Result) string { return r.PromptVariant })
	s.Taxonomy = taxonomy(results)
	s.PassAtK = passAtK(results)
	s.Comparisons = comparisons(results)
	return s
}

func groups(results []*result.Result, key func(*result.Result) string) []Group {
	by := map[string]*Group{}
	var names []string
	for _, r := range results {
		k := key(r)
		if k == "" {
			k = "unlabelled"
		}
		g := by[k]
		if g == nil {
			g = &Group{Name: k}
			by[k] = g
			names = append(names, k)
		}
		g.Submitted++
		if r.Resolved || result.IsSubmissionFailure(r.FailureClass) {
			g.Completed++
		}
		if r.Resolved {
			g.Resolved++
		}
		if r.FailureClass == result.Tampered {
			g.Tampered++
		}
		if t := r.Phase("tests"); t != nil && t.Status == result.StatusPassed {
			g.PassedOfficialTests++
			if r.FailureClass == result.ProbesFailed {
				g.ProbeRejected++
			}
		}
	}
	sort.Strings(names)
	out := make([]Group, 0, len(names))
	for _, n := range names {
		g := by[n]
		g.ResolutionRate = ratio(g.Resolved, g.Completed)
		g.ProbeRejectionRate = ratio(g.ProbeRejected, g.PassedOfficialTests)
		out = append(out, *g)
	}
	return out
}

func summarizeModel(model string, rs []*result.Result) ModelSummary {
	ran := 0
	ms := ModelSummary{Model: model, FailureClasses: map[string]int{}, ProbeCategories: map[string]int{},
		ResolvedIDs: []string{}, UnresolvedIDs: []string{}, EmptyPatchIDs: []string{}, ErrorIDs: []string{}, TamperedIDs: []string{}}
	for _, r := range rs {
		ms.SubmittedInstances++
		if r.EmptyPatch {
			ms.EmptyPatchInstances++
			ms.EmptyPatchIDs = append(ms.EmptyPatchIDs, r.InstanceID)
		}
		if r.FailureClass != "" {
			ms.FailureClasses[r.FailureClass]++
		}
		if r.FailureClass == result.Tampered {
			ms.TamperedInstances++
			ms.TamperedIDs = append(ms.TamperedIDs, r.InstanceID)
		}
		switch {
		case r.Resolved:
			ms.CompletedInstances++
			ms.ResolvedInstances++
			ms.ResolvedIDs = append(ms.ResolvedIDs, r.InstanceID)
		case result.IsSubmissionFailure(r.FailureClass):
			ms.CompletedInstances++
			ms.UnresolvedInstances++
			ms.UnresolvedIDs = append(ms.UnresolvedIDs, r.InstanceID)
		default:
			ms.ErrorInstances++
			ms.ErrorIDs = append(ms.ErrorIDs, r.InstanceID)
		}
		if t := r.Phase("tests"); t != nil && t.Status == result.StatusPassed {
			ms.PassedOfficialTests++
			if r.FailureClass == result.ProbesFailed {
				ms.ProbeRejected++
			}
		}
		for _, c := range r.FailedProbeCategories {
			ms.ProbeCategories[c]++
		}
		ms.Instances = append(ms.Instances, Instance{InstanceID: r.InstanceID, Resolved: r.Resolved,
			Verdict: Verdict(r), FailureClass: r.FailureClass, Reason: r.Reason})
		var wall float64
		for _, p := range r.Phases {
			wall += p.WallSeconds
			ms.MaxPeakMemoryBytes = max(ms.MaxPeakMemoryBytes, p.PeakMemoryBytes)
		}
		if len(r.Phases) > 0 {
			ms.MeanWallSeconds += wall
			ran++
		}
	}
	if ran > 0 {
		ms.MeanWallSeconds /= float64(ran)
	}
	ms.ResolutionRate = ratio(ms.ResolvedInstances, ms.CompletedInstances)
	ms.ProbeRejectionRate = ratio(ms.ProbeRejected, ms.PassedOfficialTests)
	return ms
}

// Verdict is the one-line verdict of a result: "resolved", "not resolved (tests)", ...
func Verdict(r *result.Result) string {
	switch r.FailureClass {
	case "":
		if r.Resolved {
			return "resolved"
		}
		return "not resolved"
	case result.PatchApplyFailed:
		return "not resolved (patch does not apply)"
	case result.OfficialTestsFailed:
		return "not resolved (tests)"
	case result.ProbesFailed:
		return "not resolved (probe: " + strings.Join(r.FailedProbeCategories, ", ") + ")"
	case result.Timeout:
		return "not resolved (timeout)"
	case result.OOM:
		return "not resolved (out of memory)"
	case result.Tampered:
		return "not resolved (tampered)"
	case result.TaskError:
		return "not run (task error)"
	case result.NotRun:
		return "not run: " + r.Reason
	}
	return "not run (infrastructure error)"
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// WriteTable writes the human report: one line per model, then one per instance.
func WriteTable(w io.Writer, s Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "MODEL\tSUBMITTED\tRESOLVED\tRATE\tPASSED TESTS\tPROBE-REJECTED\tREJECTION RATE\tTAMPERED\tERRORS\n")
	for _, m := range s.Models {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f%%\t%d\t%d\t%.1f%%\t%d\t%d\n", m.Label, m.SubmittedInstances, m.ResolvedInstances,
			100*m.ResolutionRate, m.PassedOfficialTests, m.ProbeRejected, 100*m.ProbeRejectionRate, m.TamperedInstances, m.ErrorInstances)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "MODEL\tINSTANCE\tVERDICT\tREASON\n")
	for _, m := range s.Models {
		for _, in := range m.Instances {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Label, in.InstanceID, in.Verdict, shorten(in.Reason, 120))
		}
	}
	return tw.Flush()
}

// WriteJSON writes the report as JSON to path, atomically.
func WriteJSON(path string, s Summary) error { return atomicfile.WriteJSON(path, s) }

func shorten(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}
