package report_test

import (
	"bytes"
	stdhtml "html"
	"math"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
)

// attempt is an agent's graded attempt.
func attempt(model, variant, id string, k int, class string, cats ...string) *result.Result {
	r := res(model, id, class, class == "" || class == result.ProbesFailed, cats...)
	r.PromptVariant, r.Attempt, r.Project = variant, k, "demo"
	return r
}

// An agent's run: two variants, four tasks, two attempts each. The per-model table counts first
// attempts; the taxonomy every attempt; pass@k and the paired comparison come from all of them.
func TestSummarizeAgentRun(t *testing.T) {
	var rs []*result.Result
	// instruction: t1 1/2, t2 0/2, t3 0/2, t4 0/2; instruction+skill: t1 2/2, t2 1/2, t3 2/2, t4 0/2.
	plan := map[string][2][4]string{
		"instruction":       {{"", result.ProbesFailed, result.OfficialTestsFailed, result.ProbesFailed}, {result.ProbesFailed, result.OfficialTestsFailed, result.OfficialTestsFailed, result.ProbesFailed}},
		"instruction+skill": {{"", "", "", result.ProbesFailed}, {"", result.ProbesFailed, "", result.OfficialTestsFailed}},
	}
	ids := []string{"t1", "t2", "t3", "t4"}
	for v, attempts := range plan {
		for k, classes := range attempts {
			for i, c := range classes {
				var cats []string
				if c == result.ProbesFailed {
					cats = []string{"state"}
				}
				rs = append(rs, attempt("agent", v, ids[i], k+1, c, cats...))
			}
		}
	}
	rs = append(rs, attempt("agent", "instruction", "t5", 1, result.InfraError)) // never graded
	s := report.Summarize("r", rs)

	if len(s.Models) != 2 || s.Models[0].Label != "agent [instruction]" || s.Models[1].Label != "agent [instruction+skill]" {
		t.Fatalf("models = %+v", s.Models)
	}
	if m := s.Models[0]; m.SubmittedInstances != 5 || m.ResolvedInstances != 1 || m.ErrorInstances != 1 {
		t.Errorf("instruction first attempts: submitted %d resolved %d errors %d, want 5 1 1", m.SubmittedInstances, m.ResolvedInstances, m.ErrorInstances)
	}
	// Taxonomy: every graded attempt (8 per variant), and the project row over both.
	var instr, project *report.TaxonomyRow
	for i, r := range s.Taxonomy {
		switch {
		case r.Model == "agent" && r.PromptVariant == "instruction":
			instr = &s.Taxonomy[i]
		case r.Project == "demo":
			project = &s.Taxonomy[i]
		}
	}
	if instr == nil || instr.Graded != 8 || instr.Resolved != 1 || instr.Classes[result.ProbesFailed] != 4 || instr.Categories["state"] != 4 || instr.Classes[result.OfficialTestsFailed] != 3 {
		t.Errorf("instruction taxonomy = %+v", instr)
	}
	if project == nil || project.Graded != 16 || project.Resolved != 6 {
		t.Errorf("project taxonomy = %+v", project)
	}
	// pass@1 = mean over tasks of c/n: instruction (1/2)/4 = 0.125; pass@2 = 1/4.
	if len(s.PassAtK) != 2 {
		t.Fatalf("pass@k = %+v", s.PassAtK)
	}
	p := s.PassAtK[0]
	if p.PromptVariant != "instruction" || p.Tasks != 4 || p.Attempts != 2 || math.Abs(p.PassAt[0].Value-0.125) > 1e-12 || math.Abs(p.PassAt[1].Value-0.25) > 1e-12 {
		t.Errorf("instruction pass@k = %+v", p)
	}
	if ci := p.PassAt[0].CI; ci.Lo > 0.125 || ci.Hi < 0.125 {
		t.Errorf("pass@1 interval %+v does not hold 0.125", ci)
	}
	if len(s.Comparisons) != 1 {
		t.Fatalf("comparisons = %+v", s.Comparisons)
	}
	c := s.Comparisons[0]
	// Per task rates: A (.5, 0, 0, 0), B (1, .5, 1, 0): B better on 3, A on none.
	if c.A != "instruction" || c.B != "instruction+skill" || c.Tasks != 4 || c.BetterB != 3 || c.BetterA != 0 ||
		math.Abs(c.Diff-(2.5/4-0.5/4)) > 1e-12 || math.Abs(c.PValue-0.25) > 1e-12 {
		t.Errorf("comparison = %+v, want B-A 0.5 over 4 tasks, 3/0, p 0.25", c)
	}
	var md, html bytes.Buffer
	if err := report.WriteMarkdown(&md, s); err != nil {
		t.Fatal(err)
	}
	if err := report.WriteHTML(&html, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Failure taxonomy", "## pass@k", "@2 25.0%", "| agent | instruction | instruction+skill | 4 | 12.5% | 62.5% | +50.0 pts |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	for _, want := range []string{`id="taxonomy"`, `id="pass-at-k"`, `id="variant-comparison"`, "+50.0 pts", "agent [instruction+skill]"} {
		if !strings.Contains(stdhtml.UnescapeString(html.String()), want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
}
