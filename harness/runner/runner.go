// Package runner owns one task attempt: it mounts the task's environment image, applies the
// submission all-or-nothing inside the sandbox, puts the official tests in place from the
// harness's own copy, runs them, then runs the probes mounted read-only, and grades the
// phases into a result.json in the run folder. Everything enters as a file; nothing is taken
// from the host that could change a verdict.
package runner

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/bluekeyes/go-gitdiff/gitdiff"
	"golang.org/x/sys/unix"

	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/grade"
	"github.com/infradev/infradev/harness/lease"
	"github.com/infradev/infradev/harness/logcap"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/tamper"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/unpack"
)

// Inputs are everything an attempt depends on.
type Inputs struct {
	Task   *task.Task
	Probes *probe.Set
	// Layout is the OCI image layout holding the environment; Image its manifest digest.
	Layout string
	Image  string
	// Patch is the submission, a unified diff; empty means no change.
	Patch      []byte
	InstanceID string
	Model      string
	// MeasureBudgets records budgeted probes' figures without judging them: how gold's
	// baseline is measured.
	MeasureBudgets bool
	// GPUs are the device indices leased to this attempt (CUDA_VISIBLE_DEVICES inside).
	GPUs []int
	// PromptVariant names the prompt the submission was made from (recorded only).
	PromptVariant string
}

// Runner runs attempts. Hand-wire it in main; tests may give it another Sandbox.
type Runner struct {
	Sandbox sandbox.Sandbox
	Cache   unpack.Cache
	// Scratch holds per-attempt overlay layers and staging files. It must not be on overlayfs.
	Scratch string
	// Harness is the harness version recorded in results and cache keys.
	Harness string
	// Hardware is the hardware class recorded in results and cache keys. Default "cpu".
	Hardware string
	// LogHead and LogTail bound each phase's log. Default 1MiB each.
	LogHead, LogTail int
	// MaxPatchBytes refuses larger submissions before anything runs. Default 16MiB.
	MaxPatchBytes int
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// GPUs passes leased GPUs into the sandbox; nil sets only the visibility variables.
	GPUs gpu.Nodes
	// NVML, when set, meters the leased GPUs' memory per phase and watches them for Xid faults.
	NVML nvml.Interface
	// Leases, when set, leases the task's GPUs across processes (file locks) for each
	// attempt, overriding Inputs.GPUs: concurrent runners never share a GPU.
	Leases *Leases
}

// Paths inside the sandbox.
const (
	inDir       = "/run/infradev/in"
	outDir      = "/run/infradev/out"
	probesMount = "/run/infradev/probes"
)

// Run runs one attempt and writes result.json, junit files and logs under out. Faults of the
// sandbox or harness are recorded as infra_error in the result; the error return is kept for
// failures to write the run folder itself.
func (r *Runner) Run(ctx context.Context, in Inputs, out string) (*result.Result, error) {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	for _, d := range []string{out, filepath.Join(out, "logs"), filepath.Join(out, "raw")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("run folder: %w", err)
		}
	}
	res := &result.Result{Schema: result.Schema, InstanceID: in.InstanceID, Model: in.Model, StartedAt: now().UTC()}
	if res.InstanceID == "" {
		res.InstanceID = in.Task.ID
	}
	res.EmptyPatch = len(strings.TrimSpace(string(in.Patch))) == 0
	res.Project, res.PromptVariant = in.Task.Project, in.PromptVariant
	res.FailToPass = len(in.Task.Tests.FailToPass)
	inputs, err := r.Digests(in)
	if err != nil {
		return nil, err
	}
	res.Inputs = inputs
	if err := os.WriteFile(filepath.Join(out, "submission.patch"), in.Patch, 0o644); err != nil {
		return nil, fmt.Errorf("run folder: %w", err)
	}
	if err := r.attempt(ctx, in, out, res); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		res.Phases = append(res.Phases, result.Phase{Name: "infra", Status: result.StatusError, Detail: err.Error()})
	}
	grade.Verdict(res)
	res.FinishedAt = now().UTC()
	if err := result.Write(filepath.Join(out, "result.json"), res); err != nil {
		return nil, err
	}
	return res, nil
}

// Sweep unmounts and removes the scratch of attempts whose process died (a killed evaluation
// leaves its overlays mounted), and returns how many it removed.
func (r *Runner) Sweep() int {
	dirs, _ := filepath.Glob(filepath.Join(r.Scratch, "attempt-*"))
	n := 0
	for _, d := range dirs {
		if sandbox.OwnerAlive(d) {
			continue
		}
		_ = unix.Unmount(filepath.Join(d, "root", "merged"), unix.MNT_DETACH)
		_ = unix.Unmount(filepath.Join(d, "root"), unix.MNT_DETACH)
		if os.RemoveAll(d) == nil {
			n++
		}
	}
	if rc, ok := r.Sandbox.(*sandbox.Runc); ok {
		n += rc.Sweep()
	}
	return n
}

func (r *Runner) maxPatch() int {
	if r.MaxPatchBytes == 0 {
		return 16 << 20
	}
	return r.MaxPatchBytes
}

func (r *Runner) hardware() string {
	if r.Hardware == "" {
		return "cpu"
	}
	return r.Hardware
}

// Digests computes the content digests that identify an attempt's inputs: the key under
// which its result may be reused.
func (r *Runner) Digests(in Inputs) (result.Inputs, error) {
	td, err := digest.Files(in.Task.Dir, notAnInput)
	if err != nil {
		return result.Inputs{}, err
	}
	pd, err := digest.Files(in.Probes.Dir, notAnInput)
	if err != nil {
		return result.Inputs{}, err
	}
	return result.Inputs{Task: td, Environment: in.Image, Probes: pd, Patch: digest.Bytes(in.Patch), Harness: r.Harness, Hardware: r.hardware()}, nil
}

// notAnInput tells the files in task and probe directories that no attempt reads: Bazel's BUILD
// files, the samples that check the task itself, Python's byte-code caches. Leaving them out of
// the digests keys a result the same whether the task comes from a checkout or from Bazel's
// runfiles (which hold only the declared inputs), so eval and bazel test share results.
func notAnInput(rel string) bool {
	base := path.Base(rel)
	return base == "BUILD.bazel" || base == "BUILD" || base == "__pycache__" || rel == "samples.yaml" || rel == "samples"
}

// Leases is where GPU leases are taken: a runtime directory of lock files and the machine.
// GPUs that reported a fault (an Xid) are set aside for the rest of the process, so a retry
// runs on other GPUs.
type Leases struct {
	Dir     string
	Machine *gpu.Machine

	mu     sync.Mutex
	faulty []int
}

func (l *Leases) setAside(indices ...int) {
	l.mu.Lock()
	l.faulty = append(l.faulty, indices...)
	l.mu.Unlock()
}

func (l *Leases) excluded() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int{}, l.faulty...)
}

// attempt runs the phases, appending each graded phase to res. A returned error is an
// infrastructure fault.
func (r *Runner) attempt(ctx context.Context, in Inputs, out string, res *result.Result) error {
	t := in.Task
	if n := t.Resources.GPUs.Count; n > 0 && r.Leases != nil {
		l, err := lease.Acquire(ctx, r.Leases.Dir, r.Leases.Machine, lease.Request{Count: n,
			MinMemory: uint64(t.Resources.GPUs.MinMemoryBytes), Connected: t.Resources.GPUs.Connected,
			Exclude: r.Leases.excluded()})
		if err != nil {
			return fmt.Errorf("leasing %d GPUs: %w", n, err)
		}
		defer l.Release()
		in.GPUs = l.Indices
	}
	if err := os.MkdirAll(r.Scratch, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp(r.Scratch, "attempt-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := sandbox.WriteOwner(work); err != nil {
		return err
	}

	// Phase 0: static checks of the submission itself; nothing runs for a refused patch.
	if max := r.maxPatch(); len(in.Patch) > max {
		res.Phases = append(res.Phases, result.Phase{Name: "apply", Status: result.StatusFailed,
			Detail: fmt.Sprintf("the patch is %d bytes, over the %d-byte limit", len(in.Patch), max)})
		return nil
	}
	findings, err := tamper.Scan(in.Patch)
	if err != nil {
		res.Phases = append(res.Phases, result.Phase{Name: "apply", Status: result.StatusFailed,
			Detail: "the patch is not a valid unified diff: " + err.Error()})
		return nil
	}
	res.Phases = append(res.Phases, grade.Integrity(findings))
	if len(findings) > 0 {
		return nil
	}

	stack, cfg, err := r.Cache.Stack(ctx, in.Layout, in.Image)
	if err != nil {
		return fmt.Errorf("environment: %w", err)
	}
	staging := filepath.Join(work, "in")
	if err := r.stage(in, staging); err != nil {
		return err
	}
	// The probes are mounted from a copy of exactly what their digest covers: the given
	// directory may reach its files through links the sandbox cannot follow (Bazel runfiles),
	// and the copy cannot change mid-attempt.
	probes := filepath.Join(work, "probes")
	if err := copyFiles(in.Probes.Dir, probes, notAnInput); err != nil {
		return fmt.Errorf("staging probes: %w", err)
	}
	ov, err := sandbox.MountOverlay(stack, filepath.Join(work, "root"), t.Resources.DiskBytes)
	if err != nil {
		return err
	}
	defer ov.Unmount()

	env := append(append([]string{}, cfg.Config.Env...), "PYTHONPATH="+inDir,
		// PYTHONSAFEPATH: the working directory (the repository) is not put first on sys.path,
		// so a repository cannot shadow the test runner's own modules.
		"HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1", "PYTHONHASHSEED=0", "PYTHONSAFEPATH=1",
		"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "LC_ALL=C.UTF-8")
	var devices []sandbox.Device
	var gpuMounts []sandbox.Mount
	if len(in.GPUs) > 0 {
		if r.GPUs == nil {
			env = append(env, gpu.Visibility(in.GPUs)...)
		} else {
			p, err := r.GPUs.Passthrough(in.GPUs)
			if err != nil {
				return fmt.Errorf("GPU pass-through: %w", err)
			}
			env = append(env, p.Env...)
			devices, gpuMounts = p.Devices, p.Mounts
		}
	}
	limits := sandbox.Limits{MemoryBytes: t.Resources.MemoryBytes, Pids: int64(t.Resources.Pids), CPUs: t.Resources.CPUs}
	base := sandbox.Spec{
		Root:     ov.Merged,
		Writable: []string{t.Repo.Path},
		Env:      env,
		Cwd:      t.Repo.Path,
		Limits:   limits,
		Devices:  devices,
		Mounts:   gpuMounts,
	}

	// Phase 1: the submission, then the official tests from the harness's copy.
	raw, err := r.phase(ctx, out, "apply", base, staging, "", []string{"/bin/sh", inDir + "/apply.sh"}, t.Timeouts.ApplyD, nil)
	if err != nil {
		return err
	}
	ap := grade.Apply(raw)
	res.Phases = append(res.Phases, ap)
	if ap.Status != result.StatusPassed {
		return nil
	}

	// Phase 2: official tests, graded from the JUnit report.
	tests := pytest(t.Tests.IDs(), "")
	raw, err = r.phase(ctx, out, "tests", base, staging, "", tests, t.Timeouts.TestsD, in.GPUs)
	if err != nil {
		return err
	}
	res.Phases = append(res.Phases, grade.Tests("tests", raw, grade.Expected{IDs: t.Tests.IDs()}))

	// Phase 3: probes, mounted read-only apart from the repository. Budgeted probes run one
	// by one, so each one's figures are its own.
	probesPhase, err := r.probes(ctx, in, out, base, staging, probes)
	if err != nil {
		return err
	}
	res.Phases = append(res.Phases, probesPhase)
	return nil
}

func (r *Runner) probes(ctx context.Context, in Inputs, out string, base sandbox.Spec, staging, probesDir string) (result.Phase, error) {
	t := in.Task
	var plain []string
	infos := map[string]grade.ProbeInfo{}
	for _, p := range in.Probes.Probes {
		infos[p.Test] = grade.ProbeInfo{ID: p.ID, Category: p.Category}
		if p.Budget == nil {
			plain = append(plain, p.Test)
		}
	}
	phase := result.Phase{Name: "probes", Status: result.StatusPassed}
	if len(plain) > 0 {
		raw, err := r.phase(ctx, out, "probes", base, staging, probesDir, pytest(plain, probesMount), t.Timeouts.ProbesD, in.GPUs)
		if err != nil {
			return phase, err
		}
		phase = grade.Tests("probes", raw, grade.Expected{IDs: plain, Probes: infos})
	}
	for _, p := range in.Probes.Budgeted() {
		raw, err := r.phase(ctx, out, "probe-"+p.ID, base, staging, probesDir, pytest([]string{p.Test}, probesMount), t.Timeouts.ProbesD, in.GPUs)
		if err != nil {
			return phase, err
		}
		one := grade.Tests("probes", raw, grade.Expected{IDs: []string{p.Test}, Probes: infos})
		var fig *probe.Figures
		if b := in.Probes.Baseline; b != nil {
			if f, ok := b.Probes[p.ID]; ok {
				fig = &f
			}
		}
		grade.Budget(&one.Tests[0], raw.Run, *p.Budget, fig, in.MeasureBudgets)
		grade.Merge(&phase, one)
	}
	return phase, nil
}

// pytest is the harness-owned test command: no cache, no plugin autoload (set in the
// environment), the harness's report plugin, JUnit into the report pipe, exactly the expected
// ids. With root set, ids are relative to it.
func pytest(ids []string, root string) []string {
	// -s: output streams to the capped log instead of piling up in pytest's capture files.
	args := []string{"python3", "-m", "pytest", "-p", "no:cacheprovider", "-p", reportPluginName,
		"-o", "junit_family=xunit1", "--junitxml=/dev/fd/4", "-q", "-rN", "-s"}
	if root != "" {
		// Probes run under the harness's own configuration (probes.ini), never the repository's;
		// it puts the repository on sys.path once pytest has started, never before.
		args = append(args, "-c", inDir+"/probes.ini", "--rootdir="+root, "--confcutdir="+root)
		for _, id := range ids {
			args = append(args, path.Join(root, id))
		}
		return args
	}
	return append(args, ids...)
}

// phase runs one sandboxed command with the staging folder mounted read-only and a fresh,
// empty output folder, and collects its JUnit report and capped log.
func (r *Runner) phase(ctx context.Context, out, name string, spec sandbox.Spec, staging, probes string, args []string, timeout time.Duration, gpus []int) (grade.Raw, error) {
	outHost := filepath.Join(filepath.Dir(staging), "out-"+name)
	if err := os.Mkdir(outHost, 0o777); err != nil {
		return grade.Raw{}, err
	}
	head, tail := r.LogHead, r.LogTail
	if head == 0 {
		head = 1 << 20
	}
	if tail == 0 {
		tail = 1 << 20
	}
	logRel := filepath.Join("logs", name+".log")
	log, err := logcap.Create(filepath.Join(out, logRel), head, tail)
	if err != nil {
		return grade.Raw{}, err
	}
	spec.Args = args
	spec.Timeout = timeout
	spec.Stdout, spec.Stderr = log, log
	var ch *reportChannel
	if name != "apply" {
		if ch, err = openReportChannel(); err != nil {
			log.Close()
			return grade.Raw{}, err
		}
		defer ch.close()
		spec.ExtraFiles = ch.files()
	}
	spec.Mounts = append(append([]sandbox.Mount{}, spec.Mounts...),
		sandbox.Mount{Source: staging, Dest: inDir, ReadOnly: true},
		sandbox.Mount{Source: outHost, Dest: outDir})
	if probes != "" {
		spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: probes, Dest: probesMount, ReadOnly: true})
	}
	var sampler *gpu.Sampler
	var watch *gpu.Watch
	if r.NVML != nil && len(gpus) > 0 {
		sampler = gpu.Sample(r.NVML, gpus, 0)
		if watch, err = gpu.WatchXids(r.NVML, gpus); err != nil {
			sampler.Stop()
			log.Close()
			return grade.Raw{}, err
		}
	}
	run, err := r.Sandbox.Run(ctx, spec)
	if cerr := log.Close(); err == nil && cerr != nil {
		err = cerr
	}
	var gpuPeak uint64
	if sampler != nil {
		gpuPeak = sampler.Stop()
		if xids := watch.Stop(); len(xids) > 0 && err == nil {
			if r.Leases != nil {
				for _, x := range xids {
					r.Leases.setAside(x.Index)
				}
			}
			err = fmt.Errorf("GPU fault during the run: Xid %d on GPU %d", xids[0].Code, xids[0].Index)
		}
	}
	if err != nil {
		return grade.Raw{}, fmt.Errorf("%s phase: %w", name, err)
	}
	raw := grade.Raw{Run: run, Log: logRel, GPUPeakMemory: gpuPeak}
	if ch == nil {
		return raw, nil
	}
	data, err := ch.report()
	if err != nil {
		raw.ReportProblem = err.Error()
		return raw, nil
	}
	raw.JUnit = data
	if err := os.WriteFile(filepath.Join(out, "raw", name+".xml"), data, 0o644); err != nil {
		return grade.Raw{}, err
	}
	return raw, nil
}

// stage writes the read-only inputs of the sandbox: the submission, the official test patch
// and the setup script.
func (r *Runner) stage(in Inputs, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tp, err := os.ReadFile(in.Task.File(in.Task.Tests.Patch))
	if err != nil {
		return fmt.Errorf("task %s: %w", in.Task.ID, err)
	}
	paths, err := patchPaths(tp)
	if err != nil {
		return fmt.Errorf("task %s: test patch: %w", in.Task.ID, err)
	}
	paths = officialPaths(paths, in.Task.Tests.IDs())
	files := map[string][]byte{
		"submission.patch":       in.Patch,
		"tests.patch":            tp,
		"apply.sh":               []byte(applyScript(in.Task.Repo.BaseCommit, paths)),
		reportPluginName + ".py": reportPlugin,
		"probes.ini":             []byte("[pytest]\npythonpath = " + in.Task.Repo.Path + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// officialPaths adds the files holding the official tests to the test patch's paths: every one
// of them is put back as the harness has it, whatever the submission did to it.
func officialPaths(patchPaths, ids []string) []string {
	set := map[string]bool{}
	for _, p := range patchPaths {
		set[p] = true
	}
	for _, id := range ids {
		set[strings.SplitN(id, "::", 2)[0]] = true
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// patchPaths lists every path a patch touches (old and new names), sorted.
func patchPaths(p []byte) ([]string, error) {
	files, _, err := gitdiff.Parse(strings.NewReader(string(p)))
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, f := range files {
		for _, n := range []string{f.OldName, f.NewName} {
			if n == "" {
				continue
			}
			if !filepath.IsLocal(n) {
				return nil, fmt.Errorf("path %q is outside the repository", n)
			}
			set[n] = true
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// runnerConfig are files that configure the test runner or the interpreter from inside the
// repository. A submission's versions are set back to base (or removed): they could load
// plugins or hooks that rewrite outcomes. The official test patch may still ship its own.
var runnerConfig = []string{"conftest.py", "sitecustomize.py", "usercustomize.py",
	"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}

// applyScript checks the repository is at base, applies the submission all-or-nothing, sets
// runner configuration back to base, then resets every official test file and every path of
// the official test patch to base (or removes it) and applies that patch.
func applyScript(base string, testPaths []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `set -u
export GIT_CEILING_DIRECTORIES=/ GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
head=$(git rev-parse HEAD) || exit %[2]d
[ "$head" = %[1]s ] || { echo "repository is at $head, not at the base commit %[1]s"; exit %[2]d; }
git reset -q || exit %[2]d
if [ -s %[3]s/submission.patch ]; then
  git apply --check --verbose %[3]s/submission.patch || exit %[4]d
  git apply %[3]s/submission.patch || exit %[4]d
fi
`, base, grade.ExitNotAtBase, inDir, grade.ExitPatchDoesNotApply)
	var names []string
	for _, n := range runnerConfig {
		names = append(names, "-name "+shellQuote(n))
	}
	fmt.Fprintf(&b, `find . -path ./.git -prune -o ! -type d \( %[1]s \) -print | while IFS= read -r f; do
  f=${f#./}
  if git cat-file -e %[2]s:"$f" 2>/dev/null; then git checkout -q %[2]s -- "$f"; else rm -f -- "$f"; fi || exit %[3]d
done || exit %[3]d
git ls-tree -r --name-only %[2]s | { grep -E '(^|/)(%[4]s)$' || true; } | while IFS= read -r f; do
  git checkout -q %[2]s -- "$f" || exit %[3]d
done || exit %[3]d
`, strings.Join(names, " -o "), base, grade.ExitTestsDoNotApply, strings.ReplaceAll(strings.Join(runnerConfig, "|"), ".", `\.`))
	for _, p := range testPaths {
		q := shellQuote(p)
		fmt.Fprintf(&b, "rm -rf -- %s\nif git cat-file -e %s:%s 2>/dev/null; then git checkout -q %s -- %s || exit %d; fi\n",
			q, base, q, base, q, grade.ExitTestsDoNotApply)
	}
	fmt.Fprintf(&b, "git apply %s/tests.patch || exit %d\n", inDir, grade.ExitTestsDoNotApply)
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// copyFiles copies the tree at src to dst, reading links to files as the files they point to
// and leaving out what skip names: exactly what digest.Files hashes.
func copyFiles(src, dst string, skip func(rel string) bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel != "." && skip(filepath.ToSlash(rel)) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a file", p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, fi.Mode().Perm())
	})
}
