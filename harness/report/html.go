package report

import (
	"fmt"
	"html/template"
	"io"
	"sort"

	"github.com/infradev/infradev/harness/probe"
)

// bar is one bar of a chart.
type bar struct {
	Label string
	Value float64 // 0..1 for rates; any for figures
	Text  string
}

// chart is an inline SVG horizontal bar chart.
type chart struct {
	ID, Title string
	Bars      []bar
	Max       float64
}

// svgBar is a bar laid out for the template.
type svgBar struct {
	Y, Width  float64
	Label     string
	Text      string
	TextX     float64
	Highlight bool
}

func (c chart) Layout() []svgBar {
	max := c.Max
	for _, b := range c.Bars {
		if b.Value > max {
			max = b.Value
		}
	}
	if max == 0 {
		max = 1
	}
	out := make([]svgBar, len(c.Bars))
	for i, b := range c.Bars {
		w := 420 * b.Value / max
		out[i] = svgBar{Y: float64(28 + i*26), Width: w, Label: b.Label, Text: b.Text, TextX: 190 + w + 6}
	}
	return out
}

func (c chart) Height() int { return 40 + 26*len(c.Bars) }

func rateBars[T any](items []T, label func(T) string, value func(T) float64) []bar {
	var out []bar
	for _, it := range items {
		v := value(it)
		out = append(out, bar{Label: label(it), Value: v, Text: fmt.Sprintf("%.1f%%", 100*v)})
	}
	return out
}

// charts are the page's charts, in order.
func charts(s Summary) []chart {
	name := func(m ModelSummary) string { return m.Label }
	gname := func(g Group) string { return g.Name }
	cs := []chart{
		{ID: "resolution-by-model", Title: "Resolution rate by model", Max: 1,
			Bars: rateBars(s.Models, name, func(m ModelSummary) float64 { return m.ResolutionRate })},
		{ID: "resolution-by-project", Title: "Resolution rate by project", Max: 1,
			Bars: rateBars(s.Projects, gname, func(g Group) float64 { return g.ResolutionRate })},
		{ID: "resolution-by-prompt", Title: "Resolution rate by prompt variant", Max: 1,
			Bars: rateBars(s.PromptVariants, gname, func(g Group) float64 { return g.ResolutionRate })},
		{ID: "probe-rejection", Title: "Probe rejection rate by model (of submissions passing every official test)", Max: 1,
			Bars: rateBars(s.Models, name, func(m ModelSummary) float64 { return m.ProbeRejectionRate })},
	}
	classes := map[string]int{}
	for _, m := range s.Models {
		for k, v := range m.FailureClasses {
			classes[k] += v
		}
		for k, v := range m.ProbeCategories {
			classes["probe: "+k] += v
		}
	}
	var keys []string
	for k := range classes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fc := chart{ID: "failure-categories", Title: "Failures by class and probe category"}
	for _, k := range keys {
		fc.Bars = append(fc.Bars, bar{Label: k, Value: float64(classes[k]), Text: fmt.Sprint(classes[k])})
	}
	cs = append(cs, fc)
	res := chart{ID: "resources", Title: "Resource use: mean wall time per attempt (s) by model"}
	mem := chart{ID: "memory", Title: "Resource use: largest peak memory (MiB) by model"}
	for _, m := range s.Models {
		res.Bars = append(res.Bars, bar{Label: m.Label, Value: m.MeanWallSeconds, Text: fmt.Sprintf("%.1fs", m.MeanWallSeconds)})
		mb := float64(m.MaxPeakMemoryBytes) / (1 << 20)
		mem.Bars = append(mem.Bars, bar{Label: m.Label, Value: mb, Text: fmt.Sprintf("%.0f MiB", mb)})
	}
	return append(cs, res, mem)
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"pct": func(v float64) float64 { return 100 * v },
	"inc": func(i int) int { return i + 1 },
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>InfraDev report: {{.S.RunID}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330;max-width:1100px}
h1{font-size:22px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccd;padding:4px 8px;text-align:left}
th{background:#eef1f6} td.n{text-align:right}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:16px}
svg.chart{border:1px solid #dde;border-radius:6px;background:#fbfcfe}
.bar{fill:#3b6fd8} .lbl{font-size:12px;fill:#333} .val{font-size:12px;fill:#111}
table.sortable th{cursor:pointer} table.sortable th:after{content:" ↕";color:#99a}
td.cell{text-align:center;min-width:64px} td.cell a{color:inherit;text-decoration:none;display:block}
.resolved{background:#cdebd3} .probes_failed{background:#fde3b8} .official_tests_failed{background:#f7c5c5}
.patch_apply_failed{background:#e3d1f0} .tampered{background:#c9302c;color:#fff} .limits{background:#f3d6e4}
.notrun,.none{background:#eeeeee;color:#777}
</style></head>
<body>
<h1>InfraDev report: {{.S.RunID}}</h1>
<p>Resolved = the patch applies, every official test passes and every probe passes. Probe rejection
rate = of the submissions that passed every official test, the share the probes rejected.
Tampered = caught forging the official tests' outcomes (counted as not resolved).
Attempts not run or failed by the infrastructure are counted apart.</p>
<table><tr><th>model</th><th>submitted</th><th>resolved</th><th>resolution rate</th><th>passed official tests</th><th>probe-rejected</th><th>probe rejection rate</th><th>tampered</th><th>not run / errors</th></tr>
{{range .S.Models}}<tr><td>{{.Label}}</td><td class="n">{{.SubmittedInstances}}</td><td class="n">{{.ResolvedInstances}}</td><td class="n">{{printf "%.1f%%" (pct .ResolutionRate)}}</td><td class="n">{{.PassedOfficialTests}}</td><td class="n">{{.ProbeRejected}}</td><td class="n">{{printf "%.1f%%" (pct .ProbeRejectionRate)}}</td><td class="n">{{.TamperedInstances}}</td><td class="n">{{.ErrorInstances}}</td></tr>
{{end}}</table>
<h2 id="matrix">Tasks by model</h2>
<p>Each model's first attempt at each task; a cell links to the attempt's page (the patch, every test and probe outcome, logs).</p>
<table class="matrix sortable"><thead><tr><th>task</th>{{range .Matrix.Columns}}<th>{{.}}</th>{{end}}</tr></thead><tbody>
{{range .Matrix.Rows}}<tr><td>{{.InstanceID}}</td>{{range .Cells}}<td class="cell {{.Class}}" title="{{.Title}}">{{if .Page}}<a href="{{.Page}}">{{.Text}}</a>{{else}}{{.Text}}{{end}}</td>{{end}}</tr>
{{end}}</tbody></table>
<div class="charts">
{{range .Charts}}<svg class="chart" id="{{.ID}}" role="img" aria-label="{{.Title}}" width="100%" viewBox="0 0 700 {{.Height}}" preserveAspectRatio="xMinYMin meet">
<text x="10" y="18" class="lbl" font-weight="bold">{{.Title}}</text>
{{range .Layout}}<text x="10" y="{{.Y}}" dy="14" class="lbl">{{.Label}}</text><rect class="bar" x="190" y="{{.Y}}" width="{{.Width}}" height="18" rx="2"></rect><text x="{{.TextX}}" y="{{.Y}}" dy="14" class="val">{{.Text}}</text>
{{end}}</svg>
{{end}}</div>
{{if .S.Taxonomy}}<h2 id="taxonomy">Failure taxonomy</h2>
<p>Every graded attempt, by failure class and by the categories of the probes that failed (an attempt
failing probes of two categories counts in both).</p>
<table><tr><th>model / project</th><th>variant</th><th>graded</th><th>resolved</th>{{range .Classes}}<th>{{.}}</th>{{end}}{{range .Categories}}<th>probe: {{.}}</th>{{end}}</tr>
{{range $r := .S.Taxonomy}}<tr><td>{{if $r.Project}}project {{$r.Project}}{{else}}{{$r.Model}}{{end}}</td><td>{{$r.PromptVariant}}</td><td class="n">{{$r.Graded}}</td><td class="n">{{$r.Resolved}}</td>{{range $.Classes}}<td class="n">{{index $r.Classes .}}</td>{{end}}{{range $.Categories}}<td class="n">{{index $r.Categories .}}</td>{{end}}</tr>
{{end}}</table>{{end}}
{{if .S.PassAtK}}<h2 id="pass-at-k">pass@k</h2>
<p>The unbiased estimator of pass@k from n graded attempts per task, averaged over tasks, with a 95%
percentile bootstrap interval from resampling tasks.</p>
<table><tr><th>model</th><th>variant</th><th>tasks</th><th>attempts</th><th>pass@k [95% interval]</th></tr>
{{range .S.PassAtK}}<tr><td>{{.Model}}</td><td>{{.PromptVariant}}</td><td class="n">{{.Tasks}}</td><td class="n">{{.Attempts}}</td><td>{{range $i, $e := .PassAt}}@{{inc $i}} {{printf "%.1f%%" (pct $e.Value)}} [{{printf "%.1f" (pct $e.CI.Lo)}}, {{printf "%.1f" (pct $e.CI.Hi)}}]; {{end}}</td></tr>
{{end}}</table>{{end}}
{{if .S.Comparisons}}<h2 id="variant-comparison">Prompt variants compared</h2>
<p>Paired over the tasks both variants were graded on: each task's share of resolved attempts; the
difference B − A with a 95% paired bootstrap interval, and the exact two-sided sign test on the
tasks where the variants differ (McNemar's exact test when each has one attempt).</p>
<table><tr><th>model</th><th>A</th><th>B</th><th>tasks</th><th>A rate</th><th>B rate</th><th>B − A</th><th>95% interval</th><th>B better / A better</th><th>exact p</th></tr>
{{range .S.Comparisons}}<tr><td>{{.Model}}</td><td>{{.A}}</td><td>{{.B}}</td><td class="n">{{.Tasks}}</td><td class="n">{{printf "%.1f%%" (pct .MeanA)}}</td><td class="n">{{printf "%.1f%%" (pct .MeanB)}}</td><td class="n">{{printf "%+.1f pts" (pct .Diff)}}</td><td>[{{printf "%+.1f" (pct .DiffCI.Lo)}}, {{printf "%+.1f" (pct .DiffCI.Hi)}}]</td><td class="n">{{.BetterB}} / {{.BetterA}}</td><td class="n">{{printf "%.3g" .PValue}}</td></tr>
{{end}}</table>{{end}}
<h2>Instances</h2>
<table class="sortable"><thead><tr><th>model</th><th>instance</th><th>verdict</th><th>reason</th></tr></thead><tbody>
{{range .S.Models}}{{$m := .Label}}{{range .Instances}}<tr><td>{{$m}}</td><td>{{if .Page}}<a href="{{.Page}}">{{.InstanceID}}</a>{{else}}{{.InstanceID}}{{end}}</td><td>{{.Verdict}}</td><td>{{.Reason}}</td></tr>
{{end}}{{end}}</tbody></table>
<script>
// Sorts a table by the clicked column (numbers as numbers), toggling the direction.
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var dir = th.getAttribute("data-dir") === "asc" ? -1 : 1;
      th.setAttribute("data-dir", dir === 1 ? "asc" : "desc");
      rows.sort(function (a, b) {
        var x = a.cells[col].textContent.trim(), y = b.cells[col].textContent.trim();
        var nx = parseFloat(x), ny = parseFloat(y);
        if (!isNaN(nx) && !isNaN(ny)) { return dir * (nx - ny); }
        return dir * x.localeCompare(y);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
// Marks the page ready once every chart has drawn its bars; the browser test checks for it.
(function () {
  var charts = document.querySelectorAll("svg.chart");
  var drawn = Array.prototype.every.call(charts, function (c) { return c.getBBox().width > 0; });
  document.body.setAttribute("data-charts", String(charts.length));
  document.body.setAttribute("data-ready", drawn ? "1" : "0");
})();
</script>
</body></html>
`))

// WriteHTML writes a self-contained HTML page (no external resources) with the summary tables
// and SVG charts: resolution rate by model, project and prompt variant, probe rejection rate,
// failures by class and probe category, and resource use; then the failure taxonomy and, for
// agents' runs, pass@k and the prompt variants compared.
func WriteHTML(w io.Writer, s Summary) error {
	return page.Execute(w, struct {
		S                   Summary
		Charts              []chart
		Classes, Categories []string
		Matrix              matrix
	}{s, charts(s), taxonomyClasses, probe.Categories, matrixOf(s)})
}
