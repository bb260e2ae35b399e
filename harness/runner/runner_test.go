package runner_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/txtar"

	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/gpu/gputest"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/predictions"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/task"
)

// adversarialTask is minitron-0001 with short timeouts and tight limits, so the suite's
// timeouts and memory hogs end quickly.
func adversarialTask(t *testing.T) (*task.Task, *probe.Set) {
	tk, ps := testenv.Task(t, "demo", "minitron-0001")
	c := *tk
	// The probes get room to spare on a loaded machine: no case here is meant to time out in them.
	c.Timeouts.ApplyD, c.Timeouts.TestsD, c.Timeouts.ProbesD = 30*time.Second, 10*time.Second, 30*time.Second
	c.Resources.MemoryBytes, c.Resources.DiskBytes, c.Resources.Pids = 512<<20, 1<<30, 128
	return &c, ps
}

// samplePatch returns a model's patch from the skeleton predictions file.
func samplePatch(t *testing.T, model string) string {
	ps, err := predictions.Read(filepath.Join(testenv.RepoRoot(t), "tasks/demo/predictions/skeleton.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Model == model {
			return p.Patch
		}
	}
	t.Fatalf("no prediction from %s", model)
	return ""
}

// caseSpec is one adversarial case: where it starts, what it writes, what it must get.
type caseSpec struct {
	name, start, want string
	checks            map[string]bool
	archive           *txtar.Archive
	binary            string
	huge              int
	// many is a count of small new files with long names; zeros the size of a file of zeros
	// (compressed to a small binary patch).
	many, zeros int
	// attributes are written to .git/info/attributes when the case's diff is made (e.g.
	// "*.py binary" sends Python sources as binary literals); link is "path -> target".
	attributes, link string
}

func loadCases(t *testing.T) []caseSpec {
	files, err := filepath.Glob("testdata/adversarial/*.txtar")
	if err != nil || len(files) < 58 {
		t.Fatalf("adversarial cases: %d files (%v), want at least 58", len(files), err)
	}
	var out []caseSpec
	for _, f := range files {
		a, err := txtar.ParseFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c := caseSpec{name: strings.TrimSuffix(filepath.Base(f), ".txtar"), start: "base", archive: a, checks: map[string]bool{}}
		for _, line := range strings.Split(string(a.Comment), "\n") {
			k, v, ok := strings.Cut(line, ": ")
			if !ok {
				continue
			}
			switch k {
			case "start":
				c.start = v
			case "want":
				c.want = v
			case "binary":
				c.binary = v
			case "huge":
				c.huge, _ = strconv.Atoi(v)
			case "many":
				c.many, _ = strconv.Atoi(v)
			case "zeros":
				c.zeros, _ = strconv.Atoi(v)
			case "attributes":
				c.attributes = v
			case "link":
				c.link = v
			case "checks":
				for _, ch := range strings.Split(v, ",") {
					c.checks[strings.TrimSpace(ch)] = true
				}
			}
		}
		if c.want == "" {
			t.Fatalf("%s: no 'want:' line", f)
		}
		out = append(out, c)
	}
	return out
}

// patchFor makes the case's submission: a real git diff against the demo repository's base.
func patchFor(t *testing.T, c caseSpec, port int) []byte {
	t.Helper()
	if c.huge > 0 {
		return bytes.Repeat([]byte("+"), c.huge)
	}
	for _, f := range c.archive.Files {
		if f.Name == "raw.patch" {
			return f.Data
		}
	}
	dir, git := demoRepo(t)
	switch c.start {
	case "gold":
		gold, _ := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "tasks/demo/minitron-0001/gold.patch"))
		git(string(gold), "apply")
	case "fails-probe":
		git(samplePatch(t, "sample/fails-probe"), "apply")
	case "empty":
		return nil
	}
	var appended []byte
	for _, f := range c.archive.Files {
		name := f.Name
		if name == "append.patch" { // raw diff text added after the generated diff
			appended = f.Data
			continue
		}
		if rest, ok := strings.CutPrefix(name, "delete:"); ok {
			if err := os.Remove(filepath.Join(dir, rest)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data := bytes.ReplaceAll(f.Data, []byte("{{PORT}}"), []byte(strconv.Itoa(port)))
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.many {
		name := filepath.Join(dir, "bulk", fmt.Sprintf("%s%06d.txt", strings.Repeat("n", 40), i))
		os.MkdirAll(filepath.Dir(name), 0o755)
		os.WriteFile(name, []byte("x\n"), 0o644)
	}
	if c.zeros > 0 {
		os.WriteFile(filepath.Join(dir, "zeros.bin"), make([]byte, c.zeros), 0o644)
	}
	if c.binary != "" {
		blob := make([]byte, 4096)
		rand.Read(blob)
		os.WriteFile(filepath.Join(dir, c.binary), blob, 0o644)
	}
	if c.link != "" {
		name, target, _ := strings.Cut(c.link, " -> ")
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if c.attributes != "" {
		if err := os.WriteFile(filepath.Join(dir, ".git", "info", "attributes"), []byte(c.attributes+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("", "add", "-A")
	if c.binary != "" {
		git("", "add", "-f", c.binary) // even where .gitignore would leave it out
	}
	return append([]byte(git("", "diff", "--cached", "--binary")), appended...)
}

// TestAdversarialSuite runs every case in testdata/adversarial through the real runner and
// checks its verdict and failure class, that the harness never fails, and that the host (image
// layers, task and probe files, processes, the host's loopback) is unchanged.
func TestAdversarialSuite(t *testing.T) {
	testenv.RequireSandbox(t)
	tk, ps := adversarialTask(t)
	r := testenv.Runner(t, nil)
	in := testenv.Inputs(t, tk, ps, nil)
	stack, _, err := r.Cache.Stack(context.Background(), in.Layout, in.Image)
	if err != nil {
		t.Fatal(err)
	}
	guarded := append(append([]string{}, stack...), tk.Dir, ps.Dir)
	before := treeDigests(t, guarded)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	for _, c := range loadCases(t) {
		t.Run(c.name, func(t *testing.T) {
			in := in
			in.Patch = patchFor(t, c, port)
			out := t.TempDir()
			res, err := runner.Retry{Attempter: r}.Run(context.Background(), in, out)
			if err != nil {
				t.Fatalf("the harness failed: %v", err)
			}
			got := res.FailureClass
			if res.Resolved {
				got = "resolved"
			}
			if got != c.want {
				t.Errorf("verdict %q (reason %q), want %q", got, res.Reason, c.want)
			}
			if c.checks["listener"] && accepted.Load() != 0 {
				t.Errorf("the host's loopback listener accepted %d connections", accepted.Load())
			}
			if c.checks["processes"] {
				assertNoProcess(t, "sleep 987654")
			}
			if c.checks["no-probe-source"] {
				assertNoProbeSource(t, out, ps.Dir)
			}
			if c.checks["logs"] {
				// The official tests' log is kept, capped; the probes' is kept only for
				// their authors, so it must not be here.
				if fi, err := os.Stat(filepath.Join(out, "logs", "tests.log")); err != nil || fi.Size() > 3<<20 {
					t.Errorf("log tests.log: %v, size over 3MiB or missing", err)
				}
				if _, err := os.Stat(filepath.Join(out, "logs", "probes.log")); err == nil {
					t.Errorf("log probes.log kept in a run that is not the probe authors'")
				}
			}
		})
	}
	if after := treeDigests(t, guarded); !equal(before, after) {
		for i := range guarded {
			if before[i] != after[i] {
				t.Errorf("%s changed during the suite", guarded[i])
			}
		}
	}
	if accepted.Load() != 0 {
		t.Errorf("the host's loopback listener accepted %d connections", accepted.Load())
	}
	assertNoProcess(t, "sleep 987654")
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), r.Scratch) {
		t.Errorf("mounts left under the scratch directory:\n%s", mounts)
	}
}

// failingRuntime is a runc wrapper that kills itself on its first "run", as a crashed
// container runtime would, then behaves.
func failingRuntime(t *testing.T) string {
	dir := t.TempDir()
	script := filepath.Join(dir, "runc")
	body := "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = run ] && [ ! -e " + dir + "/crashed ]; then touch " + dir + "/crashed; kill -9 $$; fi\ndone\nexec runc \"$@\"\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

func TestInfrastructureFaultsAreRetriedAndNotCounted(t *testing.T) {
	testenv.RequireSandbox(t)
	tk, ps := testenv.Task(t, "demo", "minitron-0001")
	gold, _ := os.ReadFile(tk.File(tk.Gold))
	state := filepath.Join(testenv.Cache(t), "sandbox")

	t.Run("runtime missing", func(t *testing.T) {
		r := testenv.Runner(t, &sandbox.Runc{Binary: "/nonexistent/runc", StateDir: state})
		out := t.TempDir()
		res, err := runner.Retry{Attempter: r}.Run(context.Background(), testenv.Inputs(t, tk, ps, gold), out)
		if err != nil {
			t.Fatal(err)
		}
		if res.FailureClass != result.InfraError || len(res.RetriedInfraErrors) != 1 {
			t.Fatalf("class %q, %d retries; want infra_error after 1 retry (reason %q)", res.FailureClass, len(res.RetriedInfraErrors), res.Reason)
		}
		if _, err := os.Stat(filepath.Join(out, "infra-attempt-1", "result.json")); err != nil {
			t.Errorf("the first attempt's folder was not kept: %v", err)
		}
		s := report.Summarize("r", []*result.Result{res})
		if m := s.Models[0]; m.ErrorInstances != 1 || m.UnresolvedInstances != 0 || m.CompletedInstances != 0 {
			t.Errorf("report counts %+v: an infrastructure error must not count against the submission", m)
		}
		if got := report.Verdict(res); got != "not run (infrastructure error)" {
			t.Errorf("verdict %q", got)
		}
	})

	t.Run("runtime killed once", func(t *testing.T) {
		r := testenv.Runner(t, &sandbox.Runc{Binary: failingRuntime(t), StateDir: state})
		res, err := runner.Retry{Attempter: r}.Run(context.Background(), testenv.Inputs(t, tk, ps, gold), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if !res.Resolved || len(res.RetriedInfraErrors) != 1 || !strings.Contains(res.RetriedInfraErrors[0], "did not start") {
			t.Errorf("resolved=%v retried=%q; want resolved after one retried infra error", res.Resolved, res.RetriedInfraErrors)
		}
	})
}

func TestVerdictRepeats(t *testing.T) {
	testenv.RequireSandbox(t)
	tk, ps := testenv.Task(t, "demo", "minitron-0001")
	r := testenv.Runner(t, nil)
	for _, model := range []string{"sample/gold", "sample/fails-probe"} {
		in := testenv.Inputs(t, tk, ps, []byte(samplePatch(t, model)))
		var first string
		for i := 0; i < 5; i++ {
			res, err := r.Run(context.Background(), in, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			got := verdictKey(res)
			if i == 0 {
				first = got
			} else if got != first {
				t.Errorf("%s run %d: %s, run 1: %s", model, i+1, got, first)
			}
		}
	}
}

func verdictKey(r *result.Result) string {
	var b strings.Builder
	b.WriteString(strconv.FormatBool(r.Resolved) + " " + r.FailureClass)
	for _, p := range r.Phases {
		b.WriteString(" " + p.Name + "=" + p.Status)
		for _, o := range p.Tests {
			b.WriteString(" " + o.ID + ":" + o.Outcome)
		}
	}
	return b.String()
}

func treeDigests(t *testing.T, dirs []string) []string {
	var out []string
	for _, d := range dirs {
		h, err := digest.Tree(d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func equal(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }

// assertNoProbeSource: no file of the run folder holds a line of the probes' drivers (lines
// that read ARGS), whatever the code under test printed, wrote or raised.
func assertNoProbeSource(t *testing.T, out, probes string) {
	t.Helper()
	var lines []string
	files, _ := filepath.Glob(filepath.Join(probes, "test_*.py"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); len(l) >= 25 && strings.Contains(l, "ARGS[") {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) == 0 {
		t.Fatalf("no driver lines found in %s", probes)
	}
	filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		data, _ := os.ReadFile(p)
		for _, l := range lines {
			if bytes.Contains(data, []byte(l)) {
				t.Errorf("%s holds a line of the probes' drivers: %q", p, l)
				return nil
			}
		}
		return nil
	})
}

func assertNoProcess(t *testing.T, cmdline string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " ")) == cmdline {
			t.Errorf("process %q (pid %s) outlived its attempt", cmdline, e.Name())
		}
	}
}

// TestMemoryBudgetRejectsWastefulPatch: a patch that passes every official test and every
// functional probe but needs about twice gold's memory is rejected by the memory budget alone.
func TestMemoryBudgetRejectsWastefulPatch(t *testing.T) {
	testenv.RequireSandbox(t)
	tk, ps := testenv.Task(t, "demo", "minitron-0001")
	r := testenv.Runner(t, nil)
	res, err := r.Run(context.Background(), testenv.Inputs(t, tk, ps, []byte(samplePatch(t, "sample/wastes-memory"))), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if res.FailureClass != result.ProbesFailed || strings.Join(res.FailedProbeCategories, ",") != "memory" {
		t.Fatalf("class %q categories %v, want probes_failed on memory only (%s)", res.FailureClass, res.FailedProbeCategories, res.Reason)
	}
	if p := res.Phase("tests"); p == nil || p.Status != result.StatusPassed {
		t.Errorf("official tests did not all pass: %+v", p)
	}
	for _, o := range res.Phase("probes").Tests {
		switch {
		case o.Category == "memory" && o.Outcome != result.OverBudget:
			t.Errorf("memory probe %s: %s, want over_budget", o.Probe, o.Outcome)
		case o.Category != "memory" && o.Outcome != result.StatusPassed:
			t.Errorf("functional probe %s: %s, want passed", o.Probe, o.Outcome)
		case o.Category == "memory":
			base := ps.Baseline.Probes[o.Probe].PeakMemoryBytes
			if ratio := float64(o.PeakMemoryBytes) / float64(base); ratio < 1.5 {
				t.Errorf("measured %.2fx gold's peak, want the patch's waste (about 2x) to show", ratio)
			}
			t.Logf("%s: %s", o.Probe, o.Message)
		}
	}
}

// gpuFaults wraps a sandbox: while a command runs on a leased (mocked) GPU it uses 3GiB of
// that GPU's memory, and the first test phase it sees gets an Xid on its GPU.
type gpuFaults struct {
	sandbox.Sandbox
	m        *gputest.Machine
	injected bool
}

func (f *gpuFaults) Run(ctx context.Context, s sandbox.Spec) (*sandbox.Result, error) {
	for _, e := range s.Env {
		if v, ok := strings.CutPrefix(e, "NVIDIA_VISIBLE_DEVICES="); ok && v != "" {
			idx, _ := strconv.Atoi(strings.Split(v, ",")[0])
			f.m.SetUsed(idx, 3<<30)
			defer f.m.SetUsed(idx, 0)
			if !f.injected && strings.Contains(strings.Join(s.Args, " "), "pytest") {
				f.injected = true
				f.m.Xid(idx, 79)
			}
			time.Sleep(150 * time.Millisecond) // let the meter and the watch see the run
		}
	}
	return f.Sandbox.Run(ctx, s)
}

// TestGPUFaultIsRetriedOnOtherGPUs runs a 1-GPU attempt through the whole GPU path on a mocked
// machine and a fake device set: lease, pass-through, memory meter, Xid watch. The Xid in the
// first attempt makes it an infrastructure error; the retry leases another GPU and resolves,
// and the phases record the GPU memory used.
func TestGPUFaultIsRetriedOnOtherGPUs(t *testing.T) {
	testenv.RequireSandbox(t)
	tk, ps := testenv.Task(t, "demo", "minitron-0001")
	c := *tk
	c.Resources.GPUs.Count = 1
	lib := gputest.Islands()
	m, err := gpu.Discover(lib)
	if err != nil {
		t.Fatal(err)
	}
	fake := gpu.FakeNodes{Dir: filepath.Join(t.TempDir(), "dev"), N: 8}
	if err := fake.Create(); err != nil {
		t.Fatal(err)
	}
	r := testenv.Runner(t, nil)
	leased := &runner.Leased{Attempter: r, Dir: t.TempDir(), Machine: m}
	r.Sandbox = gpu.Sandbox{Sandbox: &gpuFaults{Sandbox: r.Sandbox, m: lib}, Nodes: fake, NVML: lib, OnFault: leased.SetAside}
	gold, _ := os.ReadFile(tk.File(tk.Gold))
	res, err := runner.Retry{Attempter: leased}.Run(context.Background(), testenv.Inputs(t, &c, ps, gold), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !res.Resolved || len(res.RetriedInfraErrors) != 1 || !strings.Contains(res.RetriedInfraErrors[0], "Xid 79 on GPU 0") {
		t.Fatalf("resolved=%v retried=%q (%s); want a resolved retry after an Xid on GPU 0", res.Resolved, res.RetriedInfraErrors, res.Reason)
	}
	if p := res.Phase("tests"); p == nil || p.GPUPeakMemory != 3<<30 {
		t.Errorf("tests phase GPU peak memory = %v, want 3GiB", p)
	}
}

// TestRanksEveryRankMustPass runs the official tests as two rank processes (tests.ranks: 2):
// gold passes on both and each rank's report is kept; a submission that breaks only rank 1
// fails the official tests, the failure naming rank 1.
func TestRanksEveryRankMustPass(t *testing.T) {
	testenv.RequireSandbox(t)
	tk, ps := testenv.Task(t, "demo", "minitron-0001")
	c := *tk
	c.Tests.Ranks = 2
	r := testenv.Runner(t, nil)
	gold := []byte(samplePatch(t, "sample/gold"))

	out := t.TempDir()
	res, err := r.Run(context.Background(), testenv.Inputs(t, &c, ps, gold), out)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Resolved {
		t.Fatalf("gold on two ranks: %s (%s)", res.FailureClass, res.Reason)
	}
	for _, f := range []string{"tests.rank0.xml", "tests.rank1.xml"} {
		if _, err := os.Stat(filepath.Join(out, "raw", f)); err != nil {
			t.Errorf("rank report: %v", err)
		}
	}

	broken := rankBreakingPatch(t, gold)
	res, err = r.Run(context.Background(), testenv.Inputs(t, &c, ps, broken), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if res.Resolved || res.FailureClass != result.OfficialTestsFailed {
		t.Fatalf("a submission broken on rank 1: resolved=%v class %s (%s)", res.Resolved, res.FailureClass, res.Reason)
	}
	named := false
	for _, p := range res.Phases {
		for _, o := range p.Tests {
			named = named || strings.HasPrefix(o.Message, "rank 1")
		}
	}
	if !named {
		t.Errorf("no test outcome names rank 1: %+v", res.Phases)
	}
}

// rankBreakingPatch is gold plus an import-time failure on rank 1 only.
func rankBreakingPatch(t *testing.T, gold []byte) []byte {
	dir, git := demoRepo(t)
	git(string(gold), "apply")
	f, err := os.OpenFile(filepath.Join(dir, "minitron", "__init__.py"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("\nimport os as _os\nif _os.environ.get(\"RANK\") == \"1\":\n    raise ImportError(\"broken on rank 1\")\n")
	f.Close()
	git("", "add", "-A")
	return []byte(git("", "diff", "--cached", "--binary"))
}

// TestSurveyWithRanks: a survey of a task with tests.ranks runs the tests on every rank and
// reports each test at its worst rank, as the official tests are graded.
func TestSurveyWithRanks(t *testing.T) {
	testenv.RequireSandbox(t)
	tk, ps := testenv.Task(t, "demo", "minitron-0001")
	c := *tk
	c.Tests.Ranks = 2
	r := testenv.Runner(t, nil)
	gold := []byte(samplePatch(t, "sample/gold"))
	for _, c2 := range []struct {
		name  string
		patch []byte
		want  string
	}{
		{"gold on two ranks", gold, result.StatusPassed},
		{"a change broken on rank 1", rankBreakingPatch(t, gold), result.StatusError},
	} {
		got, err := r.Survey(context.Background(), testenv.Inputs(t, &c, ps, c2.patch), []string{"tests/test_checkpoint_optimizer.py"}, nil, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if len(got) < 3 {
			t.Fatalf("%s: %v", c2.name, got)
		}
		for id, o := range got {
			if o != c2.want {
				t.Errorf("%s: %s %s, want %s", c2.name, id, o, c2.want)
			}
		}
	}
}

// demoRepo copies the demo repository (minitron at its base) into a fresh git repository and
// returns it with a function that runs git there (stdin, args), failing the test on error.
func demoRepo(t *testing.T) (string, func(stdin string, args ...string) string) {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(testenv.RepoRoot(t), "environments/demo/minitron")
	if out, err := exec.Command("cp", "-a", src+"/.", dir).CombinedOutput(); err != nil {
		t.Fatalf("copying the demo repository: %v %s", err, out)
	}
	git := func(stdin string, args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Stdin = dir, strings.NewReader(stdin)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CEILING_DIRECTORIES="+filepath.Dir(dir))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	git("", "init", "-q")
	git("", "add", "-A")
	git("", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
	return dir, git
}
