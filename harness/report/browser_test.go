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
