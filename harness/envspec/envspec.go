// Package envspec owns environment definitions: environments/<name>/env.yaml, a stack of
// layer steps (base -> toolchain -> project) and the image config. Load checks a definition
// against the infradev.env/v1 schema and reports every problem with file, line and field.
package envspec

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/specfile"
)

// Schema is the schema version this package reads.
const Schema = "infradev.env/v1"

// Env is a loaded, checked environment definition.
type Env struct {
	Schema string `yaml:"schema"`
	Name   string `yaml:"name"`
	// From names another environment (a sibling directory) whose layers come first: a project
	// stacks on its framework, a framework on its base. Shared steps share layers.
	From   string `yaml:"from"`
	Layers []Step `yaml:"layers"`
	Config Config `yaml:"config"`

	// Dir is the directory holding env.yaml; step sources are relative to it.
	Dir string `yaml:"-"`
}

// Step is one layer of the stack. Exactly one of its kinds is set.
type Step struct {
	Name   string  `yaml:"name" json:"name"`
	Debian *Debian `yaml:"debian,omitempty" json:"debian,omitempty"`
	Image  *Image  `yaml:"image,omitempty" json:"image,omitempty"`
	Apt    *Apt    `yaml:"apt,omitempty" json:"apt,omitempty"`
	Run    *Run    `yaml:"run,omitempty" json:"run,omitempty"`
	Git    *Git    `yaml:"git,omitempty" json:"git,omitempty"`
	Copy   *Copy   `yaml:"copy,omitempty" json:"copy,omitempty"`
	Pip    *Pip    `yaml:"pip,omitempty" json:"pip,omitempty"`

	// Dir is the directory of the env.yaml that defined the step (sources are relative to it).
	Dir string `yaml:"-" json:"-"`
}

// Image is a base image pinned by digest, from a registry or an OCI layout.
type Image struct {
	// Ref is registry/repository@sha256:<hex>.
	Ref string `yaml:"ref" json:"ref"`
}

// Run is a command run in the sandbox over the stack so far, with the network; its layer is
// what the command changed (deletions as whiteouts).
type Run struct {
	Command []string `yaml:"command" json:"command"`
	// Env adds environment variables (NAME=value).
	Env []string `yaml:"env,omitempty" json:"env,omitempty"`
	// Cwd is the working directory. Default "/".
	Cwd string `yaml:"cwd,omitempty" json:"cwd,omitempty"`
}

// Kind names the step's kind.
func (s Step) Kind() string {
	switch {
	case s.Debian != nil:
		return "debian"
	case s.Image != nil:
		return "image"
	case s.Run != nil:
		return "run"
	case s.Apt != nil:
		return "apt"
	case s.Git != nil:
		return "git"
	case s.Copy != nil:
		return "copy"
	case s.Pip != nil:
		return "pip"
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
	// Mirror is the apt source ("http://deb.debian.org/debian"); empty follows the host's apt
	// sources, which may add suites (updates, security) whose packages change often.
	Mirror string `yaml:"mirror,omitempty" json:"mirror,omitempty"`
}

// Apt adds Debian packages on top of a debian step; the layer is what they change.
type Apt struct {
	Packages []string `yaml:"packages" json:"packages"`
}

// Git puts a repository into the image: either an upstream repository checked out at a
// commit (URL, Commit), or one deterministic commit made from a source tree in this
// repository (Source, Date, Message, Author).
type Git struct {
	URL     string `yaml:"url,omitempty" json:"url,omitempty"`
	Commit  string `yaml:"commit,omitempty" json:"commit,omitempty"`
	Source  string `yaml:"source,omitempty" json:"source,omitempty"`
	Dest    string `yaml:"dest" json:"dest"`
	Date    string `yaml:"date,omitempty" json:"date,omitempty"`
	Message string `yaml:"message,omitempty" json:"message,omitempty"`
	Author  string `yaml:"author,omitempty" json:"author,omitempty"`
}

// Copy puts a tree from this repository into the image.
type Copy struct {
	Source string `yaml:"source" json:"source"`
	Dest   string `yaml:"dest" json:"dest"`
}

// Pip installs Python packages into a virtual environment from a lock file (pip's
// requirements format with hashes, beside env.yaml) that `infradev env lock` writes by
// resolving Requirements over the stack below. The layer is what the installation changed.
type Pip struct {
	// Venv is the virtual environment's absolute path; it is created (without pip) if the
	// layers below do not have it.
	Venv string `yaml:"venv" json:"venv"`
	// Requirements are what `infradev env lock` resolves (pip requirement specifiers).
	Requirements []string `yaml:"requirements" json:"requirements"`
	// Lock is the lock file's name inside the environment's directory.
	Lock string `yaml:"lock" json:"lock"`
}

// LockPath is the lock file of a pip step.
func (s Step) LockPath() string { return filepath.Join(s.Dir, s.Pip.Lock) }

// Config is the image config.
type Config struct {
	Env        map[string]string `yaml:"env"`
	WorkingDir string            `yaml:"workdir"`
}

var (
	nameRe     = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	pkgRe      = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	authorRe   = regexp.MustCompile(`^[^<>]+ <[^<>\s]+>$`)
	commitRe   = regexp.MustCompile(`^[0-9a-f]{40}$`)
	imageRefRe = regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+@sha256:[0-9a-f]{64}$`)
)

// EnvFile is the definition's file name inside an environment's directory.
const EnvFile = "env.yaml"

// Load reads and checks environments/<name>/env.yaml in dir, with the environments it stacks
// on (from:) before its own layers.
func Load(dir string) (*Env, error) { return load(dir, map[string]bool{}) }

func load(dir string, seen map[string]bool) (*Env, error) {
	e := &Env{}
	doc := specfile.ReadFile(filepath.Join(dir, EnvFile), e)
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
	if len(e.Layers) == 0 && e.From == "" {
		doc.Errorf("layers", "must list at least one step")
	}
	if e.From != "" && !nameRe.MatchString(e.From) {
		doc.Errorf("from", "must name a sibling environment, got %q", e.From)
	}
	names, locks := map[string]bool{}, map[string]bool{}
	for i, s := range e.Layers {
		e.checkStep(doc, i, s, names)
		if s.Pip != nil && s.Pip.Lock != "" {
			if locks[s.Pip.Lock] {
				doc.Errorf(fmt.Sprintf("layers[%d].pip.lock", i), "%q is the lock of another pip step", s.Pip.Lock)
			}
			locks[s.Pip.Lock] = true
		}
	}
	if e.Config.WorkingDir != "" && !filepath.IsAbs(e.Config.WorkingDir) {
		doc.Errorf("config.workdir", "must be absolute, got %q", e.Config.WorkingDir)
	}
	if err := doc.Errs.Err(); err != nil {
		return nil, err
	}
	for i := range e.Layers {
		e.Layers[i].Dir = dir
	}
	if e.From != "" {
		seen[e.Name] = true
		parent, err := loadFrom(dir, e.From, seen)
		if err != nil {
			return nil, fmt.Errorf("%s: from: %w", filepath.Join(dir, EnvFile), err)
		}
		e.Layers = append(append([]Step{}, parent.Layers...), e.Layers...)
		e.Config = mergeConfig(parent.Config, e.Config)
	}
	return e, nil
}

func loadFrom(dir, from string, seen map[string]bool) (*Env, error) {
	if seen[from] {
		return nil, fmt.Errorf("environments stack on each other in a cycle through %q", from)
	}
	seen[from] = true
	p, err := load(filepath.Join(filepath.Dir(filepath.Clean(dir)), from), seen)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func mergeConfig(parent, child Config) Config {
	out := Config{Env: map[string]string{}, WorkingDir: parent.WorkingDir}
	for k, v := range parent.Env {
		out.Env[k] = v
	}
	for k, v := range child.Env {
		out.Env[k] = v
	}
	if child.WorkingDir != "" {
		out.WorkingDir = child.WorkingDir
	}
	return out
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
	for _, set := range []bool{s.Debian != nil, s.Image != nil, s.Apt != nil, s.Run != nil, s.Git != nil, s.Copy != nil, s.Pip != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		doc.Errorf(fmt.Sprintf("layers[%d]", i), "must have exactly one of debian, image, apt, run, git, copy, pip; has %d", kinds)
		return
	}
	switch {
	case s.Image != nil:
		if i != 0 || e.From != "" {
			doc.Errorf(at("image"), "a base image must be the first layer")
		}
		if !imageRefRe.MatchString(s.Image.Ref) {
			doc.Errorf(at("image.ref"), "must pin a digest: registry/repository@sha256:<64 hex>, got %q", s.Image.Ref)
		}
	case s.Run != nil:
		if len(s.Run.Command) == 0 {
			doc.Errorf(at("run.command"), "must be a non-empty argument list")
		}
		if i == 0 && e.From == "" {
			doc.Errorf(at("run"), "a run step needs layers below it")
		}
		if s.Run.Cwd != "" && !filepath.IsAbs(s.Run.Cwd) {
			doc.Errorf(at("run.cwd"), "must be absolute, got %q", s.Run.Cwd)
		}
	case s.Debian != nil:
		if i != 0 || e.From != "" {
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
		if m := s.Debian.Mirror; m != "" && !strings.HasPrefix(m, "http://") && !strings.HasPrefix(m, "https://") {
			doc.Errorf(at("debian.mirror"), "must be an http(s) URL, got %q", m)
		}
	case s.Apt != nil:
		if e.From != "" || i == 0 || e.Layers[0].Debian == nil {
			doc.Errorf(at("apt"), "an apt step needs a debian base as the first layer of its file (use run for others)")
		}
		if len(s.Apt.Packages) == 0 {
			doc.Errorf(at("apt.packages"), "must list at least one package")
		}
		checkPackages(doc, at("apt.packages"), s.Apt.Packages)
	case s.Git != nil && s.Git.URL != "":
		checkDest(doc, at("git.dest"), s.Git.Dest, false)
		if !commitRe.MatchString(s.Git.Commit) {
			doc.Errorf(at("git.commit"), "must be a full 40-hex commit id, got %q", s.Git.Commit)
		}
		if s.Git.Source != "" {
			doc.Errorf(at("git.source"), "a git step takes url and commit, or source; not both")
		}
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
	case s.Pip != nil:
		e.checkPip(doc, i, s.Pip)
	}
}

func (e *Env) checkPip(doc *specfile.Doc, i int, p *Pip) {
	at := func(f string) string { return fmt.Sprintf("layers[%d].pip.%s", i, f) }
	if i == 0 && e.From == "" {
		doc.Errorf(fmt.Sprintf("layers[%d].pip", i), "a pip step needs layers below it (a Python with pip)")
	}
	checkDest(doc, at("venv"), p.Venv, false)
	if len(p.Requirements) == 0 {
		doc.Errorf(at("requirements"), "must list at least one requirement")
	}
	for j, r := range p.Requirements {
		if strings.TrimSpace(r) == "" || strings.ContainsAny(r, "\n\r#") || strings.HasPrefix(r, "-") {
			doc.Errorf(fmt.Sprintf("%s[%d]", at("requirements"), j), "must be one requirement specifier (no options or comments), got %q", r)
		}
	}
	switch {
	case p.Lock == "":
		doc.Errorf(at("lock"), "is required: a file name beside env.yaml (e.g. torch.lock)")
	case !filepath.IsLocal(p.Lock) || strings.ContainsRune(p.Lock, '/') || p.Lock == EnvFile:
		doc.Errorf(at("lock"), "must be a file name inside %s, got %q", e.Dir, p.Lock)
	default:
		if fi, err := os.Stat(filepath.Join(e.Dir, p.Lock)); err == nil && fi.IsDir() {
			doc.Errorf(at("lock"), "%s is a directory", p.Lock)
		}
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
func (s Step) Source(rel string) string { return filepath.Join(s.Dir, rel) }
