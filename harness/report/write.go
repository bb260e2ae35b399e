package report

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/result"
)

// Stored is a result with the run folder it was read from.
type Stored struct {
	Dir    string
	Result *result.Result
}

// LoadRun reads every result.json of a run folder (<run>/<model>/<instance>/result.json),
// sorted by model and instance.
func LoadRun(runDir string) ([]Stored, error) {
	files, err := filepath.Glob(filepath.Join(runDir, "*", "*", "result.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []Stored
	for _, f := range files {
		r, err := result.Read(f)
		if err != nil {
			return nil, err
		}
		out = append(out, Stored{Dir: filepath.Dir(f), Result: r})
	}
	return out, nil
}

// WriteRun writes every report of a run from its stored results, and nothing else is read
// or run: report.json, report.md, report.html and report.junit.xml in runDir, and a
// report.json (SWE-bench's per-instance shape) in each result's folder. It returns the summary.
func WriteRun(runDir, runID string, stored []Stored) (Summary, error) {
	results := make([]*result.Result, len(stored))
	pages := map[[3]string]string{}
	for i, st := range stored {
		r := st.Result
		results[i] = r
		if err := atomicfile.WriteJSON(filepath.Join(st.Dir, "report.json"), InstanceReport(r)); err != nil {
			return Summary{}, err
		}
		rel, err := filepath.Rel(runDir, st.Dir)
		if err != nil {
			return Summary{}, err
		}
		back, err := filepath.Rel(st.Dir, runDir)
		if err != nil {
			return Summary{}, err
		}
		var page bytes.Buffer
		if err := WriteInstancePage(&page, st.Dir, r, back); err != nil {
			return Summary{}, err
		}
		if err := atomicfile.Write(filepath.Join(st.Dir, "index.html"), page.Bytes()); err != nil {
			return Summary{}, err
		}
		if r.Attempt <= 1 {
			pages[[3]string{r.Model, r.PromptVariant, r.InstanceID}] = Href(filepath.Join(rel, "index.html"))
		}
	}
	s := Summarize(runID, results)
	for i := range s.Models {
		m := &s.Models[i]
		for j := range m.Instances {
			m.Instances[j].Page = pages[[3]string{m.Model, m.PromptVariant, m.Instances[j].InstanceID}]
		}
	}
	if err := WriteJSON(filepath.Join(runDir, "report.json"), s); err != nil {
		return s, err
	}
	var md, html, junit bytes.Buffer
	if err := WriteMarkdown(&md, s); err != nil {
		return s, err
	}
	if err := WriteHTML(&html, s); err != nil {
		return s, err
	}
	if err := WriteJUnit(&junit, results); err != nil {
		return s, err
	}
	for name, data := range map[string][]byte{"report.md": md.Bytes(), "report.html": html.Bytes(), "report.junit.xml": junit.Bytes()} {
		if err := atomicfile.Write(filepath.Join(runDir, name), data); err != nil {
			return s, err
		}
	}
	return s, nil
}

// InstanceReport is one result in the shape of SWE-bench's per-instance report.json, with
// InfraDev's fields beside it.
func InstanceReport(r *result.Result) map[string]any {
	status := map[string]map[string][]string{
		"FAIL_TO_PASS": {"success": {}, "failure": {}},
		"PASS_TO_PASS": {"success": {}, "failure": {}},
		"PROBES":       {"success": {}, "failure": {}},
	}
	if p := r.Phase("tests"); p != nil {
		for i, t := range p.Tests {
			kind := "PASS_TO_PASS"
			if i < r.FailToPass {
				kind = "FAIL_TO_PASS"
			}
			bucket(status[kind], t)
		}
	}
	if p := r.Phase("probes"); p != nil {
		for _, t := range p.Tests {
			bucket(status["PROBES"], t)
		}
	}
	apply := r.Phase("apply")
	return map[string]any{r.InstanceID: map[string]any{
		"patch_is_None":              false,
		"patch_exists":               !r.EmptyPatch,
		"patch_successfully_applied": apply != nil && apply.Status == result.StatusPassed,
		"resolved":                   r.Resolved,
		"tests_status":               status,
		"failure_class":              r.FailureClass,
		"failed_probe_categories":    r.FailedProbeCategories,
		"model_name_or_path":         r.Model,
	}}
}

func bucket(b map[string][]string, t result.TestOutcome) {
	id := t.ID
	if t.Probe != "" {
		id = t.Probe
	}
	if t.Outcome == result.StatusPassed {
		b["success"] = append(b["success"], id)
	} else {
		b["failure"] = append(b["failure"], id)
	}
}

// WriteMarkdown writes the report as Markdown tables.
func WriteMarkdown(w io.Writer, s Summary) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# InfraDev report: %s\n\n", s.RunID)
	b.WriteString("| model | submitted | resolved | resolution rate | passed official tests | probe-rejected | probe rejection rate | tampered | not run / errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range s.Models {
		fmt.Fprintf(&b, "| %s | %d | %d | %.1f%% | %d | %d | %.1f%% | %d | %d |\n", m.Label, m.SubmittedInstances, m.ResolvedInstances,
			100*m.ResolutionRate, m.PassedOfficialTests, m.ProbeRejected, 100*m.ProbeRejectionRate, m.TamperedInstances, m.ErrorInstances)
	}
	for _, sec := range []struct {
		title string
		gs    []Group
	}{{"project", s.Projects}, {"prompt variant", s.PromptVariants}} {
		fmt.Fprintf(&b, "\n| %s | submitted | resolved | resolution rate | probe rejection rate | tampered |\n|---|---:|---:|---:|---:|---:|\n", sec.title)
		for _, g := range sec.gs {
			fmt.Fprintf(&b, "| %s | %d | %d | %.1f%% | %.1f%% | %d |\n", g.Name, g.Submitted, g.Resolved, 100*g.ResolutionRate, 100*g.ProbeRejectionRate, g.Tampered)
		}
	}
	b.WriteString("\n| model | failure classes | failed probe categories | mean wall | max peak memory |\n|---|---|---|---:|---:|\n")
	for _, m := range s.Models {
		fmt.Fprintf(&b, "| %s | %s | %s | %.1fs | %.0f MiB |\n", m.Label, counts(m.FailureClasses), counts(m.ProbeCategories),
			m.MeanWallSeconds, float64(m.MaxPeakMemoryBytes)/(1<<20))
	}
	writeAgentsMarkdown(&b, s)
	b.WriteString("\n| model | instance | verdict | reason |\n|---|---|---|---|\n")
	for _, m := range s.Models {
		for _, in := range m.Instances {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", m.Label, in.InstanceID, in.Verdict, strings.ReplaceAll(shorten(in.Reason, 160), "|", "\\|"))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
