package report

import (
	"fmt"
	"html/template"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"

	"github.com/infradev/infradev/harness/result"
)

// matrix is the task-by-model view of a summary: a row per task, a column per model (and
// prompt variant), each cell the verdict of that model's first attempt.
type matrix struct {
	Columns []string
	Rows    []matrixRow
}

type matrixRow struct {
	InstanceID string
	Cells      []matrixCell
}

type matrixCell struct {
	Text, Title, Class string
	Page               string // the instance page, relative to the report; empty: no link
}

func matrixOf(s Summary) matrix {
	var m matrix
	byID := map[string][]matrixCell{}
	var ids []string
	for i, ms := range s.Models {
		m.Columns = append(m.Columns, ms.Label)
		for _, in := range ms.Instances {
			if byID[in.InstanceID] == nil {
				byID[in.InstanceID] = make([]matrixCell, len(s.Models))
				ids = append(ids, in.InstanceID)
			}
			byID[in.InstanceID][i] = cellOf(in)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		cells := byID[id]
		for i := range cells {
			if cells[i].Class == "" {
				cells[i] = matrixCell{Text: "–", Title: "no submission", Class: "none"}
			}
		}
		m.Rows = append(m.Rows, matrixRow{InstanceID: id, Cells: cells})
	}
	return m
}

// cellOf is a verdict in a few characters, coloured by its class.
func cellOf(in Instance) matrixCell {
	c := matrixCell{Title: in.Verdict, Page: in.Page}
	switch {
	case in.Resolved:
		c.Text, c.Class = "✓", "resolved"
	case in.FailureClass == result.ProbesFailed:
		c.Text, c.Class = "probe", "probes_failed"
	case in.FailureClass == result.OfficialTestsFailed:
		c.Text, c.Class = "tests", "official_tests_failed"
	case in.FailureClass == result.PatchApplyFailed:
		c.Text, c.Class = "apply", "patch_apply_failed"
	case in.FailureClass == result.Tampered:
		c.Text, c.Class = "tampered", "tampered"
	case in.FailureClass == result.Timeout || in.FailureClass == result.OOM:
		c.Text, c.Class = in.FailureClass, "limits"
	default:
		c.Text, c.Class = "not run", "notrun"
	}
	if in.Reason != "" {
		c.Title += ": " + in.Reason
	}
	return c
}

// maxPatchShown bounds the submission shown inline on an instance page (the file is linked).
const maxPatchShown = 512 << 10

// WriteInstancePage writes dir/index.html: one attempt's verdict, reason, every official test,
// canary and probe outcome, the phases' resource figures, links to its logs and raw reports,
// and the submission. Links stay inside the run folder. runRel is the path from dir back to
// the run folder (for the agent's attempt folder, when there is one).
func WriteInstancePage(w io.Writer, dir string, r *result.Result, runRel string) error {
	patch, _ := os.ReadFile(filepath.Join(dir, "submission.patch"))
	cut := len(patch) > maxPatchShown
	if cut {
		patch = patch[:maxPatchShown]
	}
	agent := ""
	if r.Attempt > 0 {
		// The agent's own attempt folder: runs/<id>/agent/<same model folder>/<instance>.
		model, inst := filepath.Base(filepath.Dir(dir)), filepath.Base(dir)
		if _, err := os.Stat(filepath.Join(dir, runRel, "agent", model, inst, "agent.json")); err == nil {
			agent = Href(filepath.Join(runRel, "agent", model, inst))
		}
	}
	raw := map[string]string{}
	for _, p := range r.Phases {
		if _, err := os.Stat(filepath.Join(dir, "raw", p.Name+".xml")); err == nil {
			raw[p.Name] = "raw/" + p.Name + ".xml"
		}
	}
	return instancePage.Execute(w, struct {
		Raw      map[string]string
		R        *result.Result
		Verdict  string
		Patch    string
		Cut      bool
		HasPatch bool
		Agent    string
		Report   string
	}{raw, r, Verdict(r), string(patch), cut, len(patch) > 0, agent, Href(filepath.Join(runRel, "report.html"))})
}

// Href is a relative link to a path: folder names may hold '%' (package predictions escapes
// model names that way), which a link must escape again.
func Href(rel string) string { return (&url.URL{Path: filepath.ToSlash(rel)}).EscapedPath() }

var instancePage = template.Must(template.New("instance").Funcs(template.FuncMap{
	"mib":  func(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) },
	"href": Href,
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.R.Model}} {{.R.InstanceID}}: {{.Verdict}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330;max-width:1100px}
h1{font-size:20px} h2{font-size:16px;margin-top:24px}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#eef1f6} td.n{text-align:right}
.passed{background:#dff3e3} .failed,.error,.missing,.over_budget,.tampered{background:#fbe0e0} .skipped{background:#f1f1f1}
pre{background:#f6f8fa;border:1px solid #dde;padding:8px;overflow-x:auto;font-size:12px}
</style></head>
<body>
<p><a href="{{.Report}}">← the run's report</a>{{if .Agent}} · <a href="{{.Agent}}/">the agent's attempt (prompt, transcript, logs)</a>{{end}}</p>
<h1 id="verdict">{{.R.Model}} · {{.R.InstanceID}}: {{.Verdict}}</h1>
<table>
<tr><th>project</th><td>{{.R.Project}}</td></tr>
<tr><th>prompt variant</th><td>{{.R.PromptVariant}}{{if .R.Attempt}} (attempt {{.R.Attempt}}){{end}}</td></tr>
<tr><th>failure class</th><td>{{.R.FailureClass}}</td></tr>
<tr><th>reason</th><td>{{.R.Reason}}</td></tr>
{{if .R.FailedProbeCategories}}<tr><th>failed probe categories</th><td>{{range .R.FailedProbeCategories}}{{.}} {{end}}</td></tr>{{end}}
<tr><th>inputs</th><td>task {{.R.Inputs.Task}}<br>environment {{.R.Inputs.Environment}}<br>probes {{.R.Inputs.Probes}}<br>patch {{.R.Inputs.Patch}}<br>harness {{.R.Inputs.Harness}} · {{.R.Inputs.Hardware}}</td></tr>
</table>
<h2>Phases</h2>
<table><tr><th>phase</th><th>status</th><th>exit</th><th>wall</th><th>CPU</th><th>peak memory</th><th>log</th><th>report</th></tr>
{{range .R.Phases}}<tr><td>{{.Name}}</td><td class="{{.Status}}">{{.Status}}{{if .Detail}}: {{.Detail}}{{end}}</td><td class="n">{{.ExitCode}}</td><td class="n">{{printf "%.1fs" .WallSeconds}}</td><td class="n">{{printf "%.1fs" .CPUSeconds}}</td><td class="n">{{mib .PeakMemoryBytes}}{{if .GPUPeakMemory}} (GPU {{mib .GPUPeakMemory}}){{end}}</td><td>{{if .Log}}<a href="{{href .Log}}">{{.Log}}</a>{{end}}</td><td>{{with index $.Raw .Name}}<a href="{{href .}}">{{.}}</a>{{end}}</td></tr>
{{end}}</table>
{{range .R.Phases}}{{if or .Tests .Canaries}}<h2 id="phase-{{.Name}}">{{.Name}}: outcomes</h2>
{{if .Canaries}}<p>canaries: {{.Canaries.Planted}} planted{{if .Canaries.Wrong}}; wrong: {{range .Canaries.Wrong}}{{.}}; {{end}}{{else}}, every one as it must be{{end}}</p>{{end}}
<table class="sortable"><thead><tr><th>test</th><th>outcome</th><th>probe</th><th>category</th><th>message</th><th>wall</th><th>peak memory</th></tr></thead><tbody>
{{range .Tests}}<tr><td>{{.ID}}</td><td class="{{.Outcome}}">{{.Outcome}}</td><td>{{.Probe}}</td><td>{{.Category}}</td><td>{{.Message}}</td><td class="n">{{if .WallSeconds}}{{printf "%.2fs" .WallSeconds}}{{end}}</td><td class="n">{{if .PeakMemoryBytes}}{{mib .PeakMemoryBytes}}{{end}}</td></tr>
{{end}}</tbody></table>{{end}}{{end}}
<h2 id="submission">Submission</h2>
{{if .HasPatch}}<p><a href="submission.patch">submission.patch</a>{{if .Cut}} (shown up to 512 KiB){{end}}</p>
<pre>{{.Patch}}</pre>{{else}}<p>The submission changed nothing.</p>{{end}}
</body></html>
`))
