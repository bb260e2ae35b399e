// Package tamper owns the static integrity check of a submission: a patch whose non-test code
// reaches for the test runner or the harness (pytest internals, JUnit reports, the harness's
// mount points), or that ships modules shadowing the test runner, is refused before it runs.
// Code under test runs inside the test runner's process, so such a patch could otherwise
// rewrite outcomes after the fact; this check is what keeps in-process tampering visible.
package tamper

import (
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
)

// Finding is one reason a patch is refused.
type Finding struct {
	File   string
	Line   int64 // line in the new file; 0 for whole-file findings
	Reason string
}

func (f Finding) String() string {
	if f.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", f.File, f.Line, f.Reason)
	}
	return f.File + ": " + f.Reason
}

// shadowing are module names a repository must not provide: they would replace the runner.
var shadowing = map[string]bool{"pytest": true, "_pytest": true, "pluggy": true, "py": true}

// harnessRef matches code that reaches for the runner or the harness.
var harnessRef = regexp.MustCompile(`_pytest|\bpytest\b|junit|/run/infradev|PYTEST_|pytest_[a-z_]+\s*\(`)

// Scan checks a unified diff. Test files (test_*.py, *_test.py, conftest.py, files under a
// tests/ or test/ directory) may use pytest; other Python files may not mention it.
func Scan(patch []byte) ([]Finding, error) {
	files, _, err := gitdiff.Parse(strings.NewReader(string(patch)))
	if err != nil {
		return nil, err
	}
	var out []Finding
	for _, f := range files {
		name := f.NewName
		if f.IsDelete || name == "" {
			continue
		}
		if mod := topModule(name); shadowing[mod] {
			out = append(out, Finding{File: name, Reason: fmt.Sprintf("provides module %q, which would shadow the test runner", mod)})
			continue
		}
		if isTestFile(name) || !isCode(name) {
			continue
		}
		for _, frag := range f.TextFragments {
			line := frag.NewPosition
			for _, l := range frag.Lines {
				if l.Op == gitdiff.OpAdd && harnessRef.MatchString(l.Line) {
					out = append(out, Finding{File: name, Line: line,
						Reason: fmt.Sprintf("non-test code refers to the test runner or harness (%q)", harnessRef.FindString(l.Line))})
				}
				if l.Op != gitdiff.OpDelete {
					line++
				}
			}
		}
	}
	return out, nil
}

// topModule is the Python module a path would provide from any directory on sys.path:
// "pytest.py" and "src/_pytest/x.py" give "pytest" and "_pytest" (the last path element that
// could be imported by that name).
func topModule(p string) string {
	base := path.Base(p)
	if strings.HasSuffix(base, ".py") {
		if base == "__init__.py" {
			return path.Base(path.Dir(p))
		}
		for _, dir := range strings.Split(path.Dir(p), "/") {
			if shadowing[dir] {
				return dir
			}
		}
		return strings.TrimSuffix(base, ".py")
	}
	for _, dir := range strings.Split(path.Dir(p), "/") {
		if shadowing[dir] {
			return dir
		}
	}
	return ""
}

// isCode reports whether a file can run inside the test process (Python sources, .pth files).
func isCode(p string) bool {
	for _, ext := range []string{".py", ".pyi", ".pth", ".pyx"} {
		if strings.HasSuffix(p, ext) {
			return true
		}
	}
	return false
}

func isTestFile(p string) bool {
	base := path.Base(p)
	if base == "conftest.py" || strings.HasPrefix(base, "test_") || strings.HasSuffix(base, "_test.py") {
		return true
	}
	for _, dir := range strings.Split(path.Dir(p), "/") {
		if dir == "tests" || dir == "test" {
			return true
		}
	}
	return false
}
