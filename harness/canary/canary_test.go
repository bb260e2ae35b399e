package canary_test

import (
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/canary"
	"github.com/infradev/infradev/harness/internal/testenv"
)

func TestNewCoversEveryStyleWithAFailingCanary(t *testing.T) {
	files := []string{"tests/test_a.py", "tests/unit/test_b.py"}
	s, err := canary.New(nil, files, false)
	if err != nil {
		t.Fatal(err)
	}
	failing := map[string]bool{}
	for id, want := range s.Want {
		file := strings.SplitN(id, "::", 2)[0]
		if !strings.Contains(s.Append[file], strings.Split(id, "::")[len(strings.Split(id, "::"))-1]) {
			t.Errorf("%s: its test is not in the text appended to %s", id, file)
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
	py := ""
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import pytest").Run() == nil {
			py = p
			break
		}
	}
	testenv.Require(t, py != "", "python3 with pytest (Debian's python3-pytest)")
	dir := t.TempDir()
	files := []string{"tests/test_a.py", "tests/test_b.py"}
	s, err := canary.New(nil, files, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), []byte("def test_official():\n    assert True\n"+s.Append[f]), 0o644); err != nil {
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
