// Package runner owns one task attempt: it mounts the task's environment image, applies the
// submission all-or-nothing inside the sandbox, puts the official tests in place from the
// harness's own copy, runs them, then runs the probes mounted read-only, and grades the
// phases into a result.json in the run folder. Everything enters as a file; nothing is taken
// from the host that could change a verdict.
package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/attempt"
	"github.com/infradev/infradev/harness/canary"
	"github.com/infradev/infradev/harness/cheat"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/grade"
	"github.com/infradev/infradev/harness/logcap"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/pytestproto"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/tamper"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/unpack"
)

// Inputs are everything an attempt depends on (package attempt).
type Inputs = attempt.Inputs

// ProbeMode is how validation runs an attempt's probes (package attempt).
type ProbeMode = attempt.ProbeMode

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
	// TaskChecks is where the outcome of each task's own check (CheckTask) is kept across
	// processes; empty keeps it in memory only.
	TaskChecks string

	checks sync.Map // task check key -> fault string
}

// Paths inside the sandbox.
const (
	inDir       = pytestproto.InDir
	outDir      = pytestproto.OutDir
	probesMount = pytestproto.ProbesMount
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
	res.Project, res.PromptVariant, res.Attempt = in.Task.Project, in.PromptVariant, in.Attempt
	res.FailToPass = len(in.Task.Tests.FailToPass)
	inputs, err := r.Digests(in)
	if err != nil {
		return nil, err
	}
	res.Inputs = inputs
	// A patch over the limit is refused unread: its run folder keeps its size and digest only.
	kept, name := in.Patch, "submission.patch"
	if len(in.Patch) > r.maxPatch() {
		kept, name = []byte(fmt.Sprintf("refused: %d bytes, %s\n", len(in.Patch), inputs.Patch)), "submission.refused"
	}
	if err := os.WriteFile(filepath.Join(out, name), kept, 0o644); err != nil {
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
	td, err := taskDigest(in.Task)
	if err != nil {
		return result.Inputs{}, err
	}
	pd, err := digest.Files(in.Probes.Dir, notAnInput)
	if err != nil {
		return result.Inputs{}, err
	}
	patch := digest.Bytes(in.Patch)
	if in.Validation() {
		// A validation run (an added cheat, every phase run, probes recorded or forged) is
		// never the submission's own result: it is keyed apart.
		mode := in.Probe
		if mode.Recorded != "" {
			d, err := digest.Files(mode.Recorded, nil)
			if err != nil {
				return result.Inputs{}, fmt.Errorf("the recording to forge from: %w", err)
			}
			mode.Recorded = d
		}
		patch = digest.Bytes([]byte(fmt.Sprintf("%s\x00cheat=%s\x00all-phases=%t\x00probe=%+v", patch, in.Cheat, in.AllPhases, mode)))
	}
	return result.Inputs{Task: td, Environment: in.Image, Probes: pd, Patch: patch, Harness: r.Harness, Hardware: r.hardware()}, nil
}

// taskDigest is the digest of everything of a task an attempt reads: its directory and, for
// an upstream task, the files derived from its commits.
func taskDigest(t *task.Task) (string, error) {
	td, err := digest.Files(t.Dir, notAnInput)
	if err != nil {
		return "", err
	}
	if t.Upstream() {
		if t.Derived == nil {
			return "", fmt.Errorf("task %s: its upstream files are not materialised", t.ID)
		}
		td = digest.Bytes([]byte(td + "\n" + t.Derived.Digest))
	}
	return td, nil
}

// notAnInput tells the files in task and probe directories that no attempt reads: Bazel's BUILD
// files, the samples that check the task itself and its validation record, Python's byte-code
// caches. Leaving them out of
// the digests keys a result the same whether the task comes from a checkout or from Bazel's
// runfiles (which hold only the declared inputs), so eval and bazel test share results.
func notAnInput(rel string) bool {
	base := path.Base(rel)
	return base == "BUILD.bazel" || base == "BUILD" || base == "__pycache__" || rel == "samples.yaml" || rel == "samples" ||
		rel == "validation.json"
}

// attempt runs the phases, appending each graded phase to res. A returned error is an
// infrastructure fault.
func (r *Runner) attempt(ctx context.Context, in Inputs, out string, res *result.Result) error {
	t := in.Task
	// Phase 0: a patch over the size limit is refused before anything runs.
	if max := r.maxPatch(); len(in.Patch) > max {
		res.Phases = append(res.Phases, result.Phase{Name: "apply", Status: result.StatusFailed,
			Detail: fmt.Sprintf("the patch is %d bytes, over the %d-byte limit", len(in.Patch), max)})
		return nil
	}
	// The task's own check, decided without the submission and done once per task.
	fault, err := r.CheckTask(ctx, in)
	if err != nil {
		return err
	}
	if fault != "" {
		res.Phases = append(res.Phases, grade.TaskFault(fault))
		return nil
	}
	a, err := r.open(ctx, in)
	if err != nil {
		return err
	}
	defer a.close()

	// Phase 1: the submission applied, the harness's files put back over it, canaries planted.
	canaries, err := canary.New(nil, officialFiles(t), false)
	if err != nil {
		return fmt.Errorf("task %s: %w", t.ID, err)
	}
	var ch *cheat.Cheat
	if in.Cheat != "" {
		c, err := cheat.Get(in.Cheat)
		if err != nil {
			return err
		}
		ch = &c
	}
	ap, findings, err := a.apply(ctx, out, in.Patch, canaries, ch)
	if err != nil {
		return err
	}
	res.Phases = append(res.Phases, ap)
	if ap.Status != result.StatusPassed {
		return nil
	}
	if err := a.mountReference(); err != nil {
		return err
	}
	// Phase 2: the static scan of what the patch left on disk.
	integrity := grade.Integrity(findings)
	res.Phases = append(res.Phases, integrity)
	if integrity.Status != result.StatusPassed && !in.AllPhases {
		return nil
	}

	// Phase 3: the official tests with the canaries among them, graded from the sealed report.
	if in.Probe.Only {
		probesPhase, err := a.runProbes(ctx, out, in)
		if err != nil {
			return err
		}
		res.Phases = append(res.Phases, probesPhase)
		return nil
	}
	ids := interleave(t.Tests.IDs(), canaries.IDs())
	raw, err := a.tests(ctx, out, "tests", ids)
	if err != nil {
		return err
	}
	res.Phases = append(res.Phases, grade.Tests("tests", raw, grade.Expected{IDs: t.Tests.IDs(),
		Canaries: canaries.Want, CanaryStyles: canaries.Style, Sealed: true}))
	// The canaries' expected outcomes leave the harness only now, with the raw report, so the
	// tests phase can be graded again from the run folder.
	if err := atomicfile.WriteJSON(filepath.Join(out, "raw", "canaries.json"), canaries); err != nil {
		return err
	}

	// Phase 4: probes, judged out of process. Budgeted probes run one by one, so each one's
	// figures are its own.
	probesPhase, err := a.runProbes(ctx, out, in)
	if err != nil {
		return err
	}
	res.Phases = append(res.Phases, probesPhase)
	return nil
}

// officialFiles are the files holding the official tests, sorted.
func officialFiles(t *task.Task) []string {
	set := map[string]bool{}
	for _, id := range t.Tests.IDs() {
		set[strings.SplitN(id, "::", 2)[0]] = true
	}
	out := make([]string, 0, len(set))
	for f := range set {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// interleave puts each extra id at a random place among ids, keeping ids' own order.
func interleave(ids, extra []string) []string {
	out := append([]string{}, ids...)
	for _, e := range extra {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(out)+1)))
		i := 0
		if err == nil {
			i = int(n.Int64())
		}
		out = append(out[:i], append([]string{e}, out[i:]...)...)
	}
	return out
}

// attemptEnv is one attempt's sandbox: the overlay over the environment's layers, the probes'
// copy, the base spec every phase starts from, and the scratch folder.
type attemptEnv struct {
	r        *Runner
	in       Inputs
	work     string
	probeDir string
	ov       *sandbox.Overlay
	// ref is the gold tree (read-only, over the same layers) the probes' reference children
	// read; nil until mountReference.
	ref  *sandbox.Overlay
	base sandbox.Spec
	// files are the official test files: what the setup puts back and canaries go into.
	files []string
	// stack is the environment's layers, bottom first.
	stack []string
	// childPath is the probes' children's PYTHONPATH over the submission.
	childPath string
}

// open prepares an attempt's sandbox: scratch, overlay, probes copy, environment, GPUs.
func (r *Runner) open(ctx context.Context, in Inputs) (*attemptEnv, error) {
	t := in.Task
	if err := os.MkdirAll(r.Scratch, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(r.Scratch, "attempt-")
	if err != nil {
		return nil, err
	}
	a := &attemptEnv{r: r, in: in, work: work, files: officialFiles(t)}
	ok := false
	defer func() {
		if !ok {
			a.close()
		}
	}()
	if err := sandbox.WriteOwner(work); err != nil {
		return nil, err
	}
	stack, cfg, err := r.Cache.Stack(ctx, in.Layout, in.Image)
	if err != nil {
		return nil, fmt.Errorf("environment: %w", err)
	}
	a.stack = stack
	// The probes are mounted from a copy of exactly what their digest covers (the given
	// directory may reach its files through links the sandbox cannot follow, as Bazel's
	// runfiles do, and the copy cannot change mid-attempt), readable by root only: the code
	// under test runs as another user in the probe phases.
	if in.Probes != nil {
		a.probeDir = filepath.Join(work, "probes")
		if err := copyFiles(in.Probes.Dir, a.probeDir, notAnInput); err != nil {
			return nil, fmt.Errorf("staging probes: %w", err)
		}
		if err := os.Chmod(a.probeDir, 0o700); err != nil {
			return nil, err
		}
	}
	if a.ov, err = sandbox.MountOverlay(stack, filepath.Join(work, "root"), t.Resources.DiskBytes); err != nil {
		return nil, err
	}
	// The image's own PYTHONPATH (a framework's repository path) stays, after the harness's
	// inputs; the probes' children get it too, the judge never.
	imagePath := ""
	for _, kv := range cfg.Config.Env {
		if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
			imagePath = v
		}
	}
	childPath := imagePath
	if childPath == "" {
		childPath = t.Repo.Path
	}
	harnessPath := inDir
	if imagePath != "" {
		harnessPath += ":" + imagePath
	}
	a.childPath = childPath
	env := sandbox.MergeEnv(cfg.Config.Env, "PYTHONPATH="+harnessPath, "INFRADEV_CHILD_PYTHONPATH="+childPath,
		// PYTHONSAFEPATH: the working directory (the repository) is not put first on sys.path,
		// so a repository cannot shadow the test runner's own modules.
		"HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1", "PYTHONHASHSEED=0", "PYTHONSAFEPATH=1",
		"PYTHONNOUSERSITE=1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", "LC_ALL=C.UTF-8", "INFRADEV_REPO="+t.Repo.Path)
	a.base = sandbox.Spec{
		Root:     a.ov.Merged,
		Writable: []string{t.Repo.Path},
		Env:      env,
		Cwd:      t.Repo.Path,
		Limits:   sandbox.Limits{MemoryBytes: t.Resources.MemoryBytes, Pids: int64(t.Resources.Pids), CPUs: t.Resources.CPUs},
		GPUs:     in.GPUs,
	}
	ok = true
	return a, nil
}

func (a *attemptEnv) close() {
	if a.ref != nil {
		a.ref.Unmount()
	}
	if a.ov != nil {
		a.ov.Unmount()
	}
	os.RemoveAll(a.work)
}

// apply runs the setup script over the submission and reads back what the patch left on disk
// for the static scan. A setup that ran but could not read its changes back is graded here.
func (a *attemptEnv) apply(ctx context.Context, out string, patch []byte, c *canary.Set, ch *cheat.Cheat) (result.Phase, []tamper.Finding, error) {
	t := a.in.Task
	dir := filepath.Join(a.work, "in-apply")
	if err := pytestproto.StageApply(dir, t, a.files, patch, c, ch, a.wantsReference()); err != nil {
		return result.Phase{}, nil, err
	}
	mounts := []sandbox.Mount{{Source: dir, Dest: inDir, ReadOnly: true}}
	raw, err := a.run(ctx, out, "apply", a.base, mounts, pytestproto.ApplyCommand, t.Timeouts.ApplyD, 0, nil)
	if err != nil {
		return result.Phase{}, nil, err
	}
	p := grade.Apply(raw)
	if p.Status != result.StatusPassed {
		return p, nil, nil
	}
	if c != nil {
		// The setup script named and placed the canaries from the official files alone.
		if err := resolveCanaries(filepath.Join(a.work, "out-apply", "canaries.json"), c); err != nil {
			return result.Phase{}, nil, err
		}
	}
	data, err := readLimited(filepath.Join(a.work, "out-apply", "changes.tar"), maxChanges+(16<<20))
	if errors.Is(err, errOverLimit) {
		// The setup script stops at the limit; an archive past it still came from what the
		// patch wrote (nothing else runs in this phase), so it is the submission's limit.
		p.Status, p.Detail = result.StatusFailed, fmt.Sprintf("the patch writes more than %d MiB", maxChanges>>20)
		return p, nil, nil
	}
	if err != nil {
		return result.Phase{}, nil, fmt.Errorf("the setup script's changes.tar: %w", err)
	}
	// Kept with the raw results: what the scan read.
	if err := os.WriteFile(filepath.Join(out, "raw", "changes.tar"), data, 0o644); err != nil {
		return result.Phase{}, nil, err
	}
	changes, err := tamper.ReadChanges(bytes.NewReader(data), maxChanges)
	if errors.Is(err, tamper.ErrTooLarge) {
		p.Status, p.Detail = result.StatusFailed, fmt.Sprintf("the patch writes more than %d MiB", maxChanges>>20)
		return p, nil, nil
	}
	if err != nil {
		return result.Phase{}, nil, err
	}
	return p, tamper.Scan(changes), nil
}

// Where the probe phases see the gold tree: a folder only reference children (their group)
// and the judge can enter, holding the repository as gold and the official tests leave it.
const (
	refMount = "/run/infradev/ref"
	refRepo  = refMount + "/repo"
	// refGID is the group of the judge library's reference children (infradev_probe.REF_GID).
	refGID = 65532
)

// wantsReference: the probes get a gold tree to run reference children over.
func (a *attemptEnv) wantsReference() bool {
	return a.in.Probes != nil && len(a.in.Probes.Probes) > 0 && a.in.Task.GoldFile() != ""
}

// mountReference lays the gold tree the setup script wrote over the environment's layers, as
// a read-only overlay the probe phases mount for their reference children.
func (a *attemptEnv) mountReference() error {
	if !a.wantsReference() {
		return nil
	}
	outDir := filepath.Join(a.work, "out-apply")
	layer := filepath.Join(a.work, "ref-layer")
	repoDir := filepath.Join(layer, strings.TrimPrefix(a.in.Task.Repo.Path, "/"))
	if err := os.MkdirAll(filepath.Dir(repoDir), 0o755); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(outDir, pytestproto.Reference), repoDir); err != nil {
		return fmt.Errorf("the setup script's gold tree: %w", err)
	}
	deleted, err := os.ReadFile(filepath.Join(outDir, pytestproto.ReferenceDeleted))
	if err != nil {
		return fmt.Errorf("the setup script's gold tree: %w", err)
	}
	for _, p := range strings.Split(string(deleted), "\x00") {
		if p == "" {
			continue
		}
		if !filepath.IsLocal(p) {
			return fmt.Errorf("the setup script's gold tree: a removed path %q outside the repository", p)
		}
		// An overlay whiteout: a character device 0/0 hides the lower layers' file.
		w := filepath.Join(repoDir, p)
		if err := os.MkdirAll(filepath.Dir(w), 0o755); err != nil {
			return err
		}
		if err := unix.Mknod(w, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("the gold tree's whiteout for %s: %w", p, err)
		}
	}
	a.ref, err = sandbox.MountLayers(append(append([]string{}, a.stack...), layer), filepath.Join(a.work, "ref"))
	if err != nil {
		return fmt.Errorf("the gold tree: %w", err)
	}
	// The folder the tree is mounted in: root and the reference children's group only.
	door := filepath.Join(a.work, "ref-door")
	if err := os.MkdirAll(filepath.Join(door, "repo"), 0o755); err != nil {
		return err
	}
	if err := os.Chown(door, 0, refGID); err != nil {
		return err
	}
	return os.Chmod(door, 0o750)
}

// resolveCanaries gives the canaries the node ids the setup script planted them under.
func resolveCanaries(file string, c *canary.Set) error {
	data, err := readLimited(file, 1<<20)
	if err != nil {
		return fmt.Errorf("the setup script's canaries: %w", err)
	}
	var byIndex map[string]string
	if err := json.Unmarshal(data, &byIndex); err != nil {
		return fmt.Errorf("the setup script's canaries: %w", err)
	}
	ids := map[int]string{}
	for k, id := range byIndex {
		i, err := strconv.Atoi(k)
		if err != nil {
			return fmt.Errorf("the setup script's canaries: index %q", k)
		}
		ids[i] = id
	}
	return c.Resolve(ids)
}

// readLimited reads a file of at most limit bytes.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(data)) > limit {
		err = fmt.Errorf("%w: over %d bytes", errOverLimit, limit)
	}
	return data, err
}

// errOverLimit: a file was larger than readLimited reads.
var errOverLimit = errors.New("over the limit")

// maxChanges bounds what the static scan reads of a patch's files.
const maxChanges = pytestproto.MaxChanges

// tests runs test ids of the repository (official tests and canaries) under the sealed report:
// their files are collected whole and the report plugin keeps exactly these ids.
func (a *attemptEnv) tests(ctx context.Context, out, name string, ids []string) (grade.Raw, error) {
	dir := filepath.Join(a.work, "in-"+name)
	if err := pytestproto.StageTests(dir); err != nil {
		return grade.Raw{}, err
	}
	mounts := []sandbox.Mount{{Source: dir, Dest: inDir, ReadOnly: true}}
	var files []string
	seen := map[string]bool{}
	for _, id := range ids {
		if f := strings.SplitN(id, "::", 2)[0]; !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	args := append(append(pytestproto.Command(nil, ""), pytestproto.Plugins(a.in.Task)...), "--infradev-select")
	ranks := max(1, a.in.Task.Tests.Ranks)
	return a.run(ctx, out, name, a.base, mounts, pytestproto.Launch(ranks, append(args, files...)), a.in.Task.Timeouts.TestsD, ranks, ids)
}

func (a *attemptEnv) runProbes(ctx context.Context, out string, in Inputs) (result.Phase, error) {
	t := in.Task
	dir := filepath.Join(a.work, "in-probes")
	if err := pytestproto.StageProbes(dir); err != nil {
		return result.Phase{}, err
	}
	spec, extra := a.judgeSpec()
	mounts := append([]sandbox.Mount{{Source: dir, Dest: inDir, ReadOnly: true}, {Source: a.probeDir, Dest: probesMount, ReadOnly: true}}, extra...)
	var plain []string
	infos := map[string]grade.ProbeInfo{}
	for _, p := range in.Probes.Probes {
		infos[p.Test] = grade.ProbeInfo{ID: p.ID, Category: p.Category}
		if p.Budget == nil {
			plain = append(plain, p.Test)
		}
	}
	phase := result.Phase{Name: "probes", Status: result.StatusPassed}
	probeRun := func(name string, ids []string) (grade.Raw, error) {
		// Outside validation the phase's log and report stay in the scratch folder: only the
		// sanitized report reaches the run folder.
		dst := out
		if !in.Probe.Authors {
			dst = filepath.Join(a.work, "private")
			for _, d := range []string{filepath.Join(dst, "logs"), filepath.Join(dst, "raw")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					return grade.Raw{}, err
				}
			}
		}
		raw, err := a.run(ctx, dst, name, spec, mounts, pytestproto.Command(ids, probesMount), t.Timeouts.ProbesD, 1, nil)
		if err != nil {
			return raw, err
		}
		if in.Probe.Record {
			if err := keepRecording(filepath.Join(a.work, "out-"+name), out); err != nil {
				return raw, fmt.Errorf("keeping the probes' recording: %w", err)
			}
		}
		if in.Probe.Authors {
			return raw, nil
		}
		raw.Log = ""
		if raw.JUnit != nil {
			clean, err := sanitizeJUnit(raw.JUnit)
			if err != nil {
				clean = nil // graded as a report that is unreadable
				raw.ReportProblem = "the probes' JUnit report is unreadable"
			}
			raw.JUnit = clean
			if clean != nil {
				if err := os.WriteFile(filepath.Join(out, "raw", name+".xml"), clean, 0o644); err != nil {
					return raw, err
				}
			}
		}
		return raw, nil
	}
	if len(plain) > 0 {
		raw, err := probeRun("probes", plain)
		if err != nil {
			return phase, err
		}
		phase = grade.Tests("probes", raw, grade.Expected{IDs: plain, Probes: infos})
	}
	for _, p := range in.Probes.Budgeted() {
		raw, err := probeRun("probe-"+p.ID, []string{p.Test})
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

// judgeSpec is the probe phases' sandbox: the judge may start its children as another user,
// and it never has the repository on its import path. With a gold tree, its reference
// children read it; in validation the probes may be recorded, forged, or run for their
// authors.
func (a *attemptEnv) judgeSpec() (sandbox.Spec, []sandbox.Mount) {
	s := a.base
	s.Capabilities = []string{"CAP_SETUID", "CAP_SETGID"}
	env := []string{"PYTHONPATH=" + inDir}
	var mounts []sandbox.Mount
	if a.ref != nil {
		refPath := strings.ReplaceAll(a.childPath, a.in.Task.Repo.Path, refRepo)
		env = append(env, "INFRADEV_REFERENCE="+refRepo, "INFRADEV_REFERENCE_PYTHONPATH="+refPath)
		mounts = append(mounts, sandbox.Mount{Source: filepath.Join(a.work, "ref-door"), Dest: refMount, ReadOnly: true},
			sandbox.Mount{Source: filepath.Join(a.ref.Merged, strings.TrimPrefix(a.in.Task.Repo.Path, "/")), Dest: refRepo, ReadOnly: true})
	}
	mode := a.in.Probe
	if mode.Authors {
		env = append(env, "INFRADEV_PROBE_VERBOSE=1")
	}
	if mode.Record {
		env = append(env, "INFRADEV_PROBE_RECORD="+outDir+"/probe-record")
	}
	if mode.Forge != "" {
		env = append(env, "INFRADEV_PROBE_FORGE="+mode.Forge, "INFRADEV_PROBE_RECORDED="+recordedMount)
		mounts = append(mounts, sandbox.Mount{Source: mode.Recorded, Dest: recordedMount, ReadOnly: true})
	}
	s.Env = sandbox.MergeEnv(s.Env, env...)
	s.Cwd = probesMount
	return s, mounts
}

// recordedMount is where a forgery run's judge reads gold's recording.
const recordedMount = "/run/infradev/recorded"

// run runs one sandboxed command with the given read-only mounts and a fresh, empty output
// folder (work/out-<name>), and collects its capped log and, for a sealed phase, the JUnit
// reports that left through the report pipes: reports is 0 for an unsealed phase, 1 for one
// test process, N for a phase run as N ranks (one channel each, fds 3+2r and 4+2r). ids, when
// not nil, are the node ids the report plugin keeps (sent through each channel).
func (a *attemptEnv) run(ctx context.Context, out, name string, spec sandbox.Spec, mounts []sandbox.Mount, args []string, timeout time.Duration, reports int, ids []string) (grade.Raw, error) {
	r := a.r
	outHost := filepath.Join(a.work, "out-"+name)
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
	var chans []*pytestproto.ReportChannel
	spec.ExtraFiles = nil
	for range reports {
		ch, err := pytestproto.OpenReportChannel(ids)
		if err != nil {
			log.Close()
			return grade.Raw{}, err
		}
		defer ch.Close()
		chans = append(chans, ch)
		spec.ExtraFiles = append(spec.ExtraFiles, ch.Files()...)
	}
	spec.Mounts = append(append(append([]sandbox.Mount{}, spec.Mounts...), mounts...),
		sandbox.Mount{Source: outHost, Dest: outDir})
	run, err := r.Sandbox.Run(ctx, spec)
	if cerr := log.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return grade.Raw{}, fmt.Errorf("%s phase: %w", name, err)
	}
	raw := grade.Raw{Run: run, Log: logRel, GPUPeakMemory: run.GPUPeakMemory}
	for r, ch := range chans {
		var rep grade.RankReport
		data, err := ch.Report()
		if err != nil {
			rep.Problem = err.Error()
		} else {
			rep.JUnit = data
			file := name + ".xml"
			if len(chans) > 1 {
				file = fmt.Sprintf("%s.rank%d.xml", name, r)
			}
			if err := os.WriteFile(filepath.Join(out, "raw", file), data, 0o644); err != nil {
				return grade.Raw{}, err
			}
		}
		raw.Ranks = append(raw.Ranks, rep)
	}
	if len(raw.Ranks) == 1 {
		raw.JUnit, raw.ReportProblem, raw.Ranks = raw.Ranks[0].JUnit, raw.Ranks[0].Problem, nil
	}
	return raw, nil
}

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
