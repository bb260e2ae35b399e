package mirror_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/fixture"
	"github.com/infradev/infradev/harness/mirror"
)

func TestResolve(t *testing.T) {
	u := fixture.New(t)
	owners := t.TempDir() // a shared directory of mirrors laid out as owner+name
	if err := os.Symlink(u.GitDir, filepath.Join(owners, "fixture+calc")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, spec, url string
		want            string // the git directory, or a substring of the error
	}{
		{"exact URL", fixture.URL + "=" + u.GitDir, fixture.URL, u.GitDir},
		{"URL with .git", fixture.URL + "=" + u.GitDir, fixture.URL + ".git", u.GitDir},
		{"prefix, owner+name", "https://example.invalid/=" + owners, fixture.URL, filepath.Join(owners, "fixture+calc")},
		{"first entry lacks it, second has it", "https://example.invalid/=" + t.TempDir() + "," + fixture.URL + "=" + u.GitDir, fixture.URL, u.GitDir},
		{"no entry", "https://other.invalid/x=" + u.GitDir, fixture.URL, "the mirror map has no entry for it"},
		{"not a git directory", fixture.URL + "=" + t.TempDir(), fixture.URL, "not a git directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := mirror.Parse(c.spec, "test")
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.Resolve(c.url, u.Base, u.Merge)
			switch {
			case err == nil && got != c.want:
				t.Errorf("Resolve() = %s, want %s", got, c.want)
			case err != nil && !strings.Contains(err.Error(), c.want):
				t.Errorf("Resolve() error = %v, want %q", err, c.want)
			case err != nil && !errors.Is(err, mirror.ErrNotFound):
				t.Errorf("error %v does not wrap ErrNotFound", err)
			}
		})
	}
	m, _ := mirror.Parse(fixture.URL+"="+u.GitDir, "test")
	_, err := m.Resolve(fixture.URL, u.Base, strings.Repeat("ab", 20))
	if err == nil || !strings.Contains(err.Error(), "lacks commit "+strings.Repeat("ab", 20)) || !strings.Contains(err.Error(), u.GitDir) {
		t.Errorf("a missing commit: %v; want the URL, the commit and the mirror tried", err)
	}
}

func TestParseErrorsNameTheSource(t *testing.T) {
	for spec, want := range map[string]string{
		"https://x.invalid/a":             "file:1: mirror entry \"https://x.invalid/a\" is not PREFIX=DIR",
		"# comment\nhttps://x/a=relative": "file:2: mirror directory \"relative\" must be an absolute path",
	} {
		if _, err := mirror.Parse(spec, "file"); err == nil || err.Error() != want {
			t.Errorf("Parse(%q) error = %v, want %q", spec, err, want)
		}
	}
}

func TestFromEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mirrors")
	os.WriteFile(file, []byte("# lab mirrors\nhttps://c.invalid/r = /srv/c\n"), 0o644)
	t.Setenv("INFRADEV_GIT_MIRRORS", "https://b.invalid/r=/srv/b")
	t.Setenv("INFRADEV_GIT_MIRRORS_FILE", file)
	m, err := mirror.FromEnv([]string{"https://a.invalid/r=/srv/a"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.String(), "https://a.invalid/r=/srv/a,https://b.invalid/r=/srv/b,https://c.invalid/r=/srv/c"; got != want {
		t.Errorf("FromEnv() = %s, want %s (flags, then the variable, then the file)", got, want)
	}
}
