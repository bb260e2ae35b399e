// Package catalogue owns the table of tasks users read: per task its project and upstream
// change, the kind of change, the probe categories, the GPUs it needs here and on a pool, and
// its validation status, which comes from the task's validation record (written by `infradev
// validate --record`), never from anything typed by hand. It renders the table as Markdown
// and keeps the copy in the README between markers current.
package catalogue

import (
	"bytes"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/validate"
)

// Row is one task of the catalogue.
type Row struct {
	ID      string `json:"id"`
	Project string `json:"project"`
	Kind    string `json:"kind"`
	// Upstream is "owner/repo@short-commit", or "" for the demo suite.
	Upstream   string   `json:"upstream,omitempty"`
	Categories []string `json:"probe_categories"`
	Probes     int      `json:"probes"`
	FailToPass int      `json:"fail_to_pass"`
	GPUs       int      `json:"gpus"`      // what an attempt here needs
	PoolGPUs   int      `json:"pool_gpus"` // what the change's own tests use upstream
	// Status is the current record's: cpu, gpu (validated in full, without or with GPUs) or
	// gpu-pending (needs GPUs; every check that needs none passed) or cpu-pending (gold resolves
	// under the probes, the rest of the validation still to run); stale (a record for
	// another version of the task, probes or environment) or unvalidated (no record).
	Status string `json:"status"`
}

// Rows reads every task under tasksRoot with its probes, its environment's lock (under
// envsRoot) and its record, sorted by project and id.
func Rows(tasksRoot, probesRoot, envsRoot string) ([]Row, error) {
	dirs, err := task.Find(tasksRoot)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, dir := range dirs {
		t, err := task.Load(dir)
		if err != nil {
			return nil, err
		}
		pdir := task.ProbesDir(probesRoot, dir)
		ps, err := probe.Load(pdir, t.ID)
		if err != nil {
			return nil, err
		}
		r := Row{ID: t.ID, Project: t.Project, Kind: t.Kind, Probes: len(ps.Probes), FailToPass: len(t.Tests.FailToPass),
			GPUs: t.Resources.GPUs.Count, PoolGPUs: t.Resources.GPUs.Pool}
		if t.Upstream() {
			r.Upstream = strings.TrimPrefix(strings.TrimPrefix(t.Repo.URL, "https://"), "github.com/") + "@" + t.Repo.MergeCommit[:12]
		}
		seen := map[string]bool{}
		for _, p := range ps.Probes {
			if !seen[p.Category] {
				seen[p.Category] = true
				r.Categories = append(r.Categories, p.Category)
			}
		}
		sort.Strings(r.Categories)
		if r.Status, err = status(t, pdir, envsRoot); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Project != rows[j].Project {
			return rows[i].Project < rows[j].Project
		}
		return rows[i].ID < rows[j].ID
	})
	return rows, nil
}

func status(t *task.Task, probesDir, envsRoot string) (string, error) {
	lock, err := image.ReadLock(filepath.Join(envsRoot, t.Environment))
	if err != nil {
		return "", err
	}
	env := ""
	if lock != nil {
		env = lock.Manifest
	}
	rec, err := validate.ReadRecord(probesDir)
	if err != nil {
		return "", err
	}
	if rec == nil {
		return "unvalidated", nil
	}
	changed, err := rec.Stale(t, probesDir, env)
	if err != nil {
		return "", err
	}
	if changed != "" {
		return "stale (" + changed + ")", nil
	}
	return rec.StatusText(), nil
}

// Markdown renders the rows as a table.
func Markdown(rows []Row) []byte {
	var b bytes.Buffer
	b.WriteString("| task | upstream change | kind of change | probe categories | probes | fail-to-pass | GPUs here / on a pool | status |\n")
	b.WriteString("|---|---|---|---|---:|---:|---:|---|\n")
	for _, r := range rows {
		up := r.Upstream
		if up == "" {
			up = "(demo)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %d | %d / %d | %s |\n", cell(r.ID), cell(up), cell(r.Kind),
			cell(strings.Join(r.Categories, ", ")), r.Probes, r.FailToPass, r.GPUs, r.PoolGPUs, cell(r.Status))
	}
	var upstream, demo []Row
	for _, r := range rows {
		if r.Upstream != "" {
			upstream = append(upstream, r)
		} else {
			demo = append(demo, r)
		}
	}
	b.WriteString("\n")
	for _, g := range []struct {
		name string
		rows []Row
	}{{"Upstream tasks", upstream}, {"Demo tasks", demo}} {
		if len(g.rows) == 0 {
			continue
		}
		c := Count(g.rows)
		fmt.Fprintf(&b, "%s: %d. By project: %s. By GPUs here: %s. By GPUs on a pool: %s. Probe categories (tasks with one): %s. Status: %s.\n\n",
			g.name, len(g.rows), summary(c.Project), summary(c.GPUs), summary(c.PoolGPUs), summary(c.Category), summary(c.Status))
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// Markers delimit the generated table in a Markdown file.
const (
	Begin = "<!-- catalogue: written by `infradev catalogue --write`; do not edit -->\n"
	End   = "<!-- end of catalogue -->\n"
)

// Splice returns doc with the text between the markers replaced by table; doc must hold both.
func Splice(doc, table []byte, name string) ([]byte, error) {
	i := bytes.Index(doc, []byte(Begin))
	j := bytes.Index(doc, []byte(End))
	if i < 0 || j < i {
		return nil, fmt.Errorf("%s has no catalogue markers (%q ... %q)", name, strings.TrimSpace(Begin), strings.TrimSpace(End))
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(Begin)])
	out.Write(table)
	out.Write(doc[j:])
	return out.Bytes(), nil
}

// Counts are tasks counted per key.
type Counts struct {
	Project, GPUs, PoolGPUs, Category, Status map[string]int
}

// Count summarises rows: tasks per project, per GPUs an attempt needs here, per GPUs on a
// pool, per probe category and per status (a stale record counts as stale, whatever changed).
func Count(rows []Row) Counts {
	c := Counts{Project: map[string]int{}, GPUs: map[string]int{}, PoolGPUs: map[string]int{}, Category: map[string]int{}, Status: map[string]int{}}
	for _, r := range rows {
		c.Project[r.Project]++
		c.GPUs[fmt.Sprint(r.GPUs)]++
		c.PoolGPUs[fmt.Sprint(r.PoolGPUs)]++
		for _, cat := range r.Categories {
			c.Category[cat]++
		}
		c.Status[strings.SplitN(r.Status, " ", 2)[0]]++
	}
	return c
}

// summary writes counts as "a 2, b 1", keys sorted.
func summary(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// cell makes text safe in a Markdown table cell: pipes escaped, line breaks flattened.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	return strings.Join(strings.Fields(s), " ")
}
