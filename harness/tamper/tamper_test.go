package tamper_test

import (
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/tamper"
)

func addFile(name string, lines ...string) string {
	var b strings.Builder
	b.WriteString("diff --git a/" + name + " b/" + name + "\nnew file mode 100644\n--- /dev/null\n+++ b/" + name + "\n")
	b.WriteString("@@ -0,0 +1," + itoa(len(lines)) + " @@\n")
	for _, l := range lines {
		b.WriteString("+" + l + "\n")
	}
	return b.String()
}

func itoa(n int) string { return string(rune('0' + n)) }

func TestScan(t *testing.T) {
	cases := []struct {
		name  string
		patch string
		want  string // substring of the first finding; "" for none
	}{
		{"clean code", addFile("pkg/a.py", "import numpy", "x = 1"), ""},
		{"docs may mention pytest", addFile("README.md", "run python3 -m pytest"), ""},
		{"test file may use pytest", addFile("tests/test_a.py", "import pytest"), ""},
		{"test file name may use pytest", addFile("pkg/test_b.py", "import pytest"), ""},
		{"code importing _pytest", addFile("pkg/a.py", "x = 1", "import _pytest.runner"), "pkg/a.py:2: non-test code refers"},
		{"code writing junit", addFile("pkg/a.py", "open('/run/infradev/out/tests.xml','w')"), "pkg/a.py:1"},
		{"code defining a hook", addFile("pkg/plugin.py", "def pytest_runtest_makereport(item, call):"), "pkg/plugin.py:1"},
		{"shadow pytest module", addFile("pytest.py", "x = 1"), `provides module "pytest"`},
		{"shadow _pytest package", addFile("src/_pytest/__init__.py", "x = 1"), `provides module "_pytest"`},
		{"shadow pluggy", addFile("pluggy/hooks.py", "x = 1"), `provides module "pluggy"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs, err := tamper.Scan([]byte(c.patch))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want == "" && len(fs) > 0:
				t.Errorf("Scan() = %v, want no findings", fs)
			case c.want != "" && (len(fs) == 0 || !strings.Contains(fs[0].String(), c.want)):
				t.Errorf("Scan() = %v, want a finding containing %q", fs, c.want)
			}
		})
	}
}
