package report

import (
	"fmt"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/stats"
)

// TaxonomyRow is the failures of one model and prompt variant (Project empty), or of one
// project (Model empty), over every graded attempt.
type TaxonomyRow struct {
	Model         string `json:"model,omitempty"`
	PromptVariant string `json:"prompt_variant,omitempty"`
	Project       string `json:"project,omitempty"`
	// Graded are attempts with a verdict (resolved or a submission failure).
	Graded   int `json:"graded"`
	Resolved int `json:"resolved"`
	// Classes counts failure classes; Categories counts failed probes' categories (an
	// attempt that failed probes of two categories counts in both).
	Classes    map[string]int `json:"failure_classes"`
	Categories map[string]int `json:"probe_categories"`
}

// PassAtK is pass@k for one model and prompt variant.
type PassAtK struct {
	Model         string `json:"model"`
	PromptVariant string `json:"prompt_variant"`
	Tasks         int    `json:"tasks"`
	// Attempts is the fewest graded attempts any of its tasks has: pass@k is given for k up to it.
	Attempts int              `json:"attempts"`
	PassAt   []stats.Estimate `json:"pass_at"` // index k-1
}

// Comparison compares two prompt variants of one model over the tasks both were graded on:
// B minus A in resolution rate (each task's share of resolved attempts), with a paired
// bootstrap interval and the exact sign (McNemar) test.
type Comparison struct {
	Model string `json:"model"`
	A     string `json:"variant_a"`
	B     string `json:"variant_b"`
	stats.Paired
}

// bootstrapSeed fixes the resampling, so one set of results always gives one report.
const bootstrapSeed = 20261201

func graded(r *result.Result) bool { return r.Resolved || result.IsSubmissionFailure(r.FailureClass) }

func taxonomy(results []*result.Result) []TaxonomyRow {
	rows := map[[3]string]*TaxonomyRow{}
	add := func(k [3]string, r *result.Result) {
		row := rows[k]
		if row == nil {
			row = &TaxonomyRow{Model: k[0], PromptVariant: k[1], Project: k[2], Classes: map[string]int{}, Categories: map[string]int{}}
			rows[k] = row
		}
		row.Graded++
		if r.Resolved {
			row.Resolved++
			return
		}
		row.Classes[r.FailureClass]++
		for _, c := range r.FailedProbeCategories {
			row.Categories[c]++
		}
	}
	for _, r := range results {
		if !graded(r) {
			continue
		}
		add([3]string{r.Model, r.PromptVariant, ""}, r)
		add([3]string{"", "", orUnlabelled(r.Project)}, r)
	}
	keys := make([][3]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	// Models first, then projects.
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if (a[2] == "") != (b[2] == "") {
			return a[2] == ""
		}
		return strings.Join(a[:], "\x00") < strings.Join(b[:], "\x00")
	})
	out := make([]TaxonomyRow, len(keys))
	for i, k := range keys {
		out[i] = *rows[k]
	}
	return out
}

func orUnlabelled(s string) string {
	if s == "" {
		return "unlabelled"
	}
	return s
}

// attemptsOf groups agents' graded attempts by (model, variant) and task.
func attemptsOf(results []*result.Result) map[[2]string]map[string]stats.Attempts {
	by := map[[2]string]map[string]stats.Attempts{}
	for _, r := range results {
		if r.Attempt < 1 || !graded(r) {
			continue
		}
		k := [2]string{r.Model, r.PromptVariant}
		if by[k] == nil {
			by[k] = map[string]stats.Attempts{}
		}
		a := by[k][r.InstanceID]
		a.N++
		if r.Resolved {
			a.C++
		}
		by[k][r.InstanceID] = a
	}
	return by
}

func passAtK(results []*result.Result) []PassAtK {
	by := attemptsOf(results)
	var out []PassAtK
	for k, tasks := range by {
		p := PassAtK{Model: k[0], PromptVariant: k[1], Tasks: len(tasks)}
		var list []stats.Attempts
		for _, a := range tasks {
			list = append(list, a)
			if p.Attempts == 0 || a.N < p.Attempts {
				p.Attempts = a.N
			}
		}
		for kk := 1; kk <= p.Attempts; kk++ {
			p.PassAt = append(p.PassAt, stats.PassAtKOver(list, kk, 0, bootstrapSeed))
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Model != out[j].Model {
			return out[i].Model < out[j].Model
		}
		return out[i].PromptVariant < out[j].PromptVariant
	})
	return out
}

// comparisons compares every pair of a model's prompt variants; a pair is ordered so that
// "instruction" (the default prompt) is A, else alphabetically.
func comparisons(results []*result.Result) []Comparison {
	by := attemptsOf(results)
	variants := map[string][]string{}
	for k := range by {
		variants[k[0]] = append(variants[k[0]], k[1])
	}
	var models []string
	for m := range variants {
		models = append(models, m)
	}
	sort.Strings(models)
	var out []Comparison
	for _, m := range models {
		vs := variants[m]
		sort.Slice(vs, func(i, j int) bool {
			if (vs[i] == "instruction") != (vs[j] == "instruction") {
				return vs[i] == "instruction"
			}
			return vs[i] < vs[j]
		})
		for i := 0; i < len(vs); i++ {
			for j := i + 1; j < len(vs); j++ {
				ta, tb := by[[2]string{m, vs[i]}], by[[2]string{m, vs[j]}]
				var ids []string
				for id := range ta {
					if _, ok := tb[id]; ok {
						ids = append(ids, id)
					}
				}
				if len(ids) == 0 {
					continue
				}
				sort.Strings(ids)
				a, b := make([]float64, len(ids)), make([]float64, len(ids))
				for n, id := range ids {
					a[n] = float64(ta[id].C) / float64(ta[id].N)
					b[n] = float64(tb[id].C) / float64(tb[id].N)
				}
				p, err := stats.ComparePaired(a, b, 0, bootstrapSeed)
				if err != nil {
					continue // cannot happen: equal lengths, rates in [0,1], at least one task
				}
				out = append(out, Comparison{Model: m, A: vs[i], B: vs[j], Paired: p})
			}
		}
	}
	return out
}

// writeAgentsMarkdown writes the taxonomy, pass@k and variant comparison sections.
func writeAgentsMarkdown(b *strings.Builder, s Summary) {
	if len(s.Taxonomy) > 0 {
		b.WriteString("\n## Failure taxonomy (every graded attempt)\n\n| model / project | variant | graded | resolved | " +
			strings.Join(taxonomyClasses, " | ") + " | " + strings.Join(probe.Categories, " | ") + " |\n|---|---|---:|---:|")
		b.WriteString(strings.Repeat("---:|", len(taxonomyClasses)+len(probe.Categories)) + "\n")
		for _, r := range s.Taxonomy {
			name := r.Model
			if r.Project != "" {
				name = "project " + r.Project
			}
			fmt.Fprintf(b, "| %s | %s | %d | %d |", name, r.PromptVariant, r.Graded, r.Resolved)
			for _, c := range taxonomyClasses {
				fmt.Fprintf(b, " %d |", r.Classes[c])
			}
			for _, c := range probe.Categories {
				fmt.Fprintf(b, " %d |", r.Categories[c])
			}
			b.WriteString("\n")
		}
	}
	if len(s.PassAtK) > 0 {
		b.WriteString("\n## pass@k (unbiased estimator; 95% bootstrap interval over tasks)\n\n| model | variant | tasks | attempts | pass@k |\n|---|---|---:|---:|---|\n")
		for _, p := range s.PassAtK {
			fmt.Fprintf(b, "| %s | %s | %d | %d | %s |\n", p.Model, p.PromptVariant, p.Tasks, p.Attempts, passAtText(p))
		}
	}
	if len(s.Comparisons) > 0 {
		b.WriteString("\n## Prompt variants compared (paired over the same tasks)\n\n| model | A | B | tasks | A rate | B rate | B − A | 95% interval | B better / A better | exact p |\n|---|---|---|---:|---:|---:|---:|---|---|---:|\n")
		for _, c := range s.Comparisons {
			fmt.Fprintf(b, "| %s | %s | %s | %d | %.1f%% | %.1f%% | %+.1f pts | [%+.1f, %+.1f] | %d / %d | %.3g |\n", c.Model, c.A, c.B, c.Tasks,
				100*c.MeanA, 100*c.MeanB, 100*c.Diff, 100*c.DiffCI.Lo, 100*c.DiffCI.Hi, c.BetterB, c.BetterA, c.PValue)
		}
	}
}

// taxonomyClasses are the failure classes a submission can earn, in the taxonomy's order.
var taxonomyClasses = []string{result.PatchApplyFailed, result.OfficialTestsFailed, result.ProbesFailed, result.Timeout, result.OOM, result.Tampered}

func passAtText(p PassAtK) string {
	var parts []string
	for i, e := range p.PassAt {
		parts = append(parts, fmt.Sprintf("@%d %.1f%% [%.1f, %.1f]", i+1, 100*e.Value, 100*e.CI.Lo, 100*e.CI.Hi))
	}
	return strings.Join(parts, "; ")
}
