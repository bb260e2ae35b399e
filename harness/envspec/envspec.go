// Package envspec owns environment definitions: environments/<name>/env.yaml, a stack of
// layer steps (base -> toolchain -> project) and the image config. Load checks a definition
// against the infradev.env/v1 schema and reports every problem with file, line and field.
package envspec

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/infradev/infradev/harness/specfile"
)

// Schema is the schema version this package reads.
const Schema = "infradev.env/v1"

// Env is a loaded, checked environment definition.
type Env struct {
	Schema string `yaml:"schema"`
	Name   string `yaml:"name"`
	Layers []Step `yaml:"layers"`
	Config Config `yaml:"config"`

	// Dir is the directory holding env.yaml; step sources are relative to it.
	Dir string `yaml:"-"`
}

// Step is one layer of the stack. Exactly one of its kinds is set.
type Step struct {
	Name   string  `yaml:"name" json:"name"`
	Debian *Debian `yaml:"debian,omitempty" json:"debian,omitempty"`
	Apt    *Apt    `yaml:"apt,omitempty" json:"apt,omitempty"`
	Git    *Git    `yaml:"git,omitempty" json:"git,omitempty"`
	Copy   *Copy   `yaml:"copy,omitempty" json:"copy,omitempty"`
}

// Kind names the step's kind.
func (s Step) Kind() string {
	switch {
	case s.Debian != nil:
		return "debian"
	case s.Apt != nil:
		return "apt"
	case s.Git != nil:
		return "git"
	case s.Copy != nil:
		return "copy"
	}
	return ""
}

// Debian is a root filesystem made by mmdebstrap, reproducible for a given mirror state.
type Debian struct {
	Suite           string   `yaml:"suite" json:"suite"`
	Variant         string   `yaml:"variant" json:"variant"`
	Architecture    string   `yaml:"architecture" json:"architecture"`
	Include         []string `yaml:"include,omitempty" json:"include,omitempty"`
	SourceDateEpoch int64    `yaml:"source_date_epoch" json:"source_date_epoch"`
}

// Apt adds Debian packages on top of a debian step; the layer is what they change.
type Apt struct {
	Packages []string `yaml:"packages" json:"packages"`
}

// Git makes a repository with one deterministic commit from a source tree in this repository.
type Git struct {
	Source  string `yaml:"source" json:"source"`
	Dest    string `yaml:"dest" json:"dest"`
	Date    string `yaml:"date" json:"date"`
	Message string `yaml:"message" json:"message"`
	Author  string `yaml:"author" json:"author"`
}

// Copy puts a tree from this repository into the image.
type Copy struct {
	Source string `yaml:"source" json:"source"`
	Dest   string `yaml:"dest" json:"dest"`
}

// Config is the image config.
type Config struct {
	Env        map[string]string `yaml:"env"`
	WorkingDir string            `yaml:"workdir"`
}

var (
	nameRe   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	pkgRe    = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	authorRe = regexp.MustCompile(`^[^<>]+ <[^<>\s]+>$`)
)

// Load reads and checks environments/<name>/env.yaml in dir.
func Load(dir string) (*Env, error) {
	e := &Env{}
	doc := specfile.ReadFile(filepath.Join(dir, "env.yaml"), e)
	if !doc.Parsed() {
		return nil, doc.Errs.Err()
	}
	e.Dir = dir
	if e.Schema != Schema {
		doc.Errorf("schema", "must be %q, got %q", Schema, e.Schema)
	}
	if !nameRe.MatchString(e.Name) {
		doc.Errorf("name", "must match %s, got %q", nameRe, e.Name)
	} else if base := filepath.Base(filepath.Clean(dir)); e.Name != base {
		doc.Errorf("name", "must equal the directory name %q, got %q", base, e.Name)
	}
	if len(e.Layers) == 0 {
		doc.Errorf("layers", "must list at least one step")
	}
	names := map[string]bool{}
	for i, s := range e.Layers {
		e.checkStep(doc, i, s, names)
	}
	if e.Config.WorkingDir != "" && !filepath.IsAbs(e.Config.WorkingDir) {
		doc.Errorf("config.workdir", "must be absolute, got %q", e.Config.WorkingDir)
	}
	if err := doc.Errs.Err(); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Env) checkStep(doc *specfile.Doc, i int, s Step, names map[string]bool) {
	at := func(f string) string { return fmt.Sprintf("layers[%d].%s", i, f) }
	if !nameRe.MatchString(s.Name) {
		doc.Errorf(at("name"), "must match %s, got %q", nameRe, s.Name)
	} else if names[s.Name] {
		doc.Errorf(at("name"), "%q is used twice", s.Name)
	}
	names[s.Name] = true
	kinds := 0
	for _, set := range []bool{s.Debian != nil, s.Apt != nil, s.Git != nil, s.Copy != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		doc.Errorf(fmt.Sprintf("layers[%d]", i), "must have exactly one of debian, apt, git, copy; has %d", kinds)
		return
	}
	switch {
	case s.Debian != nil:
		if i != 0 {
			doc.Errorf(at("debian"), "a debian base must be the first layer")
		}
		if s.Debian.Suite == "" {
			doc.Errorf(at("debian.suite"), "is required (e.g. bookworm)")
		}
		switch s.Debian.Variant {
		case "minbase", "buildd", "important":
		default:
			doc.Errorf(at("debian.variant"), "must be minbase, buildd or important, got %q", s.Debian.Variant)
		}
		if s.Debian.Architecture == "" {
			doc.Errorf(at("debian.architecture"), "is required (e.g. amd64): it is part of the image, never taken from the host")
		}
		if s.Debian.SourceDateEpoch <= 0 {
			doc.Errorf(at("debian.source_date_epoch"), "is required and must be > 0")
		}
		checkPackages(doc, at("debian.include"), s.Debian.Include)
	case s.Apt != nil:
		if i == 0 || e.Layers[0].Debian == nil {
			doc.Errorf(at("apt"), "an apt step needs a debian base as the first layer")
		}
		if len(s.Apt.Packages) == 0 {
			doc.Errorf(at("apt.packages"), "must list at least one package")
		}
		checkPackages(doc, at("apt.packages"), s.Apt.Packages)
	case s.Git != nil:
		e.checkSource(doc, at("git.source"), s.Git.Source)
		checkDest(doc, at("git.dest"), s.Git.Dest, false)
		if _, err := time.Parse(time.RFC3339, s.Git.Date); err != nil {
			doc.Errorf(at("git.date"), "must be an RFC 3339 time (2024-01-01T00:00:00Z), got %q", s.Git.Date)
		}
		if s.Git.Message == "" {
			doc.Errorf(at("git.message"), "is required")
		}
		if !authorRe.MatchString(s.Git.Author) {
			doc.Errorf(at("git.author"), "must look like \"Name <email>\", got %q", s.Git.Author)
		}
	case s.Copy != nil:
		e.checkSource(doc, at("copy.source"), s.Copy.Source)
		checkDest(doc, at("copy.dest"), s.Copy.Dest, true)
	}
}

func checkPackages(doc *specfile.Doc, field string, pkgs []string) {
	for j, p := range pkgs {
		if !pkgRe.MatchString(p) {
			doc.Errorf(fmt.Sprintf("%s[%d]", field, j), "%q is not a Debian package name", p)
		}
	}
}

func (e *Env) checkSource(doc *specfile.Doc, field, src string) {
	if !filepath.IsLocal(src) {
		doc.Errorf(field, "must be a path inside %s, got %q", e.Dir, src)
		return
	}
	if fi, err := os.Stat(filepath.Join(e.Dir, src)); err != nil || !fi.IsDir() {
		doc.Errorf(field, "directory %s does not exist", src)
	}
}

func checkDest(doc *specfile.Doc, field, dest string, rootOK bool) {
	switch {
	case !filepath.IsAbs(dest) || filepath.Clean(dest) != dest:
		doc.Errorf(field, "must be a clean absolute path, got %q", dest)
	case dest == "/" && !rootOK:
		doc.Errorf(field, "must not be /")
	}
}

// Source returns the absolute path of a step's source directory.
func (e *Env) Source(rel string) string { return filepath.Join(e.Dir, rel) }
