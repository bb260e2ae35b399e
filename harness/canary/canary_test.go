package canary_test

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/canary"
	"github.com/infradev/infradev/harness/internal/testenv"
)

// planted plants a set's canaries in the given files (path -> source) with plant.py, as the
// setup script does, and resolves their ids; it returns the planted sources.
func planted(t *testing.T, py string, s *canary.Set, files map[string]string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, canary.PlanterModule+".py"), canary.Planter, 0o644)
	in, _ := json.Marshal(map[string]any{"files": files, "plants": s.Plants})
	os.WriteFile(filepath.Join(dir, "in.json"), in, 0o644)
	script := `import json, sys
sys.path.insert(0, sys.argv[1])
import infradev_canaries as p
cfg = json.load(open(sys.argv[1] + "/in.json"))
by, out, ids = {}, {}, {}
for i, c in enumerate(cfg["plants"]):
    by.setdefault(c["file"], []).append((i, c))
for path, src in cfg["files"].items():
    new, got = p.plant(path, src.encode(), by.get(path, []))
    out[path] = new.decode()
    ids.update({str(k): v for k, v in got.items()})
json.dump({"files": out, "ids": ids}, sys.stdout)
`
	cmd := exec.Command(py, "-I", "-c", script, dir)
	data, err := cmd.Output()
	if err != nil {
		t.Fatalf("plant.py: %v", err)
	}
	var res struct {
		Files map[string]string `json:"files"`
		IDs   map[string]string `json:"ids"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	ids := map[int]string{}
	for k, v := range res.IDs {
		i, _ := strconv.Atoi(k)
		ids[i] = v
	}
	if err := s.Resolve(ids); err != nil {
		t.Fatal(err)
	}
	return res.Files
}

func python(t *testing.T, modules string) string {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import "+modules).Run() == nil {
			return p
		}
	}
	testenv.Require(t, false, "python3 with "+modules+" (Debian's python3-pytest, python3-numpy)")
	return ""
}

const official = "import os\n\n\ndef test_load_keeps_shapes():\n    assert True\n\n\ndef test_save_writes_every_rank():\n    assert True\n\n\ndef test_load_rejects_a_bad_shape():\n    assert True\n"

func TestNewCoversEveryStyleWithAFailingCanary(t *testing.T) {
	files := []string{"tests/test_a.py", "tests/unit/test_b.py"}
	s, err := canary.New(nil, files, false)
	if err != nil {
		t.Fatal(err)
	}
	got := planted(t, python(t, "ast"), s, map[string]string{files[0]: official, files[1]: official})
	failing := map[string]bool{}
	for id, want := range s.Want {
		parts := strings.Split(id, "::")
		if !strings.Contains(got[parts[0]], parts[len(parts)-1]+"(") {
			t.Errorf("%s: its test is not in %s as planted", id, parts[0])
		}
		if want == canary.Fail {
			failing[s.Style[id]] = true
		}
	}
	for _, st := range canary.Styles {
		if !failing[st] {
			t.Errorf("no must-fail canary in style %s", st)
		}
	}
	if len(s.Want) != 2*len(canary.Styles) {
		t.Errorf("%d canaries, want %d", len(s.Want), 2*len(canary.Styles))
	}
	again, _ := canary.New(nil, files, false)
	planted(t, python(t, "ast"), again, map[string]string{files[0]: official, files[1]: official})
	for id := range again.Want {
		if _, same := s.Want[id]; same {
			t.Errorf("canary %s named the same in two sets: names must be unpredictable", id)
		}
	}
}

func TestNewPerFilePutsBothOutcomesInEveryFile(t *testing.T) {
	files := []string{"a/test_1.py", "b/test_2.py", "c/test_3.py"}
	s, err := canary.New(nil, files, true)
	if err != nil {
		t.Fatal(err)
	}
	planted(t, python(t, "ast"), s, map[string]string{files[0]: official, files[1]: official, files[2]: official})
	for _, f := range files {
		seen := map[string]bool{}
		for id, want := range s.Want {
			if strings.HasPrefix(id, f+"::") {
				seen[want] = true
			}
		}
		if !seen[canary.Pass] || !seen[canary.Fail] {
			t.Errorf("%s has outcomes %v, want both", f, seen)
		}
	}
	if _, err := canary.New(nil, nil, false); err == nil {
		t.Error("New with no files succeeded")
	}
}

// TestCanariesGetTheirOutcomes runs a set under pytest (where the machine has it) and checks
// every canary's reported outcome.
func TestCanariesGetTheirOutcomes(t *testing.T) {
	py := python(t, "pytest")
	dir := t.TempDir()
	files := []string{"tests/test_a.py", "tests/test_b.py"}
	s, err := canary.New(nil, files, true)
	if err != nil {
		t.Fatal(err)
	}
	src := planted(t, py, s, map[string]string{files[0]: official, files[1]: official})
	for _, f := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), []byte(src[f]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"-m", "pytest", "-p", "no:cacheprovider", "-q", "--junitxml=" + filepath.Join(dir, "r.xml")}, s.IDs()...)
	cmd := exec.Command(py, args...)
	cmd.Dir = dir
	out, _ := cmd.CombinedOutput()
	data, err := os.ReadFile(filepath.Join(dir, "r.xml"))
	if err != nil {
		t.Fatalf("no report: %v\n%s", err, out)
	}
	var doc struct {
		Cases []struct {
			Class   string    `xml:"classname,attr"`
			Name    string    `xml:"name,attr"`
			Failure *struct{} `xml:"failure"`
			Error   *struct{} `xml:"error"`
			Skipped *struct{} `xml:"skipped"`
		} `xml:"testsuite>testcase"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range doc.Cases {
		o := canary.Pass
		switch {
		case c.Failure != nil:
			o = canary.Fail
		case c.Error != nil || c.Skipped != nil:
			o = "other"
		}
		got[c.Class+"::"+c.Name] = o
	}
	for id, want := range s.Want {
		parts := strings.Split(id, "::")
		key := strings.ReplaceAll(strings.TrimSuffix(parts[0], ".py"), "/", ".")
		if len(parts) == 3 {
			key += "." + parts[1]
		}
		key += "::" + parts[len(parts)-1]
		if got[key] != want {
			t.Errorf("%s (%s): %q, want %q\n%s", id, s.Style[id], got[key], want, out)
		}
	}
}

// TestPlanter runs testdata/test_plant.py: canaries are planted where pytest finds them, and a
// classifier that knows how canaries are made (it learns from simulated plantings which names
// and places they tend to get) picks them out of files written here no better than chance,
// while it picks out canaries made the old way (hex names at the end) almost always.
func TestPlanter(t *testing.T) {
	py := python(t, "pytest, numpy")
	root := testenv.RepoRoot(t)
	var corpus []string
	for _, pattern := range []string{"environments/demo/*/tests/test_*.py", "probes/*/*/test_*.py"} {
		m, _ := filepath.Glob(filepath.Join(root, pattern))
		corpus = append(corpus, m...)
	}
	if len(corpus) < 20 {
		t.Fatalf("a corpus of %d test files, want at least 20", len(corpus))
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "plant.py"), canary.Planter, 0o644)
	cmd := exec.Command(py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "testdata/test_plant.py")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir, "CANARY_CORPUS="+strings.Join(corpus, string(os.PathListSeparator)))
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("plant.py's tests failed: %v", err)
	}
}
