package report_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
)

func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Require(t, false, "Debian's chromium (tools/setup installs it)")
	return ""
}

func sampleSummary() report.Summary {
	var rs []*result.Result
	for i, m := range []string{"model-a", "model-b", "model-c"} {
		for j := 0; j < 4; j++ {
			r := res(m, "task-"+string(rune('0'+j)), "", true)
			r.Project = []string{"minitron", "paged", "rlkit"}[j%3]
			r.PromptVariant = []string{"instruction", "pr_description"}[j%2]
			switch (i + j) % 4 {
			case 1:
				r.FailureClass, r.Resolved, r.FailedProbeCategories = result.ProbesFailed, false, []string{"memory"}
			case 2:
				r.FailureClass, r.Resolved = result.OfficialTestsFailed, false
				r.Phases[1].Status = result.StatusFailed
			}
			r.Phases[1].WallSeconds, r.Phases[1].PeakMemoryBytes = float64(2+j), int64(100+50*i)<<20
			rs = append(rs, r)
		}
	}
	return report.Summarize("browser-check", rs)
}

// TestHTMLRendersInChromium renders the HTML report in headless Chromium: the page loads
// without console errors, its script finds every chart drawn, and a screenshot is saved under
// .infradev/artifacts/ in the repository.
func TestHTMLRendersInChromium(t *testing.T) {
	bin := chromium(t)
	dir := t.TempDir()
	var page bytes.Buffer
	if err := report.WriteHTML(&page, sampleSummary()); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(page.Bytes(), []byte("http://")) || bytes.Contains(page.Bytes(), []byte("https://")) {
		t.Errorf("the page refers to external resources; it must be self-contained")
	}
	html := filepath.Join(dir, "report.html")
	os.WriteFile(html, page.Bytes(), 0o644)
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + filepath.Join(dir, "profile"), "--enable-logging=stderr", "--v=0", "--window-size=1280,1800"}

	dom, err := exec.Command(bin, append(flags, "--dump-dom", "file://"+html)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	if !regexp.MustCompile(`<body[^>]*data-ready="1"`).Match(dom) {
		t.Errorf("the page's script did not find every chart drawn (no data-ready=\"1\" on body)")
	}
	if !regexp.MustCompile(`data-charts="7"`).Match(dom) {
		t.Errorf("the page does not hold the 7 charts")
	}
	for _, id := range []string{"resolution-by-model", "resolution-by-project", "resolution-by-prompt", "probe-rejection", "failure-categories", "resources", "memory"} {
		if !bytes.Contains(dom, []byte(`id="`+id+`"`)) {
			t.Errorf("chart %s missing", id)
		}
	}

	shots := filepath.Join(testenv.RepoRoot(t), ".infradev", "artifacts")
	os.MkdirAll(shots, 0o755)
	png := filepath.Join(shots, "report.png")
	os.Remove(png)
	cmd := exec.Command(bin, append(flags, "--screenshot="+png, "file://"+html)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, stderr.String())
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, "CONSOLE") && (strings.Contains(line, "Uncaught") || strings.Contains(line, "Error")) {
			t.Errorf("console error: %s", line)
		}
	}
	fi, err := os.Stat(png)
	if err != nil || fi.Size() < 10_000 {
		t.Fatalf("screenshot %s: %v (size %v)", png, err, fi)
	}
	t.Logf("screenshot saved to %s", png)
}

// TestRunFolderPagesInChromium writes a run folder's reports and opens them in headless
// Chromium: the task-by-model matrix has a cell per task and model, each linking to an
// instance page that holds the verdict, every test and probe outcome and the submission.
// Screenshots of both go to .infradev/artifacts/.
func TestRunFolderPagesInChromium(t *testing.T) {
	bin := chromium(t)
	run := t.TempDir()
	var stored []report.Stored
	for i, m := range []string{"org/model-a", "model-b"} {
		for j, id := range []string{"task-1", "task-2", "task-3"} {
			r := res(m, id, []string{"", result.ProbesFailed, result.OfficialTestsFailed}[(i+j)%3], (i+j)%3 != 2)
			r.Schema, r.Project, r.PromptVariant = result.Schema, "demo", "instruction"
			if r.FailureClass == result.ProbesFailed {
				r.FailedProbeCategories = []string{"state"}
			}
			r.Phases = append(r.Phases, result.Phase{Name: "probes", Status: "passed", Log: "logs/probes.log",
				Tests: []result.TestOutcome{{ID: "test_probes.py::test_state", Outcome: map[bool]string{true: "failed", false: "passed"}[r.FailureClass == result.ProbesFailed], Probe: "keeps-state", Category: "state"}}})
			dir := filepath.Join(run, strings.ReplaceAll(m, "/", "%2F"), id)
			os.MkdirAll(filepath.Join(dir, "logs"), 0o755)
			os.WriteFile(filepath.Join(dir, "submission.patch"), []byte("diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2 # <script>alert(1)</script>\n"), 0o644)
			os.WriteFile(filepath.Join(dir, "logs", "probes.log"), []byte("probe log\n"), 0o644)
			if err := result.Write(filepath.Join(dir, "result.json"), r); err != nil {
				t.Fatal(err)
			}
			stored = append(stored, report.Stored{Dir: dir, Result: r})
		}
	}
	if _, err := report.WriteRun(run, "pages", stored); err != nil {
		t.Fatal(err)
	}
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
		"--user-data-dir=" + filepath.Join(t.TempDir(), "profile"), "--window-size=1280,1400"}
	dom, err := exec.Command(bin, append(flags, "--dump-dom", "file://"+filepath.Join(run, "report.html"))...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	links := regexp.MustCompile(`<td class="cell [a-z_]+"[^>]*><a href="([^"]+)"`).FindAllSubmatch(dom, -1)
	if len(links) != 6 {
		t.Fatalf("matrix cells with a page link = %d, want 6 (3 tasks x 2 models)", len(links))
	}
	// The link of org/model-a's task-2 leads to its page, through the escaped folder name.
	page := ""
	for _, l := range links {
		if strings.Contains(string(l[1]), "model-a/task-2") {
			page = string(l[1])
		}
	}
	if page != "org%252Fmodel-a/task-2/index.html" {
		t.Fatalf("link to org/model-a task-2 = %q", page)
	}
	inst, err := exec.Command(bin, append(flags, "--dump-dom", "file://"+filepath.Join(run, page))...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom of the instance page: %v", err)
	}
	for _, want := range []string{"org/model-a · task-2: not resolved (probe: state)", "test_probes.py::test_state", "keeps-state", `href="logs/probes.log"`, "+a = 2 # &lt;script&gt;"} {
		if !strings.Contains(string(inst), want) {
			t.Errorf("the instance page lacks %q", want)
		}
	}
	shots := filepath.Join(testenv.RepoRoot(t), ".infradev", "artifacts")
	os.MkdirAll(shots, 0o755)
	for name, file := range map[string]string{"report-matrix.png": "report.html", "report-instance.png": page} {
		png := filepath.Join(shots, name)
		os.Remove(png)
		u := "file://" + filepath.Join(run, file)
		if file == page {
			u = "file://" + run + "/" + page
		}
		if err := exec.Command(bin, append(flags, "--screenshot="+png, u)...).Run(); err != nil {
			t.Fatalf("chromium --screenshot: %v", err)
		}
		if fi, err := os.Stat(png); err != nil || fi.Size() < 10_000 {
			t.Fatalf("screenshot %s: %v", png, err)
		}
	}
}
