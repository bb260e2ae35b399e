// Package task owns the task spec: tasks/<project>/<id>/task.yaml and the agent-facing files
// beside it (instruction, PR description, gold patch, official tests). Load reads and checks a
// task against the infradev.task/v1 schema and reports every problem with file, line and field.
package task

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/specfile"
)

// Schema is the schema version this package reads.
const Schema = "infradev.task/v1"

// Task is a loaded, checked task spec.
type Task struct {
	Schema        string    `yaml:"schema"`
	ID            string    `yaml:"id"`
	Project       string    `yaml:"project"`
	Kind          string    `yaml:"kind"`
	Repo          Repo      `yaml:"repo"`
	Environment   string    `yaml:"environment"`
	Instruction   string    `yaml:"instruction"`
	PRDescription string    `yaml:"pr_description"`
	Gold          string    `yaml:"gold"`
	Tests         Tests     `yaml:"tests"`
	Resources     Resources `yaml:"resources"`
	Timeouts      Timeouts  `yaml:"timeouts"`
	Labels        []string  `yaml:"labels"`

	// Dir is the task's directory; file fields are relative to it.
	Dir string `yaml:"-"`
	// Derived holds the files an upstream task takes from its commits (gold patch, test patch,
	// PR description), set once they are materialised (package upstream); nil otherwise.
	Derived *Derived `yaml:"-"`
}

// Derived are the paths of an upstream task's derived files and their digest.
type Derived struct {
	Gold, Tests, PRDescription string
	// Digest covers the three files' contents: part of the task's input digest.
	Digest string
}

// Upstream reports whether the task references an upstream change: its gold patch, official
// test patch and PR description are derived from the commits, never checked in.
func (t *Task) Upstream() bool { return t.Repo.URL != "" && t.Repo.MergeCommit != "" }

// GoldFile is the gold patch's path: derived for upstream tasks, else the task's file.
func (t *Task) GoldFile() string { return t.pick(t.Gold, func(d *Derived) string { return d.Gold }) }

// TestPatchFile is the official test patch's path.
func (t *Task) TestPatchFile() string {
	return t.pick(t.Tests.Patch, func(d *Derived) string { return d.Tests })
}

// PRDescriptionFile is the PR description's path (the alternative prompt).
func (t *Task) PRDescriptionFile() string {
	return t.pick(t.PRDescription, func(d *Derived) string { return d.PRDescription })
}

// pick resolves a file field; for an upstream task whose files were not materialised it names
// a file that does not exist, so a read fails saying so.
func (t *Task) pick(field string, derived func(*Derived) string) string {
	if t.Upstream() {
		if t.Derived == nil {
			return filepath.Join(t.Dir, "(derived from "+t.Repo.MergeCommit+": not materialised)")
		}
		return derived(t.Derived)
	}
	return t.File(field)
}

// Repo is where the task's repository is and which commit the task starts from.
type Repo struct {
	// URL names the upstream repository (informational for environment-provided repos).
	URL string `yaml:"url"`
	// Path is the repository's absolute path inside the environment image.
	Path string `yaml:"path"`
	// BaseCommit is the full commit id the repository must be at before the patch.
	BaseCommit string `yaml:"base_commit"`
	// MergeCommit is the upstream commit that resolved the task, when there is one.
	MergeCommit string `yaml:"merge_commit"`
}

// Tests are the official tests: what the upstream change added, and which must pass.
type Tests struct {
	// Runner is the test framework; only "pytest" is supported.
	Runner string `yaml:"runner"`
	// Patch is the test patch, relative to the task directory.
	Patch string `yaml:"patch"`
	// FailToPass are test ids that fail before the change and must pass after it.
	FailToPass []string `yaml:"fail_to_pass"`
	// PassToPass are test ids that pass before and must still pass after.
	PassToPass []string `yaml:"pass_to_pass"`
	// Paths are the globs of test paths that split an upstream change into gold and official
	// tests ("**" matches directories); empty means the default rules (package upstream).
	Paths []string `yaml:"paths"`
	// Plugins are pytest plugins (module names) the official tests need; plugin autoload is
	// off, so each is loaded with -p.
	Plugins []string `yaml:"plugins"`
	// Ranks runs the official tests as that many processes on the machine, each with RANK,
	// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as `torchrun --standalone
	// --nproc_per_node` does (0 or 1: one process). A test passes only if it passed on every
	// rank. With GPUs, each rank uses one: ranks may not exceed resources.gpus.count.
	Ranks int `yaml:"ranks"`
}

// MaxRanks bounds tests.ranks.
const MaxRanks = 64

// IDs returns every official test id, fail-to-pass first.
func (t Tests) IDs() []string { return append(slices.Clone(t.FailToPass), t.PassToPass...) }

// Resources are what one attempt of the task needs.
type Resources struct {
	CPUs   float64 `yaml:"cpus"`
	Memory string  `yaml:"memory"`
	// Disk bounds what an attempt may write to its scratch layer (the repository). Default 4GiB.
	Disk string `yaml:"disk"`
	Pids int    `yaml:"pids"`
	GPUs GPUs   `yaml:"gpus"`

	MemoryBytes, DiskBytes int64 `yaml:"-"`
}

// GPUs is the GPU part of Resources.
type GPUs struct {
	// Count is the GPUs an attempt here needs (what the official tests kept for the task use).
	Count int `yaml:"count"`
	// Pool is the GPUs the upstream change's own tests use on a GPU pool (its CI's count),
	// recorded apart: a task whose official tests run on CPU may still be a multi-GPU change.
	Pool      int    `yaml:"pool"`
	MinMemory string `yaml:"min_memory"`
	Connected bool   `yaml:"connected"`

	MinMemoryBytes int64 `yaml:"-"`
}

// Timeouts bound each phase of an attempt.
type Timeouts struct {
	Apply  string `yaml:"apply"`
	Tests  string `yaml:"tests"`
	Probes string `yaml:"probes"`

	ApplyD, TestsD, ProbesD time.Duration `yaml:"-"`
}

// InstructionPlaceholder opens an instruction that has not been written yet (as task import
// leaves it): validation refuses such a task.
const InstructionPlaceholder = "TODO(instruction):"

// Defaults applied when a field is absent.
const (
	DefaultPids      = 512
	DefaultDiskBytes = 4 << 30
)

var (
	idRe     = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	commitRe = regexp.MustCompile(`^[0-9a-f]{40}$`)
	testIDRe = regexp.MustCompile(`^[^\s:][^\s]*\.py(::[^\s]+)+$`)
	pluginRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
)

// Load reads and checks the task in dir (which holds task.yaml). The error, if any, is a
// specfile.Errors naming every problem.
func Load(dir string) (*Task, error) {
	file := filepath.Join(dir, "task.yaml")
	t := &Task{}
	doc := specfile.ReadFile(file, t)
	if !doc.Parsed() {
		return nil, doc.Errs.Err()
	}
	t.Dir = dir
	t.check(doc)
	if err := doc.Errs.Err(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Task) check(d *specfile.Doc) {
	if t.Schema != Schema {
		d.Errorf("schema", "must be %q, got %q", Schema, t.Schema)
	}
	if !idRe.MatchString(t.ID) {
		d.Errorf("id", "must match %s, got %q", idRe, t.ID)
	}
	if !idRe.MatchString(t.Project) {
		d.Errorf("project", "must match %s, got %q", idRe, t.Project)
	}
	if strings.TrimSpace(t.Kind) == "" {
		d.Errorf("kind", "is required: the kind of upstream change the task models")
	}
	if !filepath.IsAbs(t.Repo.Path) || filepath.Clean(t.Repo.Path) != t.Repo.Path || t.Repo.Path == "/" {
		d.Errorf("repo.path", "must be a clean absolute path inside the image, got %q", t.Repo.Path)
	}
	if !commitRe.MatchString(t.Repo.BaseCommit) {
		d.Errorf("repo.base_commit", "must be a full 40-hex commit id, got %q", t.Repo.BaseCommit)
	}
	if t.Repo.MergeCommit != "" && !commitRe.MatchString(t.Repo.MergeCommit) {
		d.Errorf("repo.merge_commit", "must be a full 40-hex commit id, got %q", t.Repo.MergeCommit)
	}
	if !idRe.MatchString(t.Environment) {
		d.Errorf("environment", "must name an environment under environments/, got %q", t.Environment)
	}
	t.checkFile(d, "instruction", t.Instruction)
	if t.Repo.MergeCommit != "" && t.Repo.URL == "" {
		d.Errorf("repo.url", "is required with repo.merge_commit: the upstream repository the commits are in")
	}
	if t.Upstream() {
		// Nothing upstream is checked in: these are derived from the commits.
		for field, v := range map[string]string{"gold": t.Gold, "tests.patch": t.Tests.Patch, "pr_description": t.PRDescription} {
			if v != "" {
				d.Errorf(field, "must be left out: an upstream task derives it from repo.merge_commit")
			}
		}
	} else {
		t.checkFile(d, "pr_description", t.PRDescription)
		t.checkFile(d, "gold", t.Gold)
		t.checkFile(d, "tests.patch", t.Tests.Patch)
		if len(t.Tests.Paths) > 0 {
			d.Errorf("tests.paths", "applies to upstream tasks only (repo.url and repo.merge_commit)")
		}
	}
	for i, g := range t.Tests.Paths {
		if g == "" || strings.HasPrefix(g, "/") || strings.Contains(g, "..") {
			d.Errorf(fmt.Sprintf("tests.paths[%d]", i), "must be a relative glob, got %q", g)
		}
	}
	for i, p := range t.Tests.Plugins {
		if !pluginRe.MatchString(p) {
			d.Errorf(fmt.Sprintf("tests.plugins[%d]", i), "must be a module name, got %q", p)
		}
	}
	if t.Tests.Ranks < 0 || t.Tests.Ranks > MaxRanks {
		d.Errorf("tests.ranks", "must be between 1 and %d (absent: one process), got %d", MaxRanks, t.Tests.Ranks)
	} else if g := t.Resources.GPUs.Count; g > 0 && t.Tests.Ranks > g {
		d.Errorf("tests.ranks", "%d ranks need a GPU each, but resources.gpus.count is %d", t.Tests.Ranks, g)
	}
	if t.Tests.Runner != "pytest" {
		d.Errorf("tests.runner", "must be \"pytest\", got %q", t.Tests.Runner)
	}
	if len(t.Tests.FailToPass) == 0 {
		d.Errorf("tests.fail_to_pass", "must list at least one test id")
	}
	seen := map[string]bool{}
	for field, ids := range map[string][]string{"tests.fail_to_pass": t.Tests.FailToPass, "tests.pass_to_pass": t.Tests.PassToPass} {
		for i, id := range ids {
			path := fmt.Sprintf("%s[%d]", field, i)
			if !testIDRe.MatchString(id) || !filepath.IsLocal(strings.SplitN(id, "::", 2)[0]) {
				d.Errorf(path, "%q is not a pytest node id inside the repository (path/to/test_x.py::test_name)", id)
			}
			if seen[id] {
				d.Errorf(path, "%q is listed twice", id)
			}
			seen[id] = true
		}
	}
	t.checkResources(d)
	t.checkTimeouts(d)
}

func (t *Task) checkFile(d *specfile.Doc, field, rel string) {
	if rel == "" {
		d.Errorf(field, "is required")
		return
	}
	if !filepath.IsLocal(rel) {
		d.Errorf(field, "must be a path inside the task directory, got %q", rel)
		return
	}
	fi, err := os.Stat(filepath.Join(t.Dir, rel))
	switch {
	case err != nil:
		d.Errorf(field, "file %s: %v", rel, errorsText(err))
	case !fi.Mode().IsRegular():
		d.Errorf(field, "%s is not a regular file", rel)
	}
}

func errorsText(err error) string {
	if os.IsNotExist(err) {
		return "does not exist"
	}
	return err.Error()
}

func (t *Task) checkResources(d *specfile.Doc) {
	r := &t.Resources
	if r.CPUs <= 0 {
		d.Errorf("resources.cpus", "must be > 0, got %v", r.CPUs)
	}
	if r.Memory == "" {
		d.Errorf("resources.memory", "is required (e.g. 2GiB)")
	} else if n, err := specfile.ParseSize(r.Memory); err != nil {
		d.Errorf("resources.memory", "%v", err)
	} else if n < 16<<20 {
		d.Errorf("resources.memory", "must be at least 16MiB, got %s", r.Memory)
	} else {
		r.MemoryBytes = n
	}
	r.DiskBytes = DefaultDiskBytes
	if r.Disk != "" {
		if n, err := specfile.ParseSize(r.Disk); err != nil {
			d.Errorf("resources.disk", "%v", err)
		} else {
			r.DiskBytes = n
		}
	}
	if r.Pids == 0 {
		r.Pids = DefaultPids
	} else if r.Pids < 8 {
		d.Errorf("resources.pids", "must be at least 8, got %d", r.Pids)
	}
	if r.GPUs.Count < 0 {
		d.Errorf("resources.gpus.count", "must be >= 0, got %d", r.GPUs.Count)
	}
	if r.GPUs.Pool < 0 || (r.GPUs.Pool > 0 && r.GPUs.Pool < r.GPUs.Count) {
		d.Errorf("resources.gpus.pool", "must be >= 0 and at least count, got %d", r.GPUs.Pool)
	}
	if r.GPUs.MinMemory != "" {
		if n, err := specfile.ParseSize(r.GPUs.MinMemory); err != nil {
			d.Errorf("resources.gpus.min_memory", "%v", err)
		} else {
			r.GPUs.MinMemoryBytes = n
		}
	}
}

func (t *Task) checkTimeouts(d *specfile.Doc) {
	for _, f := range []struct {
		name string
		s    string
		dst  *time.Duration
	}{
		{"timeouts.apply", t.Timeouts.Apply, &t.Timeouts.ApplyD},
		{"timeouts.tests", t.Timeouts.Tests, &t.Timeouts.TestsD},
		{"timeouts.probes", t.Timeouts.Probes, &t.Timeouts.ProbesD},
	} {
		if f.s == "" {
			d.Errorf(f.name, "is required (e.g. 5m)")
			continue
		}
		v, err := specfile.ParseDuration(f.s)
		if err != nil {
			d.Errorf(f.name, "%v", err)
			continue
		}
		*f.dst = v
	}
}

// File returns the absolute path of a task-relative file.
func (t *Task) File(rel string) string { return filepath.Join(t.Dir, rel) }

// Find lists the task directories under root (root/<project>/<id>/task.yaml), by task id as
// written in each directory's name. Two directories with one id are an error.
func Find(root string) (map[string]string, error) {
	matches, err := filepath.Glob(filepath.Join(root, "*", "*", "task.yaml"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, m := range matches {
		dir := filepath.Dir(m)
		id := filepath.Base(dir)
		if prev, ok := out[id]; ok {
			return nil, fmt.Errorf("task id %s is in both %s and %s", id, prev, dir)
		}
		out[id] = dir
	}
	return out, nil
}

// ProbesDir is where the probes of the task in taskDir live: probesRoot/<project>/<id>,
// mirroring tasks/<project>/<id>.
func ProbesDir(probesRoot, taskDir string) string {
	return filepath.Join(probesRoot, filepath.Base(filepath.Dir(taskDir)), filepath.Base(taskDir))
}
