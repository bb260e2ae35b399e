// Package tamper owns the static integrity check of a submission: it reads what the patch
// actually left on disk after `git apply` (every file it added or changed outside the paths the
// harness puts back, binary ones included, with the base version beside it), so the scan and git
// can never disagree about which file is which. A file that names the test runner or the harness
// in code, shadows the test runner, links out of the repository, carries compiled code the scan
// cannot read, hides its text behind a source encoding, has a path with control characters, or
// adds a module at the repository's root named like one of the standard library's, is refused
// before any of the submission's code runs.
//
// The scan is a cheap first filter, not the defence: code can build any name at run time.
// Verdicts rest on canaries among the official tests and on probes judged out of process.
package tamper

import (
	"archive/tar"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Finding is one reason a patch is refused.
type Finding struct {
	File   string
	Line   int // line in the new file; 0 for whole-file findings
	Reason string
}

func (f Finding) String() string {
	if f.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", f.File, f.Line, f.Reason)
	}
	return f.File + ": " + f.Reason
}

// Change is one path the submission left changed on disk.
type Change struct {
	Path string
	// Data is the new content (a link's target for links); nil for a deleted path.
	Data []byte
	// Base is the content at the base commit, nil when the path is new.
	Base    []byte
	Link    bool
	Deleted bool
}

// ErrTooLarge is returned when the changes exceed the limit the setup script was given.
var ErrTooLarge = errors.New("the patch writes more than the harness reads for its scan")

// ReadChanges reads changes.tar as the setup script writes it (members named by the hex of the
// path's bytes: n/ new content, l/ link target, b/ base content, d/ deleted; "over" when the
// limit was reached). It reads at most limit bytes of content.
func ReadChanges(r io.Reader, limit int64) ([]Change, error) {
	tr := tar.NewReader(r)
	byPath := map[string]*Change{}
	var total int64
	get := func(p string) *Change {
		c := byPath[p]
		if c == nil {
			c = &Change{Path: p}
			byPath[p] = c
		}
		return c
	}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("changes: %w", err)
		}
		if h.Name == "over" {
			return nil, ErrTooLarge
		}
		kind, hexPath, ok := strings.Cut(h.Name, "/")
		raw, err := hex.DecodeString(hexPath)
		if !ok || err != nil || len(raw) == 0 {
			return nil, fmt.Errorf("changes: bad member %q", h.Name)
		}
		if total += h.Size; total > limit {
			return nil, ErrTooLarge
		}
		data, err := io.ReadAll(io.LimitReader(tr, h.Size))
		if err != nil {
			return nil, fmt.Errorf("changes: %w", err)
		}
		c := get(string(raw))
		switch kind {
		case "n":
			c.Data = data
		case "l":
			c.Data, c.Link = data, true
		case "b":
			c.Base = data
		case "d":
			c.Deleted = true
		default:
			return nil, fmt.Errorf("changes: bad member %q", h.Name)
		}
	}
	out := make([]Change, 0, len(byPath))
	for _, c := range byPath {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// shadowing are module names a repository must not provide: they would replace the runner.
var shadowing = map[string]bool{"pytest": true, "_pytest": true, "pluggy": true, "py": true, "infradev_report": true, "infradev_probe": true}

// harnessRef matches code that reaches for the runner or the harness.
var harnessRef = regexp.MustCompile(`_pytest|\bpytest\b|junit|/run/infradev|infradev_report|infradev_probe|PYTEST_|\bpluggy\b|pytest_[a-z_]+\s*\(`)

// codingRe is PEP 263's source-encoding declaration.
var codingRe = regexp.MustCompile(`^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)`)

// readableEncodings are the source encodings whose ASCII the scan reads as Python does.
var readableEncodings = map[string]bool{"utf-8": true, "utf8": true, "ascii": true, "us-ascii": true,
	"latin-1": true, "latin1": true, "iso-8859-1": true, "iso8859-1": true, "l1": true, "utf-8-sig": true}

// Scan checks what the submission left on disk. Every path here is the submission's: the
// harness-owned paths (official tests, test roots, runner configuration) were put back first.
func Scan(changes []Change) []Finding {
	var out []Finding
	for _, c := range changes {
		if f, bad := badPath(c.Path); bad {
			out = append(out, f)
			continue
		}
		if c.Deleted {
			continue
		}
		if mod := topModule(c.Path); shadowing[mod] {
			out = append(out, Finding{File: c.Path, Reason: fmt.Sprintf("provides module %q, which would shadow the test runner", mod)})
			continue
		}
		if mod := rootModule(c.Path); stdlibModules[mod] && c.Base == nil {
			out = append(out, Finding{File: c.Path, Reason: fmt.Sprintf("adds module %q at the repository's root, which would shadow the standard library's", mod)})
			continue
		}
		if c.Link {
			target := string(c.Data)
			if path.IsAbs(target) || !isLocal(path.Join(path.Dir(c.Path), target)) {
				out = append(out, Finding{File: c.Path, Reason: fmt.Sprintf("is a link out of the repository (to %q)", target)})
			}
			continue
		}
		if why := compiled(c.Path, c.Data); why != "" {
			out = append(out, Finding{File: c.Path, Reason: why})
			continue
		}
		if !isCode(c.Path, c.Data) {
			continue
		}
		out = append(out, scanSource(c)...)
	}
	return out
}

func badPath(p string) (Finding, bool) {
	if !utf8.ValidString(p) {
		return Finding{File: fmt.Sprintf("%q", p), Reason: "the path is not valid UTF-8"}, true
	}
	for _, r := range p {
		if unicode.IsControl(r) {
			return Finding{File: fmt.Sprintf("%q", p), Reason: "the path has control characters"}, true
		}
	}
	return Finding{}, false
}

// scanSource reports added lines of a Python source that refer to the runner or the harness.
// Lines also present in the base version (the file's own history) are not the submission's.
func scanSource(c Change) []Finding {
	var out []Finding
	lines := strings.Split(string(c.Data), "\n")
	for i, l := range lines[:min(2, len(lines))] {
		if m := codingRe.FindStringSubmatch(l); m != nil && !readableEncodings[strings.ToLower(strings.ReplaceAll(m[1], "_", "-"))] {
			out = append(out, Finding{File: c.Path, Line: i + 1, Reason: fmt.Sprintf("declares source encoding %q, which the scan cannot read", m[1])})
		}
	}
	old := map[string]int{}
	for _, l := range strings.Split(string(c.Base), "\n") {
		old[l]++
	}
	for i, l := range lines {
		if old[l] > 0 {
			old[l]--
			continue
		}
		if m := harnessRef.FindString(l); m != "" {
			out = append(out, Finding{File: c.Path, Line: i + 1, Reason: fmt.Sprintf("code refers to the test runner or harness (%q)", m)})
		}
	}
	return out
}

// compiled says why a file holds code the scan cannot read (byte-code, native objects), or "".
func compiled(p string, data []byte) string {
	switch ext := path.Ext(p); ext {
	case ".pyc", ".pyo", ".so", ".pyd", ".dylib":
		return fmt.Sprintf("ships compiled code (%s), which the scan cannot read", ext)
	}
	if bytes.HasPrefix(data, []byte("\x7fELF")) {
		return "ships a native executable or library, which the scan cannot read"
	}
	return ""
}

// topModule is the Python module a path would provide from any directory on sys.path:
// "pytest.py" and "src/_pytest/x.py" give "pytest" and "_pytest".
// rootModule is the module a path provides at the repository's root (the directory on the
// import path of the tests and the probes' children): "json" for json.py or json/__init__.py;
// "" for anything deeper.
func rootModule(p string) string {
	dir, base := path.Split(p)
	switch {
	case dir == "" && strings.HasSuffix(base, ".py"):
		return strings.TrimSuffix(base, ".py")
	case dir != "" && base == "__init__.py" && !strings.Contains(strings.TrimSuffix(dir, "/"), "/"):
		return strings.TrimSuffix(dir, "/")
	}
	return ""
}

func topModule(p string) string {
	for _, dir := range strings.Split(path.Dir(p), "/") {
		if shadowing[dir] {
			return dir
		}
	}
	base := path.Base(p)
	if base == "__init__.py" {
		return path.Base(path.Dir(p))
	}
	for _, ext := range []string{".py", ".pyi", ".pth"} {
		if strings.HasSuffix(base, ext) {
			return strings.TrimSuffix(base, ext)
		}
	}
	return ""
}

// isCode reports whether a file can run inside the test process: Python sources and path
// files, and scripts whose first line names Python.
func isCode(p string, data []byte) bool {
	for _, ext := range []string{".py", ".pyi", ".pth", ".pyx", ".pyw"} {
		if strings.HasSuffix(p, ext) {
			return true
		}
	}
	first, _, _ := bytes.Cut(data, []byte("\n"))
	return bytes.HasPrefix(first, []byte("#!")) && bytes.Contains(first, []byte("python"))
}

func isLocal(p string) bool {
	p = path.Clean(p)
	return p != ".." && !strings.HasPrefix(p, "../") && !path.IsAbs(p)
}
