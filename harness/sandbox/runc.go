package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Runc runs commands with an OCI runtime (runc, or crun which takes the same arguments).
type Runc struct {
	// Binary is the runtime executable. Default "runc".
	Binary string
	// StateDir holds the runtime's container state and the bundles. Required.
	StateDir string
}

// Run implements Sandbox.
func (r *Runc) Run(ctx context.Context, s Spec) (*Result, error) {
	if len(s.GPUs) > 0 {
		return nil, fmt.Errorf("GPUs %v: this sandbox passes no GPUs through (wrap it in gpu.Sandbox)", s.GPUs)
	}
	bin := r.Binary
	if bin == "" {
		bin = "runc"
	}
	if _, err := exec.LookPath(bin); err != nil {
		return nil, fmt.Errorf("sandbox runtime %q: %w", bin, err)
	}
	if s.Root == "" || len(s.Args) == 0 {
		return nil, errors.New("sandbox: spec needs Root and Args")
	}
	id := newID()
	bundle := filepath.Join(r.StateDir, "bundles", id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	defer os.RemoveAll(bundle)
	if err := writeOwner(bundle); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}

	cg, err := newRunCgroup(id)
	if err != nil {
		return nil, err
	}
	defer cg.remove()

	cfg := ociConfig(s, cg.childPath())
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	stateRoot := filepath.Join(r.StateDir, "runc")
	runtimeLog := filepath.Join(bundle, "runtime.log")
	runtime := func(args ...string) *exec.Cmd {
		return exec.Command(bin, append([]string{"--root", stateRoot, "--log", runtimeLog, "--log-format", "json"}, args...)...)
	}

	// The pid file is written only once the command has started: without it, a non-zero exit
	// is the runtime's failure, not the command's.
	pidFile := filepath.Join(bundle, "pid")
	runArgs := []string{"run", "--bundle", bundle, "--pid-file", pidFile}
	if len(s.ExtraFiles) > 0 {
		runArgs = append(runArgs, "--preserve-fds", strconv.Itoa(len(s.ExtraFiles)))
	}
	cmd := runtime(append(runArgs, id)...)
	cmd.ExtraFiles = s.ExtraFiles
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = orDiscard(s.Stdout), orDiscard(s.Stderr)
	// The runtime must outlive a cancelled context long enough to be killed properly.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	err = cmd.Start()
	for _, f := range s.ExtraFiles {
		f.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: starting %s: %w", bin, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var timer <-chan time.Time
	if s.Timeout > 0 {
		t := time.NewTimer(s.Timeout)
		defer t.Stop()
		timer = t.C
	}
	res := &Result{}
	var waitErr error
	select {
	case waitErr = <-done:
	case <-timer:
		res.TimedOut = true
		waitErr = r.kill(runtime, id, done)
	case <-ctx.Done():
		r.kill(runtime, id, done)
		return nil, fmt.Errorf("sandbox: %w", ctx.Err())
	}
	res.Wall = time.Since(start)
	_ = runtime("delete", "-f", id).Run()
	if _, err := os.Stat(pidFile); err != nil && !res.TimedOut {
		return nil, fmt.Errorf("sandbox: the container did not start: %s", lastLogError(runtimeLog, waitErr))
	}

	var exitErr *exec.ExitError
	switch {
	case waitErr == nil:
	case errors.As(waitErr, &exitErr):
		res.ExitCode = exitErr.ExitCode()
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode = 128 + int(ws.Signal())
		}
	default:
		return nil, fmt.Errorf("sandbox: waiting for %s: %w", bin, waitErr)
	}
	u, err := cg.read()
	if err != nil {
		return nil, fmt.Errorf("sandbox: reading cgroup figures: %w", err)
	}
	res.CPU, res.PeakMemory = u.cpu, u.peakMemory
	// The kernel's OOM killer sends SIGKILL; the parent cgroup's counters stay at 0 (measured),
	// so an OOM is a SIGKILL exit with the peak at the limit.
	if !res.TimedOut && res.ExitCode == 137 && s.Limits.MemoryBytes > 0 && res.PeakMemory >= s.Limits.MemoryBytes*95/100 {
		res.OOM = true
	}
	return res, nil
}

// kill stops the container for good: SIGKILL through the runtime (which reaches every process
// in the container's PID namespace), then waits for the runtime to exit.
func (r *Runc) kill(runtime func(...string) *exec.Cmd, id string, done <-chan error) error {
	_ = runtime("kill", id, "KILL").Run()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
	}
	_ = runtime("delete", "-f", id).Run()
	return <-done
}

// lastLogError is the runtime's last error message from its log, or the wait error.
func lastLogError(logFile string, waitErr error) string {
	data, _ := os.ReadFile(logFile)
	msg := ""
	for _, line := range strings.Split(string(data), "\n") {
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Level == "error" {
			msg = entry.Msg
		} else if strings.Contains(line, "level=error") {
			msg = line
		}
	}
	if msg == "" && waitErr != nil {
		msg = waitErr.Error()
	}
	return msg
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "infradev-" + hex.EncodeToString(b)
}

// ociConfig is the runtime spec for s: close to `runc spec`'s defaults, with a read-only root,
// writable paths bound onto themselves, a size-limited /tmp and the given limits.
func ociConfig(s Spec, cgroupsPath string) *specs.Spec {
	cwd := s.Cwd
	if cwd == "" {
		cwd = "/"
	}
	caps := append([]string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}, s.Capabilities...)
	tmpSize := s.Limits.TmpSize
	if tmpSize == 0 {
		tmpSize = 256 << 20
	}
	mounts := []specs.Mount{
		// hidepid: a process sees only its own user's processes in /proc (the probes' children,
		// which run as another user, cannot read the judge's command line or walk its tree);
		// gid=0 keeps the whole table for root's group, the judge, which measures its
		// children through it.
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"hidepid=2", "gid=0"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=" + fmt.Sprint(tmpSize)}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=" + fmt.Sprint(tmpSize)}},
	}
	writable := append([]string{}, s.Writable...)
	sort.Strings(writable) // parents before children
	for _, w := range writable {
		mounts = append(mounts, specs.Mount{Destination: w, Type: "bind", Source: filepath.Join(s.Root, w), Options: []string{"rbind", "rw"}})
	}
	for _, m := range s.Mounts {
		opt := "rw"
		if m.ReadOnly {
			opt = "ro"
		}
		src, err := filepath.Abs(m.Source)
		if err != nil {
			src = m.Source
		}
		mounts = append(mounts, specs.Mount{Destination: m.Dest, Type: "bind", Source: src, Options: []string{"rbind", opt, "nosuid", "nodev"}})
	}
	ns := []specs.LinuxNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}}
	if !s.Network {
		ns = append(ns, specs.LinuxNamespace{Type: "network"})
	}
	res := &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}}
	if s.Limits.MemoryBytes > 0 {
		limit := s.Limits.MemoryBytes
		res.Memory = &specs.LinuxMemory{Limit: &limit}
		if hasSwapAccounting() {
			res.Memory.Swap = &limit // memory+swap: no swap on top of the limit
		}
	}
	if s.Limits.Pids > 0 {
		pids := s.Limits.Pids
		res.Pids = &specs.LinuxPids{Limit: &pids}
	}
	if s.Limits.CPUs > 0 {
		period := uint64(100000)
		quota := int64(s.Limits.CPUs * float64(period))
		res.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	var devices []specs.LinuxDevice
	for _, d := range s.Devices {
		mode := os.FileMode(0o666)
		zero := uint32(0)
		devices = append(devices, specs.LinuxDevice{Path: d.Path, Type: "c", Major: d.Major, Minor: d.Minor, FileMode: &mode, UID: &zero, GID: &zero})
		major, minor := d.Major, d.Minor
		res.Devices = append(res.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rwm"})
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: s.Args,
			Env:  s.Env,
			Cwd:  cwd,
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: s.Root, Readonly: !s.WritableRoot},
		Hostname: "sandbox",
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: cgroupsPath,
			Resources:   res,
			Devices:     devices,
			Namespaces:  ns,
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

func hasSwapAccounting() bool {
	if isV2() {
		return true
	}
	_, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes"))
	return err == nil
}
