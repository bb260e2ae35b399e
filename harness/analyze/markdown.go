package analyze

import (
	"fmt"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/patchread"
	"github.com/infradev/infradev/harness/report"
)

// Markdown renders an analysis for people: the taxonomy, pass@k and variant comparisons, the
// agents' own tests, contamination, and the examples with links to their folders.
func Markdown(a *Analysis) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Failure analysis: %s\n", a.RunID)

	b.WriteString("\n## Failure taxonomy (every graded attempt)\n\n| model / project | variant | graded | resolved | failure classes | probe categories |\n|---|---|---:|---:|---|---|\n")
	for _, r := range a.Taxonomy {
		name := r.Model
		if r.Project != "" {
			name = "project " + r.Project
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %s | %s |\n", name, r.PromptVariant, r.Graded, r.Resolved, counts(r.Classes), counts(r.Categories))
	}
	cats := map[string]int{}
	for _, r := range a.Taxonomy {
		if r.Project != "" {
			for c, n := range r.Categories {
				cats[c] += n
			}
		}
	}
	if len(cats) > 0 {
		fmt.Fprintf(&b, "\nProbe categories, most common first: %s.\n", ranked(cats))
	}

	if len(a.PassAtK) > 0 {
		b.WriteString("\n## pass@k (unbiased estimator; 95% bootstrap interval over tasks)\n\n| model | variant | tasks | attempts | pass@k |\n|---|---|---:|---:|---|\n")
		for _, p := range a.PassAtK {
			var parts []string
			for i, e := range p.PassAt {
				parts = append(parts, fmt.Sprintf("@%d %.1f%% [%.1f, %.1f]", i+1, 100*e.Value, 100*e.CI.Lo, 100*e.CI.Hi))
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %s |\n", p.Model, p.PromptVariant, p.Tasks, p.Attempts, strings.Join(parts, "; "))
		}
	}
	if len(a.Comparisons) > 0 {
		b.WriteString("\n## Prompt variants compared (paired over the same tasks)\n\n| model | A | B | tasks | A rate | B rate | B − A | 95% interval | B better / A better | exact p |\n|---|---|---|---:|---:|---:|---:|---|---|---:|\n")
		for _, c := range a.Comparisons {
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %.1f%% | %.1f%% | %+.1f pts | [%+.1f, %+.1f] | %d / %d | %.3g |\n", c.Model, c.A, c.B, c.Tasks,
				100*c.MeanA, 100*c.MeanB, 100*c.Diff, 100*c.DiffCI.Lo, 100*c.DiffCI.Hi, c.BetterB, c.BetterA, c.PValue)
		}
	}

	b.WriteString("\n## The agents' own tests\n\nOf the non-empty submissions, the share that added or changed a test file; of those, the share whose added test code measures memory, time or collective traffic (a static reading of the diff).\n\n| model | variant | submissions | with tests | memory | time | traffic |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, o := range a.OwnTests {
		fmt.Fprintf(&b, "| %s | %s | %d | %d (%.0f%%) |", o.Model, o.PromptVariant, o.Submissions, o.WithTests, 100*o.WithTestsShare)
		for _, m := range patchread.Measures {
			fmt.Fprintf(&b, " %d (%.0f%%) |", o.Checks[m], 100*o.CheckShares[m])
		}
		b.WriteString("\n")
	}

	fmt.Fprintf(&b, "\n## Contamination\n\nSubmissions whose added non-test code has a token-level similarity of at least %.2f to the upstream change (2·LCS/(|a|+|b|) over tokens), and the resolution rate with and without them.\n\n| model | variant | compared | near-verbatim | resolution rate | without near-verbatim | gold unavailable |\n|---|---|---:|---:|---:|---:|---|\n", a.Threshold)
	for _, c := range a.Contamination {
		var near []string
		for _, s := range c.NearVerbatim {
			near = append(near, fmt.Sprintf("%s %.2f", s.InstanceID, s.Value))
		}
		nearText := fmt.Sprint(len(c.NearVerbatim))
		if len(near) > 0 {
			nearText += " (" + strings.Join(near, ", ") + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s |\n", c.Model, c.PromptVariant, c.Compared, nearText,
			rate(c.Resolved, c.Graded), rate(c.ResolvedWithout, c.GradedWithout), strings.Join(c.Unavailable, ", "))
	}

	b.WriteString("\n## Examples\n\n| model | variant | instance | failure | failed probes | folder |\n|---|---|---|---|---|---|\n")
	for _, e := range a.Examples {
		link := fmt.Sprintf("[result](%s)", report.Href(e.Dir))
		if e.AgentDir != "" {
			link += fmt.Sprintf(" · [agent](%s)", report.Href(e.AgentDir))
		}
		variant := e.PromptVariant
		if e.Attempt > 0 {
			variant += fmt.Sprintf(" #%d", e.Attempt)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", e.Model, variant, e.InstanceID, e.Failure, strings.Join(e.FailedProbes, ", "), link)
	}
	return b.String()
}

// rate is "r/n as a percentage", or "none left" when n is 0 (no rate to give).
func rate(r, n int) string {
	if n == 0 {
		return "none left (0/0)"
	}
	return fmt.Sprintf("%.1f%% (%d/%d)", 100*float64(r)/float64(n), r, n)
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	return ranked(m)
}

// ranked lists counts most common first (ties by name).
func ranked(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var xs []kv
	for k, v := range m {
		if v > 0 {
			xs = append(xs, kv{k, v})
		}
	}
	sort.Slice(xs, func(i, j int) bool {
		if xs[i].v != xs[j].v {
			return xs[i].v > xs[j].v
		}
		return xs[i].k < xs[j].k
	})
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%s %d", x.k, x.v))
	}
	return strings.Join(parts, ", ")
}
