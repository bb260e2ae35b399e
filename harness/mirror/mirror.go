// Package mirror owns finding upstream git repositories without the network: a mirror map turns
// a repository URL into local (or shared) git directories, the way GOPROXY turns a module path
// into proxies, and Resolve checks that the commits a task needs are there. An air-gapped
// cluster points the same map at its own copies; commit ids make any copy safe to use.
//
// A map is a list of entries "PREFIX=DIR", separated by commas or newlines. An entry whose
// prefix is a whole repository URL maps that repository to DIR; a prefix ending in "/" maps
// every repository under it to DIR/<rest of the URL> (with or without ".git", and as "owner+name"
// when the rest is "owner/name"). Entries are tried in order. Sources: the --git-mirror flags,
// then $INFRADEV_GIT_MIRRORS, then the lines of $INFRADEV_GIT_MIRRORS_FILE.
package mirror

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// Entry maps a URL or URL prefix to a directory.
type Entry struct {
	Prefix string
	Dir    string
}

// Map is an ordered list of entries.
type Map []Entry

// Parse reads a map from its text form ("PREFIX=DIR" entries separated by commas or newlines;
// blank entries and lines starting with # are ignored). source names where the text came from,
// for errors.
func Parse(text, source string) (Map, error) {
	var m Map
	line := 0
	for _, raw := range strings.Split(text, "\n") {
		line++
		raw = strings.TrimSpace(raw)
		if raw == "" || strings.HasPrefix(raw, "#") {
			continue
		}
		for _, e := range strings.Split(raw, ",") {
			e = strings.TrimSpace(e)
			if e == "" {
				continue
			}
			prefix, dir, ok := strings.Cut(e, "=")
			prefix, dir = strings.TrimSpace(prefix), strings.TrimSpace(dir)
			if !ok || prefix == "" || dir == "" {
				return nil, fmt.Errorf("%s:%d: mirror entry %q is not PREFIX=DIR", source, line, e)
			}
			if !filepath.IsAbs(dir) {
				return nil, fmt.Errorf("%s:%d: mirror directory %q must be an absolute path", source, line, dir)
			}
			m = append(m, Entry{Prefix: normalize(prefix), Dir: filepath.Clean(dir)})
		}
	}
	return m, nil
}

// FromEnv builds the map from flags (each a map in text form) followed by $INFRADEV_GIT_MIRRORS
// and the file $INFRADEV_GIT_MIRRORS_FILE.
func FromEnv(flags []string) (Map, error) {
	var m Map
	for _, f := range flags {
		part, err := Parse(f, "--git-mirror")
		if err != nil {
			return nil, err
		}
		m = append(m, part...)
	}
	if v := os.Getenv("INFRADEV_GIT_MIRRORS"); v != "" {
		part, err := Parse(v, "$INFRADEV_GIT_MIRRORS")
		if err != nil {
			return nil, err
		}
		m = append(m, part...)
	}
	if f := os.Getenv("INFRADEV_GIT_MIRRORS_FILE"); f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("$INFRADEV_GIT_MIRRORS_FILE: %w", err)
		}
		part, err := Parse(string(data), f)
		if err != nil {
			return nil, err
		}
		m = append(m, part...)
	}
	return m, nil
}

// String is the map in its text form.
func (m Map) String() string {
	parts := make([]string, len(m))
	for i, e := range m {
		parts[i] = e.Prefix + "=" + e.Dir
	}
	return strings.Join(parts, ",")
}

// Candidates lists the directories that may hold url, in the order they are tried.
func (m Map) Candidates(url string) []string {
	url = normalize(url)
	var out []string
	for _, e := range m {
		switch {
		case e.Prefix == url:
			out = append(out, e.Dir)
		case strings.HasSuffix(e.Prefix, "/") && strings.HasPrefix(url, e.Prefix):
			rest := strings.TrimPrefix(url, e.Prefix)
			out = append(out, filepath.Join(e.Dir, rest), filepath.Join(e.Dir, rest+".git"),
				filepath.Join(e.Dir, strings.ReplaceAll(rest, "/", "+")))
		}
	}
	return out
}

// ErrNotFound is wrapped by Resolve's error when no mirror has the commits.
var ErrNotFound = errors.New("no mirror has the commits")

var commitRe = regexp.MustCompile(`^[0-9a-f]{40}$`)

// Resolve returns the first git directory of url that holds every one of commits, or an error
// naming the URL, the commits and every mirror tried with why it was passed over.
func (m Map) Resolve(url string, commits ...string) (string, error) {
	for _, c := range commits {
		if !commitRe.MatchString(c) {
			return "", fmt.Errorf("commit %q of %s: not a full commit id", c, url)
		}
	}
	cands := m.Candidates(url)
	var tried []string
	for _, dir := range cands {
		gitDir, why := gitDirOf(dir)
		if why == "" {
			why = missing(gitDir, commits)
		}
		if why == "" {
			return gitDir, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%s)", dir, why))
	}
	if len(cands) == 0 {
		return "", fmt.Errorf("%w: %s at %s: the mirror map has no entry for it (set --git-mirror or $INFRADEV_GIT_MIRRORS; map: %q)",
			ErrNotFound, url, strings.Join(commits, ", "), m.String())
	}
	return "", fmt.Errorf("%w: %s at %s; tried %s", ErrNotFound, url, strings.Join(commits, ", "), strings.Join(tried, "; "))
}

// gitDirOf finds the git directory at dir: dir itself (bare), dir/.git, or dir/repo (as a
// snapshot tool lays them out). It returns why not when there is none.
func gitDirOf(dir string) (string, string) {
	for _, d := range []string{dir, filepath.Join(dir, ".git"), filepath.Join(dir, "repo")} {
		if fi, err := os.Stat(filepath.Join(d, "objects")); err == nil && fi.IsDir() {
			if _, err := os.Stat(filepath.Join(d, "HEAD")); err == nil {
				return d, ""
			}
		}
	}
	if _, err := os.Stat(dir); err != nil {
		return "", "does not exist"
	}
	return "", "not a git directory"
}

// missing says which commits gitDir lacks, or "".
func missing(gitDir string, commits []string) string {
	if len(commits) == 0 {
		return ""
	}
	cmd := exec.Command("git", "--git-dir", gitDir, "cat-file", "--batch-check")
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	var in strings.Builder
	for _, c := range commits {
		in.WriteString(c + "^{commit}\n")
	}
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.Output()
	if err != nil {
		return "git cat-file failed: " + err.Error()
	}
	var lacks []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	i := 0
	for sc.Scan() {
		if strings.HasSuffix(sc.Text(), " missing") && i < len(commits) {
			lacks = append(lacks, commits[i])
		}
		i++
	}
	if len(lacks) > 0 {
		return "lacks commit " + strings.Join(lacks, ", ")
	}
	return ""
}

// normalize drops a trailing ".git" and spaces so that "https://github.com/o/r.git" and
// "https://github.com/o/r" name the same repository.
func normalize(u string) string {
	u = strings.TrimSpace(u)
	if !strings.HasSuffix(u, "/") {
		u = strings.TrimSuffix(u, ".git")
	}
	return u
}
