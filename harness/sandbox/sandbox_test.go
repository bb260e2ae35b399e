package sandbox_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/sandbox"
)

// requireRoot skips where the sandbox cannot run at all, but never in CI, which installs runc
// and runs as root: there a missing prerequisite is a failure.
func requireRoot(t *testing.T) {
	t.Helper()
	var missing string
	if os.Geteuid() != 0 {
		missing = "not root"
	} else if _, err := exec.LookPath("runc"); err != nil {
		missing = "runc not installed"
	} else if _, err := os.Stat("/bin/busybox"); err != nil {
		missing = "busybox-static not installed"
	}
	if missing == "" {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("sandbox tests need root, runc and busybox-static: %s", missing)
	}
	t.Skipf("sandbox tests need root, runc and busybox-static: %s", missing)
}

// busyboxRoot makes a minimal root filesystem layer: a static busybox and its applets.
func busyboxRoot(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "lower")
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "workspace", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "sleep", "cat", "echo", "nc", "tail", "touch", "ls", "yes", "head", "dd"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

type fixture struct {
	lower string
	ov    *sandbox.Overlay
	sb    sandbox.Sandbox
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	requireRoot(t)
	lower := busyboxRoot(t)
	ov, err := sandbox.MountOverlay([]string{lower}, filepath.Join(t.TempDir(), "ov"), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ov.Unmount() })
	return &fixture{lower: lower, ov: ov, sb: &sandbox.Runc{StateDir: t.TempDir()}}
}

func (f *fixture) run(t *testing.T, script string, mod func(*sandbox.Spec)) (*sandbox.Result, string) {
	t.Helper()
	var out bytes.Buffer
	s := sandbox.Spec{
		Root:     f.ov.Merged,
		Writable: []string{"/workspace"},
		Args:     []string{"/bin/sh", "-c", script},
		Env:      []string{"PATH=/bin"},
		Cwd:      "/workspace",
		Limits:   sandbox.Limits{MemoryBytes: 128 << 20, Pids: 64},
		Timeout:  30 * time.Second,
		Stdout:   &out,
		Stderr:   &out,
	}
	if mod != nil {
		mod(&s)
	}
	res, err := f.sb.Run(context.Background(), s)
	if err != nil {
		t.Fatalf("Run(%q) error: %v", script, err)
	}
	return res, out.String()
}

func TestExitCodeAndAccounting(t *testing.T) {
	f := newFixture(t)
	res, out := f.run(t, `i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo done; exit 7`, nil)
	if res.ExitCode != 7 || strings.TrimSpace(out) != "done" {
		t.Fatalf("exit %d, output %q; want 7, done", res.ExitCode, out)
	}
	if res.CPU <= 0 || res.PeakMemory <= 0 || res.Wall <= 0 {
		t.Errorf("figures not measured: cpu %v, peak %d, wall %v", res.CPU, res.PeakMemory, res.Wall)
	}
	if res.TimedOut || res.OOM {
		t.Errorf("TimedOut=%v OOM=%v, want both false", res.TimedOut, res.OOM)
	}
}

func TestNoNetwork(t *testing.T) {
	f := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	res, out := f.run(t, "echo hi | nc -w 2 127.0.0.1 "+strconv.Itoa(port), nil)
	if res.ExitCode == 0 {
		t.Errorf("connecting to the host's loopback succeeded (output %q), want failure", out)
	}
	select {
	case <-accepted:
		t.Errorf("the host listener accepted a connection from the sandbox")
	case <-time.After(200 * time.Millisecond):
	}
}

func TestWritesOnlyToWorkspaceAndTmp(t *testing.T) {
	f := newFixture(t)
	before, err := digest.Tree(f.lower)
	if err != nil {
		t.Fatal(err)
	}
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "keep"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		script string
		ok     bool
	}{
		{"echo x > /etc/evil", false},
		{"echo x > /bin/evil", false},
		{"echo x > /evil", false},
		{"echo x > /host/keep", false},
		{"echo x > /host/new", false},
		{"echo x > /workspace/ok && cat /workspace/ok", true},
		{"echo x > /tmp/ok && cat /tmp/ok", true},
	}
	for _, c := range cases {
		res, out := f.run(t, c.script, func(s *sandbox.Spec) {
			s.Mounts = []sandbox.Mount{{Source: host, Dest: "/host", ReadOnly: true}}
		})
		if got := res.ExitCode == 0; got != c.ok {
			t.Errorf("%q: exit %d (output %q), want success=%v", c.script, res.ExitCode, out, c.ok)
		}
	}
	after, err := digest.Tree(f.lower)
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("the image layer changed: %s -> %s", before, after)
	}
	if data, _ := os.ReadFile(filepath.Join(host, "keep")); string(data) != "host" {
		t.Errorf("host file = %q, want %q", data, "host")
	}
	if _, err := os.Stat(filepath.Join(host, "new")); err == nil {
		t.Errorf("a file appeared in the read-only host mount")
	}
	if _, err := os.Stat(filepath.Join(f.ov.Upper(), "workspace", "ok")); err != nil {
		t.Errorf("workspace write did not land in the scratch layer: %v", err)
	}
}

func TestMemoryLimitKills(t *testing.T) {
	f := newFixture(t)
	// tail holds an endless line in memory.
	res, _ := f.run(t, "tail /dev/zero", func(s *sandbox.Spec) { s.Limits.MemoryBytes = 64 << 20 })
	if !res.OOM || res.ExitCode != 137 {
		t.Fatalf("OOM=%v exit=%d peak=%d, want OOM with exit 137", res.OOM, res.ExitCode, res.PeakMemory)
	}
	if res.PeakMemory > 72<<20 {
		t.Errorf("peak memory %d exceeds the 64MiB limit by more than slack", res.PeakMemory)
	}
}

func TestTimeoutKillsEverything(t *testing.T) {
	f := newFixture(t)
	start := time.Now()
	// The shell ignores SIGTERM and leaves a child behind: only a real kill stops both.
	res, _ := f.run(t, "trap '' TERM; sleep 1001 & sleep 1002", func(s *sandbox.Spec) { s.Timeout = 500 * time.Millisecond })
	if !res.TimedOut {
		t.Fatalf("TimedOut = false (exit %d), want true", res.ExitCode)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("timeout took %v to take effect", d)
	}
	assertNoProcess(t, "sleep 1001", "sleep 1002")
}

func TestBackgroundProcessesDieWithTheCommand(t *testing.T) {
	f := newFixture(t)
	res, _ := f.run(t, "sleep 1003 & exit 0", nil)
	if res.ExitCode != 0 {
		t.Fatalf("exit %d, want 0", res.ExitCode)
	}
	assertNoProcess(t, "sleep 1003")
}

func TestPidsLimit(t *testing.T) {
	f := newFixture(t)
	res, out := f.run(t, "i=0; while [ $i -lt 50 ]; do sleep 5 & i=$((i+1)); done; exit 3", func(s *sandbox.Spec) {
		s.Limits.Pids = 10
	})
	if res.ExitCode == 0 || !strings.Contains(out, "fork") {
		t.Errorf("exit %d output %q: want fork refused under a 10-pid limit", res.ExitCode, out)
	}
}

func TestRuntimeFaultsAreErrors(t *testing.T) {
	f := newFixture(t)
	bad := &sandbox.Runc{Binary: "/nonexistent/runc", StateDir: t.TempDir()}
	if _, err := bad.Run(context.Background(), sandbox.Spec{Root: f.ov.Merged, Args: []string{"/bin/true"}}); err == nil {
		t.Errorf("Run with a missing runtime: error = nil, want an error")
	}
	_, err := f.sb.Run(context.Background(), sandbox.Spec{Root: f.ov.Merged, Args: []string{"/bin/sh", "-c", "exit 0"},
		Mounts: []sandbox.Mount{{Source: "/nonexistent/dir", Dest: "/x"}}})
	if err == nil || !strings.Contains(err.Error(), "did not start") {
		t.Errorf("Run with an unmountable source: error = %v, want 'did not start'", err)
	}
}

func assertNoProcess(t *testing.T, cmdlines ...string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cl := strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " "))
		for _, want := range cmdlines {
			if cl == want {
				t.Errorf("process %q (pid %s) survived the run", cl, e.Name())
			}
		}
	}
}

// TestPrivateLoopback: the sandbox has a loopback of its own, up, so processes inside it can
// talk to each other (torch.distributed's store, NCCL's bootstrap, Ray) while nothing outside
// is reachable (TestNoNetwork).
func TestPrivateLoopback(t *testing.T) {
	f := newFixture(t)
	res, out := f.run(t, `(nc -l -p 29500 > /tmp/got &) ; sleep 0.5; echo over-loopback | nc -w 2 127.0.0.1 29500; sleep 0.5; cat /tmp/got`, nil)
	if res.ExitCode != 0 || !strings.Contains(out, "over-loopback") {
		t.Fatalf("exit %d, output %q: two processes in the sandbox could not talk over 127.0.0.1", res.ExitCode, out)
	}
}

// TestProcShowsOnlyYourOwnUsersProcesses: a process of another user (as the probes' children
// are) cannot see root's processes in /proc, while root's group sees every process.
func TestProcShowsOnlyYourOwnUsersProcesses(t *testing.T) {
	f := newFixture(t)
	os.WriteFile(filepath.Join(f.lower, "etc", "passwd"), []byte("root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"), 0o644)
	res, out := f.run(t, `sleep 60 & root_sleep=$!
su -s /bin/sh nobody -c 'sleep 60 & echo "nobody_sleep=$!"; ls /proc'
echo "root_sleep=$root_sleep"; ls /proc`, func(s *sandbox.Spec) { s.Capabilities = []string{"CAP_SETUID", "CAP_SETGID"} })
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: %s", res.ExitCode, out)
	}
	var nobodySleep, rootSleep string
	var asNobody, asRoot []string
	seenRoot := false
	for _, f := range strings.Fields(out) {
		switch {
		case strings.HasPrefix(f, "nobody_sleep="):
			nobodySleep = strings.TrimPrefix(f, "nobody_sleep=")
		case strings.HasPrefix(f, "root_sleep="):
			rootSleep, seenRoot = strings.TrimPrefix(f, "root_sleep="), true
		case !seenRoot:
			asNobody = append(asNobody, f)
		default:
			asRoot = append(asRoot, f)
		}
	}
	has := func(list []string, pid string) bool {
		for _, x := range list {
			if x == pid {
				return true
			}
		}
		return false
	}
	if rootSleep == "" || nobodySleep == "" {
		t.Fatalf("output %q", out)
	}
	if has(asNobody, rootSleep) || has(asNobody, "1") {
		t.Errorf("another user sees root's processes in /proc: %v", asNobody)
	}
	if !has(asNobody, nobodySleep) {
		t.Errorf("a user does not see its own processes in /proc: %v", asNobody)
	}
	if !has(asRoot, rootSleep) || !has(asRoot, "1") || !has(asRoot, nobodySleep) {
		t.Errorf("root does not see every process: %v", asRoot)
	}
}
