package judge_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/judge"
)

// TestLibrary runs testdata/test_library.py under pytest with the library staged as the
// sandbox stages it: the code under test in child processes, as another user when root.
func TestLibrary(t *testing.T) {
	py := "/usr/bin/python3"
	testenv.Require(t, exec.Command(py, "-c", "import pytest, numpy").Run() == nil, "Debian's python3 with pytest and numpy")
	// Not t.TempDir: its parent is private to root, and the child runs as another user.
	dir, err := os.MkdirTemp("", "judge-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	lib := filepath.Join(dir, "lib")
	repo := filepath.Join(dir, "repo")
	private := filepath.Join(dir, "private")
	for _, d := range []string{lib, filepath.Join(repo, "pkg"), private} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(private, 0o700)
	os.Chmod(dir, 0o755)
	os.WriteFile(filepath.Join(lib, judge.LibraryModule+".py"), judge.Library, 0o644)
	os.WriteFile(filepath.Join(repo, "pkg", "__init__.py"), []byte("def double(x):\n    return 2 * x\n"), 0o644)
	// A repository module named like a standard-library one the boot code imports: it must
	// never replace the boot's (it would send a forged result).
	os.WriteFile(filepath.Join(repo, "json.py"), []byte(shadowJSON), 0o644)
	// The gold tree, as the runner mounts it: readable by reference children only.
	refDir := filepath.Join(dir, "ref")
	gold := filepath.Join(refDir, "repo")
	if err := os.MkdirAll(filepath.Join(gold, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(gold, "pkg", "__init__.py"), []byte("def double(x):\n    return x + x\n\nGOLD = True\n"), 0o644)
	os.Chmod(refDir, 0o750)
	if os.Geteuid() == 0 {
		if err := os.Chown(refDir, 0, 65532); err != nil {
			t.Fatal(err)
		}
	}
	// A stand-in NVML whose used memory the child sets through a file it may write.
	cc, err := exec.LookPath("cc")
	testenv.Require(t, err == nil, "a C compiler for the stand-in NVML library")
	nvmlLib, gpuDir := filepath.Join(dir, "libfake-nvml.so"), filepath.Join(dir, "gpu")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", nvmlLib, "testdata/fake_nvml.c").CombinedOutput(); err != nil {
		t.Fatalf("compiling the stand-in NVML: %v\n%s", err, out)
	}
	if err := os.Mkdir(gpuDir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(gpuDir, 0o777)
	cmd := exec.Command(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", judge.LibraryModule, "testdata/test_library.py")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+lib, "INFRADEV_REPO="+repo, "JUDGE_PRIVATE="+private, "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1",
		"INFRADEV_NVML_LIBRARY="+nvmlLib, "INFRADEV_REFERENCE="+gold, "JUDGE_LIB="+lib, "FAKE_NVML_USED="+filepath.Join(gpuDir, "used"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the library's tests failed: %v\n%s", err, out)
	}
	if os.Geteuid() == 0 && strings.Contains(string(out), "skipped") {
		t.Errorf("tests skipped as root:\n%s", out)
	}
}

// shadowJSON forges a result if it is ever imported in place of the standard library's json.
const shadowJSON = `import os
data = b'{"ok": true, "values": {"x": 4, "forged": true}}'
for fd in range(3, 64):
    try:
        os.write(fd, len(data).to_bytes(8, "big") + data)
    except OSError:
        pass
os._exit(0)
`

func TestCollectionProblems(t *testing.T) {
	c := judge.Collected{IDs: []string{"test_probes.py::test_a"}}
	c.Errors = append(c.Errors, struct {
		NodeID string `json:"nodeid"`
		Text   string `json:"text"`
	}{"test_broken.py", "Traceback:\n  File \"/run/infradev/probes/test_broken.py\", line 7\n    def f(:\nE   SyntaxError: invalid syntax"})
	ps := judge.CollectionProblems(c, []string{"test_probes.py::test_a", "test_probes.py::test_nope"}, "/run/infradev/probes")
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	want := []string{"test_broken.py:7: does not collect: SyntaxError: invalid syntax",
		"test_probes.py: probe test test_probes.py::test_nope does not exist (not collected)"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("CollectionProblems() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestCheckScript(t *testing.T) {
	py := "/usr/bin/python3"
	testenv.Require(t, exec.Command(py, "-c", "pass").Run() == nil, "Debian's python3")
	dir := t.TempDir()
	repo, probes := filepath.Join(dir, "repo"), filepath.Join(dir, "probes")
	os.MkdirAll(filepath.Join(repo, "minitron"), 0o755)
	os.WriteFile(filepath.Join(repo, "minitron", "__init__.py"), nil, 0o644)
	os.WriteFile(filepath.Join(repo, "helpers.py"), nil, 0o644)
	os.MkdirAll(probes, 0o755)
	os.WriteFile(filepath.Join(probes, "test_ok.py"), []byte("import numpy\nfrom infradev_probe import run\nrun('from minitron import x')\n"), 0o644)
	os.WriteFile(filepath.Join(probes, "test_in.py"), []byte("import os\n\ndef test_x():\n    from minitron.model import MLP\n    import helpers\n    __import__('minitron.comm')\n"), 0o644)
	os.WriteFile(filepath.Join(probes, "test_syntax.py"), []byte("def broken(:\n    pass\n"), 0o644)
	// Inputs drawn fresh by the test itself, through a helper, a fixture, or a helper module.
	os.WriteFile(filepath.Join(probes, "_inputs.py"), []byte("from infradev_probe import fresh\n\ndef prompts():\n    return fresh().integers(9, size=3)\n"), 0o644)
	os.WriteFile(filepath.Join(probes, "test_fresh.py"), []byte(`import pytest
from infradev_probe import fresh, run
from _inputs import prompts

def _args():
    return {"seed": int(fresh().integers(99))}

@pytest.fixture
def seeded():
    return _args()

def test_direct():
    run("pass", {"x": int(fresh().integers(9))})

def test_helper():
    run("pass", _args())

def test_fixture(seeded):
    run("pass", seeded)

def test_module():
    run("pass", {"p": prompts()})

class TestGroup:
    def test_in_class(self):
        run("pass", _args())
`), 0o644)
	// Inputs written in the file: a replay of gold's child passes these.
	os.WriteFile(filepath.Join(probes, "test_fixed.py"), []byte(`from infradev_probe import run

def _args():
    return {"x": 3}

def test_constant():
    assert run("emit(y=ARGS['x'] * 2)", _args())["y"] == 6

class TestFixed:
    def test_method(self):
        run("pass")
`), 0o644)
	script := filepath.Join(dir, "check_probes.py")
	os.WriteFile(script, judge.CheckScript, 0o644)
	out, err := exec.Command(py, "-I", script, repo, probes).Output()
	if err != nil {
		t.Fatal(err)
	}
	ps, err := judge.ParseCheck(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.File+":"+itoa(p.Line))
	}
	want := "test_in.py:4 test_in.py:5 test_in.py:6 test_syntax.py:1 test_fixed.py:6 test_fixed.py:10"
	if strings.Join(got, " ") != want {
		t.Errorf("problems at %v, want %s (%v)", got, want, ps)
	}
}

func itoa(n int) string {
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	if s == "" {
		return "0"
	}
	return s
}
