package tamper_test

import (
	"archive/tar"
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/cheat"
	"github.com/infradev/infradev/harness/tamper"
)

func added(path string, lines ...string) tamper.Change {
	return tamper.Change{Path: path, Data: []byte(strings.Join(lines, "\n") + "\n")}
}

func TestScan(t *testing.T) {
	cases := []struct {
		name   string
		change tamper.Change
		want   string // substring of the first finding; "" for none
	}{
		{"clean code", added("pkg/a.py", "import numpy", "x = 1"), ""},
		{"docs may mention pytest", added("README.md", "run python3 -m pytest"), ""},
		{"code importing _pytest", added("pkg/a.py", "x = 1", "import _pytest.runner"), "pkg/a.py:2: code refers"},
		{"a module named like a test is scanned too", added("pkg/test_helpers.py", "import pytest"), "pkg/test_helpers.py:1"},
		{"a tests directory outside the test roots is scanned", added("pkg/tests/util.py", "from _pytest import runner"), "pkg/tests/util.py:1"},
		{"code writing junit", added("pkg/a.py", "open('/run/infradev/out/tests.xml','w')"), "pkg/a.py:1"},
		{"code reaching the report plugin", added("pkg/a.py", "import infradev_report"), "pkg/a.py:1"},
		{"code defining a hook", added("pkg/plugin.py", "def pytest_runtest_makereport(item, call):"), "pkg/plugin.py:1"},
		{"shadow pytest module", added("pytest.py", "x = 1"), `provides module "pytest"`},
		{"shadow _pytest package", added("src/_pytest/__init__.py", "x = 1"), `provides module "_pytest"`},
		{"shadow pluggy", added("pluggy/hooks.py", "x = 1"), `provides module "pluggy"`},
		{"shadow the judge library", added("infradev_probe.py", "x = 1"), `provides module "infradev_probe"`},
		{"a standard-library module at the root", added("json.py", "x = 1"), `adds module "json" at the repository's root`},
		{"a standard-library package at the root", added("base64/__init__.py", "x = 1"), `adds module "base64"`},
		{"a private standard-library module at the root", added("_thread.py", "x = 1"), `adds module "_thread"`},
		{"a standard-library name deeper down is the package's own", added("pkg/json.py", "x = 1"), ""},
		{"a root module the base already had", tamper.Change{Path: "queue.py", Data: []byte("x = 2"), Base: []byte("x = 1")}, ""},
		{"newline in a path", added("pkg/a\nb.py", "x = 1"), "control characters"},
		{"path not UTF-8", added("pkg/\xff.py", "x = 1"), "not valid UTF-8"},
		{"byte-code", tamper.Change{Path: "pkg/__pycache__/a.cpython-311.pyc", Data: []byte("\xa7\r\r\n....")}, "compiled code (.pyc)"},
		{"native library", tamper.Change{Path: "pkg/fast.so", Data: []byte("\x7fELF...")}, "compiled code (.so)"},
		{"ELF under another name", tamper.Change{Path: "pkg/data.bin", Data: []byte("\x7fELF\x02\x01")}, "native executable"},
		{"utf-7 source", added("pkg/a.py", "# -*- coding: utf-7 -*-", "x = 1"), `encoding "utf-7"`},
		{"latin-1 source is read", added("pkg/a.py", "# coding: latin-1", "x = 1"), ""},
		{"python script without extension", added("bin/tool", "#!/usr/bin/env python3", "import _pytest"), "bin/tool:2"},
		{"link out of the repository", tamper.Change{Path: "pkg/x.py", Data: []byte("/run/infradev/in/infradev_report.py"), Link: true}, "link out of the repository"},
		{"link escaping upwards", tamper.Change{Path: "pkg/x.py", Data: []byte("../../etc/passwd"), Link: true}, "link out of the repository"},
		{"link inside the repository", tamper.Change{Path: "pkg/x.py", Data: []byte("y.py"), Link: true}, ""},
		{"a base line that names pytest is not the submission's", tamper.Change{Path: "pkg/a.py",
			Data: []byte("import sys\nIN_TESTS = 'pytest' in sys.modules\nx = 2\n"), Base: []byte("import sys\nIN_TESTS = 'pytest' in sys.modules\nx = 1\n")}, ""},
		{"a second copy of a base line is", tamper.Change{Path: "pkg/a.py",
			Data: []byte("import pytest\nimport pytest\n"), Base: []byte("import pytest\n")}, "pkg/a.py:2"},
		{"a deleted file", tamper.Change{Path: "pkg/a.py", Deleted: true}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := tamper.Scan([]tamper.Change{c.change})
			switch {
			case c.want == "" && len(fs) > 0:
				t.Errorf("Scan() = %v, want no findings", fs)
			case c.want != "" && (len(fs) == 0 || !strings.Contains(fs[0].String(), c.want)):
				t.Errorf("Scan() = %v, want a finding containing %q", fs, c.want)
			}
		})
	}
}

// TestCheatsEvadeTheScan: the cheats validation adds build every name at run time, as a
// cheat hiding from the scan would; were the scan to stop them, validation would never test
// the canaries and probes against them.
func TestCheatsEvadeTheScan(t *testing.T) {
	for _, name := range cheat.Names {
		c, err := cheat.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		if fs := tamper.Scan([]tamper.Change{{Path: "pkg/" + c.Module + ".py", Data: []byte(c.Source)}}); len(fs) > 0 {
			t.Errorf("cheat %s: the scan stops it (%v); validation would not test the probes against it", name, fs)
		}
	}
}

func member(tw *tar.Writer, name string, data []byte) {
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data))})
	tw.Write(data)
}

func TestReadChanges(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	member(tw, "n/"+hex.EncodeToString([]byte("pkg/a\nb.py")), []byte("x = 1\n"))
	member(tw, "b/"+hex.EncodeToString([]byte("pkg/a\nb.py")), []byte("x = 0\n"))
	member(tw, "l/"+hex.EncodeToString([]byte("pkg/link.py")), []byte("/etc/passwd"))
	member(tw, "d/"+hex.EncodeToString([]byte("gone.py")), nil)
	tw.Close()
	got, err := tamper.ReadChanges(bytes.NewReader(buf.Bytes()), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Path != "gone.py" || !got[0].Deleted || got[1].Path != "pkg/a\nb.py" ||
		string(got[1].Base) != "x = 0\n" || !got[2].Link {
		t.Fatalf("ReadChanges() = %+v", got)
	}
	if _, err := tamper.ReadChanges(bytes.NewReader(buf.Bytes()), 8); !errors.Is(err, tamper.ErrTooLarge) {
		t.Errorf("over the limit: err = %v, want ErrTooLarge", err)
	}
	var over bytes.Buffer
	tw = tar.NewWriter(&over)
	member(tw, "over", nil)
	tw.Close()
	if _, err := tamper.ReadChanges(&over, 1<<20); !errors.Is(err, tamper.ErrTooLarge) {
		t.Errorf("an 'over' member: err = %v, want ErrTooLarge", err)
	}
	var bad bytes.Buffer
	tw = tar.NewWriter(&bad)
	member(tw, "n/not-hex", nil)
	tw.Close()
	if _, err := tamper.ReadChanges(&bad, 1<<20); err == nil {
		t.Error("a member not named by hex was accepted")
	}
}
