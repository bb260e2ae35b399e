package image

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/envspec"
)

// PipLock is a pip step's lock file: pip's requirements format with hashes, one archive per
// package (name==version --hash=sha256:<hex>, its file name in a trailing comment), sorted by
// name, under a header naming the step, the venv and the requirements it was resolved from.
// pip reads it as it is (`pip install --require-hashes -r FILE`).
type PipLock struct {
	Env          string
	Step         string
	Venv         string
	Requirements []string
	Packages     []PipPackage
}

// PipPackage is one pinned archive.
type PipPackage struct {
	// Name is the normalised project name (PEP 503: lower case, runs of -_. as one -).
	Name    string `json:"name"`
	Version string `json:"version"`
	// SHA256 is the archive's sha256, in hex.
	SHA256 string `json:"sha256"`
	// File is the archive's file name on the index (a wheel, or a source distribution).
	File string `json:"file"`
}

// Wheel reports whether the archive is a wheel (installed as it is) rather than a source
// distribution (built at install time).
func (p PipPackage) Wheel() bool { return strings.HasSuffix(p.File, ".whl") }

func (p PipPackage) String() string { return p.Name + "==" + p.Version }

// requirement is the package's line in pip's requirements format.
func (p PipPackage) requirement() string {
	return fmt.Sprintf("%s==%s --hash=sha256:%s", p.Name, p.Version, p.SHA256)
}

// UnlockedError is returned for a pip step whose lock file is missing, or was resolved for
// another venv or other requirements than the step now has: `infradev env lock` must run.
type UnlockedError struct {
	Path   string // the lock file
	EnvDir string // the environment that defines the step
	Step   string
	// Why says what is wrong with the lock ("does not exist").
	Why string
}

func (e *UnlockedError) Error() string {
	return fmt.Sprintf("pip step %s: %s %s: run `infradev env lock %s` to resolve its requirements", e.Step, e.Path, e.Why, e.EnvDir)
}

var (
	normRe    = regexp.MustCompile(`[-_.]+`)
	lockRe    = regexp.MustCompile(`^([a-z0-9][a-z0-9-]*)==(\S+) --hash=sha256:([0-9a-f]{64}) +# (\S+)$`)
	versionRe = regexp.MustCompile(`^[A-Za-z0-9.+!_-]+$`)
)

// normName is a project name as PEP 503 normalises it.
func normName(name string) string { return strings.ToLower(normRe.ReplaceAllString(name, "-")) }

// Format is the lock file's bytes: canonical, so equal locks are equal bytes (the step key
// covers them).
func (l *PipLock) Format() []byte {
	var b bytes.Buffer
	reqs, _ := json.Marshal(l.Requirements)
	fmt.Fprintf(&b, "# infradev pip lock: environment %s, step %s. Written by `infradev env lock`; do not edit.\n", l.Env, l.Step)
	fmt.Fprintf(&b, "# venv: %s\n", l.Venv)
	fmt.Fprintf(&b, "# requirements: %s\n", reqs)
	pkgs := append([]PipPackage{}, l.Packages...)
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	for _, p := range pkgs {
		fmt.Fprintf(&b, "%s # %s\n", p.requirement(), p.File)
	}
	return b.Bytes()
}

// WritePipLock writes the lock atomically.
func WritePipLock(path string, l *PipLock) error { return atomicfile.Write(path, l.Format()) }

// ReadPipLock reads the lock of pip step s. A missing lock, or one resolved for another venv
// or other requirements, is an *UnlockedError; a malformed one is an error naming file and
// line.
func ReadPipLock(s envspec.Step) (*PipLock, []byte, error) {
	path := s.LockPath()
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, &UnlockedError{Path: path, EnvDir: s.Dir, Step: s.Name, Why: "does not exist"}
	}
	if err != nil {
		return nil, nil, err
	}
	l, err := ParsePipLock(path, data)
	if err != nil {
		return nil, nil, err
	}
	if l.Venv != s.Pip.Venv || !slices.Equal(l.Requirements, s.Pip.Requirements) {
		reqs, _ := json.Marshal(s.Pip.Requirements)
		had, _ := json.Marshal(l.Requirements)
		return nil, nil, &UnlockedError{Path: path, EnvDir: s.Dir, Step: s.Name,
			Why: fmt.Sprintf("was resolved for venv %s and requirements %s, but env.yaml now says venv %s and requirements %s", l.Venv, had, s.Pip.Venv, reqs)}
	}
	return l, data, nil
}

// ParsePipLock parses a lock file's bytes; file names the file in errors.
func ParsePipLock(file string, data []byte) (*PipLock, error) {
	l := &PipLock{}
	seen, files := map[string]bool{}, map[string]bool{}
	var header []string
	var problems []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("%s:%d: %s", file, n, fmt.Sprintf(format, args...)))
		}
		switch {
		case strings.HasPrefix(line, "# "):
			header = append(header, line)
			if v, ok := strings.CutPrefix(line, "# venv: "); ok {
				l.Venv = v
			}
			if v, ok := strings.CutPrefix(line, "# requirements: "); ok {
				if err := json.Unmarshal([]byte(v), &l.Requirements); err != nil {
					bad("requirements: not a JSON list of strings: %v", err)
				}
			}
			if v, ok := strings.CutPrefix(line, "# infradev pip lock: environment "); ok {
				env, rest, _ := strings.Cut(v, ", step ")
				l.Env = env
				l.Step, _, _ = strings.Cut(rest, ". Written by")
			}
		case line == "":
		default:
			m := lockRe.FindStringSubmatch(line)
			if m == nil {
				bad("want `name==version --hash=sha256:<64 hex> # <file>`, got %q", line)
				continue
			}
			p := PipPackage{Name: m[1], Version: m[2], SHA256: m[3], File: m[4]}
			switch {
			case !versionRe.MatchString(p.Version):
				bad("%s: %q is not a version", p.Name, p.Version)
			case seen[p.Name]:
				bad("%s is pinned twice", p.Name)
			case !filepath.IsLocal(p.File) || strings.ContainsRune(p.File, '/') || files[p.File]:
				bad("%s: %q is not a distinct archive file name", p.Name, p.File)
			}
			seen[p.Name], files[p.File] = true, true
			l.Packages = append(l.Packages, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if l.Venv == "" || l.Requirements == nil {
		problems = append(problems, fmt.Sprintf("%s: the header lacks the venv or the requirements: not a lock `infradev env lock` wrote", file))
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "\n"))
	}
	return l, nil
}
