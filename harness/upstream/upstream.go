// Package upstream owns what a real task takes from its upstream repository, at build time and
// never into the tree: the gold patch (the change's files that are not tests), the official
// test patch (its test files) and the PR description (the merge commit's message), derived
// from `git diff base merge` in a mirror, split by path rules, and kept in the store by the
// digest of what they were derived from. A stored derivation is used without the mirror, so
// a machine with a warm store (or a cache hit) needs no repository at all.
package upstream

import (
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/mirror"
	"github.com/infradev/infradev/harness/task"
)

// Schema versions the derivation: a change to how files are derived changes every key.
const Schema = "infradev.upstream/v1"

// DefaultTests are the path rules that make a file part of the official tests: test
// directories, test modules and conftest files, as the three frameworks lay them out.
var DefaultTests = []string{"tests/**", "test/**", "**/tests/**", "**/test_*.py", "**/*_test.py", "**/conftest.py"}

// Change names one upstream change.
type Change struct {
	URL         string
	BaseCommit  string
	MergeCommit string
	// Tests are the globs of test paths ("**" matches any number of directories); empty means
	// DefaultTests.
	Tests []string
}

// Derived is what a change gives a task. The patch and description files are in Dir.
type Derived struct {
	Schema string   `json:"schema"`
	URL    string   `json:"url"`
	Base   string   `json:"base_commit"`
	Merge  string   `json:"merge_commit"`
	Tests  []string `json:"tests"`
	// GoldFiles and TestFiles are the paths each patch touches.
	GoldFiles []string `json:"gold_files"`
	TestFiles []string `json:"test_files"`
	// Digests of the three files (sha256:...).
	Gold          string `json:"gold"`
	TestPatch     string `json:"tests_patch"`
	PRDescription string `json:"pr_description"`

	Dir string `json:"-"`
}

// Files in a derivation's directory.
const (
	GoldFile = "gold.patch"
	TestFile = "tests.patch"
	PRFile   = "pr_description.md"
	meta     = "derived.json"
)

// Key is the derivation's content key: the change and the rules.
func (c Change) Key() string {
	data, _ := json.Marshal(struct {
		Schema, URL, Base, Merge string
		Tests                    []string
	}{Schema, c.URL, c.BaseCommit, c.MergeCommit, c.tests()})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func (c Change) tests() []string {
	if len(c.Tests) == 0 {
		return DefaultTests
	}
	return c.Tests
}

// Materialize returns the change's derivation from the store (storeDir/upstream/<key>), deriving
// it from a mirror when the store does not have it yet.
func Materialize(ctx context.Context, storeDir string, c Change, mirrors mirror.Map) (*Derived, error) {
	dir := filepath.Join(storeDir, "upstream", c.Key())
	if d, err := Read(dir); err == nil {
		return d, nil
	}
	gitDir, err := mirrors.Resolve(c.URL, c.BaseCommit, c.MergeCommit)
	if err != nil {
		return nil, err
	}
	d, files, err := Derive(ctx, gitDir, c)
	if err != nil {
		return nil, err
	}
	return d, write(dir, d, files)
}

// Read reads a stored derivation and checks its files against their digests.
func Read(dir string) (*Derived, error) {
	data, err := os.ReadFile(filepath.Join(dir, meta))
	if err != nil {
		return nil, err
	}
	var d Derived
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if d.Schema != Schema {
		return nil, fmt.Errorf("%s: schema %q, want %q", dir, d.Schema, Schema)
	}
	for name, want := range map[string]string{GoldFile: d.Gold, TestFile: d.TestPatch, PRFile: d.PRDescription} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		if got := digest.Bytes(b); got != want {
			return nil, fmt.Errorf("%s: %s is %s, recorded %s", dir, name, got, want)
		}
	}
	d.Dir = dir
	return &d, nil
}

// write stores a derivation atomically: a whole directory renamed into place.
func write(dir string, d *Derived, files map[string][]byte) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
			return err
		}
	}
	if err := atomicfile.WriteJSON(filepath.Join(tmp, meta), d); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(filepath.Join(dir, meta)); statErr == nil {
			return nil // another process stored the same derivation first
		}
		return err
	}
	d.Dir = dir
	return nil
}

// Derive computes a change's gold patch, test patch and PR description from the git directory
// that holds both commits. It returns the record and the files' contents.
func Derive(ctx context.Context, gitDir string, c Change) (*Derived, map[string][]byte, error) {
	g := func(stdin []byte, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"--git-dir", gitDir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_LITERAL_PATHSPECS=1", "LC_ALL=C")
		cmd.Stdin = bytes.NewReader(stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return out, nil
	}
	names, err := g(nil, "diff", "--no-renames", "--name-only", "-z", c.BaseCommit, c.MergeCommit)
	if err != nil {
		return nil, nil, err
	}
	var gold, tests []string
	for _, n := range strings.Split(string(names), "\x00") {
		if n == "" {
			continue
		}
		if IsTest(n, c.tests()) {
			tests = append(tests, n)
		} else {
			gold = append(gold, n)
		}
	}
	if len(gold) == 0 {
		return nil, nil, fmt.Errorf("%s %s..%s changes only test files: there is nothing to solve", c.URL, short(c.BaseCommit), short(c.MergeCommit))
	}
	if len(tests) == 0 {
		return nil, nil, fmt.Errorf("%s %s..%s changes no test files (rules %v): there are no official tests", c.URL, short(c.BaseCommit), short(c.MergeCommit), c.tests())
	}
	diff := func(paths []string) ([]byte, error) {
		args := []string{"diff", "--binary", "--full-index", "--no-renames", "--no-ext-diff", "--no-textconv",
			"--src-prefix=a/", "--dst-prefix=b/", c.BaseCommit, c.MergeCommit, "--"}
		return g(nil, append(args, paths...)...)
	}
	goldPatch, err := diff(gold)
	if err != nil {
		return nil, nil, err
	}
	testPatch, err := diff(tests)
	if err != nil {
		return nil, nil, err
	}
	msg, err := g(nil, "log", "-1", "--format=%B", c.MergeCommit)
	if err != nil {
		return nil, nil, err
	}
	sort.Strings(gold)
	sort.Strings(tests)
	d := &Derived{Schema: Schema, URL: c.URL, Base: c.BaseCommit, Merge: c.MergeCommit, Tests: c.tests(),
		GoldFiles: gold, TestFiles: tests, Gold: digest.Bytes(goldPatch), TestPatch: digest.Bytes(testPatch),
		PRDescription: digest.Bytes(msg)}
	return d, map[string][]byte{GoldFile: goldPatch, TestFile: testPatch, PRFile: msg}, nil
}

// FirstParent returns a commit's first parent in gitDir (a merge commit's mainline).
func FirstParent(ctx context.Context, gitDir, commit string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", "--git-dir", gitDir, "rev-parse", commit+"^1")
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("the first parent of %s: %w", commit, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// IsTest reports whether a repository path matches one of the test globs.
func IsTest(p string, globs []string) bool {
	for _, g := range globs {
		if Match(g, p) {
			return true
		}
	}
	return false
}

// Match matches a slash-separated path against a glob in which "**" stands for any number of
// whole directories (none included) and other parts follow path.Match.
func Match(glob, p string) bool {
	return match(strings.Split(glob, "/"), strings.Split(p, "/"))
}

func match(g, p []string) bool {
	for len(g) > 0 {
		if g[0] == "**" {
			if len(g) == 1 {
				return true
			}
			for i := 0; i <= len(p); i++ {
				if match(g[1:], p[i:]) {
					return true
				}
			}
			return false
		}
		if len(p) == 0 {
			return false
		}
		if ok, err := path.Match(g[0], p[0]); err != nil || !ok {
			return false
		}
		g, p = g[1:], p[1:]
	}
	return len(p) == 0
}

// CheckGlobs reports a glob path.Match cannot read.
func CheckGlobs(globs []string) error {
	for _, g := range globs {
		for _, part := range strings.Split(g, "/") {
			if part == "**" {
				continue
			}
			if _, err := path.Match(part, ""); err != nil {
				return fmt.Errorf("glob %q: %w", g, err)
			}
		}
	}
	return nil
}

func short(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

// Attach materialises an upstream task's derived files (from the store, or from a mirror the
// first time) and records them in t.Derived. Tasks that reference no upstream change are left
// as they are.
func Attach(ctx context.Context, storeDir string, t *task.Task, mirrors mirror.Map) error {
	if !t.Upstream() {
		return nil
	}
	d, err := Materialize(ctx, storeDir, Change{URL: t.Repo.URL, BaseCommit: t.Repo.BaseCommit,
		MergeCommit: t.Repo.MergeCommit, Tests: t.Tests.Paths}, mirrors)
	if err != nil {
		return fmt.Errorf("task %s: %w", t.ID, err)
	}
	t.Derived = &task.Derived{
		Gold:          filepath.Join(d.Dir, GoldFile),
		Tests:         filepath.Join(d.Dir, TestFile),
		PRDescription: filepath.Join(d.Dir, PRFile),
		Digest:        digest.Bytes([]byte(d.Gold + "\n" + d.TestPatch + "\n" + d.PRDescription)),
	}
	return nil
}

// Provenance checks that a task carries nothing of its upstream repository: no patch files in
// its directory or its probes' (but their samples/, which are written here), and, where gitDir (the repository's mirror) is given, no file
// whose bytes are a blob of that repository. Files under 64 bytes are not compared (an empty
// __init__.py is in every repository). It returns one line per problem.
func Provenance(ctx context.Context, dirs []string, gitDir string) ([]string, error) {
	var problems []string
	type file struct {
		path, blob string
	}
	var files []file
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() || !e.Type().IsRegular() {
				return nil
			}
			// Samples are written here (wrong fixes kept as diffs over gold, with no context).
			if ext := filepath.Ext(p); (ext == ".patch" || ext == ".diff") && filepath.Base(filepath.Dir(p)) != "samples" {
				problems = append(problems, fmt.Sprintf("%s: an upstream task carries no patch files (they are derived from its commits)", p))
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if len(data) >= 64 {
				h := sha1.New()
				fmt.Fprintf(h, "blob %d\x00", len(data))
				h.Write(data)
				files = append(files, file{p, hex.EncodeToString(h.Sum(nil))})
			}
			return nil
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	if gitDir == "" || len(files) == 0 {
		return problems, nil
	}
	var in strings.Builder
	for _, f := range files {
		in.WriteString(f.blob + "\n")
	}
	cmd := exec.CommandContext(ctx, "git", "--git-dir", gitDir, "cat-file", "--batch-check")
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("checking blobs in %s: %w", gitDir, err)
	}
	for i, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if i < len(files) && !strings.HasSuffix(line, " missing") {
			problems = append(problems, fmt.Sprintf("%s: its bytes are blob %s of the upstream repository: upstream code or text is never checked in", files[i].path, files[i].blob))
		}
	}
	return problems, nil
}

// OnGold turns a diff written on top of a change's gold tree into a submission against the
// base: in a scratch index (no work tree), the base's tree with the gold patch and then the diff
// applied, as one binary-safe diff from the base. A sample wrong fix is stored this way: a few
// changed lines over gold, never the upstream files themselves.
func OnGold(ctx context.Context, gitDir, base string, gold, diff []byte) ([]byte, error) {
	idx, err := os.CreateTemp("", "infradev-ongold-*.index")
	if err != nil {
		return nil, err
	}
	idx.Close()
	os.Remove(idx.Name()) // git writes it
	defer os.Remove(idx.Name())
	g := func(stdin []byte, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"--git-dir", gitDir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_INDEX_FILE="+idx.Name(), "LC_ALL=C")
		cmd.Stdin = bytes.NewReader(stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
		}
		return out, nil
	}
	if _, err := g(nil, "read-tree", base); err != nil {
		return nil, err
	}
	if _, err := g(gold, "apply", "--cached", "-"); err != nil {
		return nil, fmt.Errorf("the gold patch: %w", err)
	}
	// --unidiff-zero: samples are kept with no context lines (git diff -U0), so they hold
	// nothing of the upstream files but the lines they change.
	if _, err := g(diff, "apply", "--cached", "--unidiff-zero", "-"); err != nil {
		return nil, fmt.Errorf("the diff does not apply over gold: %w", err)
	}
	return g(nil, "diff", "--cached", "--binary", "--full-index", "--no-renames", "--no-ext-diff", "--no-textconv",
		"--src-prefix=a/", "--dst-prefix=b/", base)
}
