// Package sandbox owns running one command in isolation: a root filesystem (an overlay of
// read-only layers under a per-attempt scratch layer), read-only except for named writable
// paths and /tmp, no network unless asked, memory, pids and CPU limits, a wall-clock timeout
// that really kills, and accounting of wall time, CPU time and peak memory from the run's own
// cgroup. It knows nothing of tasks.
package sandbox

import (
	"context"
	"io"
	"os"
	"strings"
	"time"
)

// Sandbox runs commands. An error means the sandbox itself failed (an infrastructure fault);
// a command that fails, times out or runs out of memory is a Result, not an error.
type Sandbox interface {
	Run(ctx context.Context, s Spec) (*Result, error)
}

// Spec is one command to run.
type Spec struct {
	// Root is the root filesystem directory (e.g. Overlay.Merged). It is mounted read-only
	// unless WritableRoot is set (as for environment build steps).
	Root         string
	WritableRoot bool
	// Writable are absolute paths inside Root that stay writable (bound onto themselves).
	Writable []string
	// Mounts are extra bind mounts from the host.
	Mounts []Mount
	Args   []string
	Env    []string
	// Cwd is the working directory inside the sandbox. Default "/".
	Cwd string
	// Network gives the host's network; false (the default) gives a namespace of the
	// sandbox's own whose only interface is its loopback: processes inside reach each other on
	// 127.0.0.1 (a process group's store, NCCL's bootstrap, Ray), nothing outside is reachable.
	Network bool
	Limits  Limits
	// Timeout is the wall-clock limit; 0 means none.
	Timeout time.Duration
	// Stdout and Stderr receive the command's output. Default: discarded.
	Stdout, Stderr io.Writer
	// Devices are character devices put into the sandbox; the device cgroup allows exactly
	// these beyond the runtime's defaults.
	Devices []Device
	// Capabilities are added to the runtime's few defaults (CAP_AUDIT_WRITE, CAP_KILL,
	// CAP_NET_BIND_SERVICE), e.g. CAP_SETUID and CAP_SETGID for a command that must run its
	// children as another user.
	Capabilities []string
	// GPUs are indices of the machine's GPUs the command gets. A plain sandbox refuses them:
	// a decorator that passes GPUs through (package gpu's Sandbox) takes them off the spec.
	GPUs []int
	// ExtraFiles are passed to the command as file descriptors 3, 4, ...; Run closes them once
	// the command has started, so pipes given here see EOF when the command ends.
	ExtraFiles []*os.File
}

// Mount binds Source on the host to Dest in the sandbox.
type Mount struct {
	Source   string
	Dest     string
	ReadOnly bool
}

// Device is a character device node: Path inside the sandbox, Major/Minor its numbers.
type Device struct {
	Path         string
	Major, Minor int64
}

// Limits bound a run's resources. Zero fields mean no limit, except TmpSize (default 256MiB).
type Limits struct {
	MemoryBytes int64
	Pids        int64
	CPUs        float64
	TmpSize     int64
}

// Result is what a run did.
type Result struct {
	ExitCode int  `json:"exit_code"`
	TimedOut bool `json:"timed_out,omitempty"`
	// OOM is set when the command was killed for exceeding its memory limit.
	OOM        bool          `json:"oom,omitempty"`
	Wall       time.Duration `json:"wall_ns"`
	CPU        time.Duration `json:"cpu_ns"`
	PeakMemory int64         `json:"peak_memory_bytes"`
	// GPUPeakMemory is the run's GPUs' peak memory use above idle, where they were metered.
	GPUPeakMemory uint64 `json:"gpu_peak_memory_bytes,omitempty"`
}

// MergeEnv returns env with each KEY=VALUE of over set, replacing any earlier value of KEY:
// an environment never holds a key twice (which value a program sees would depend on it).
func MergeEnv(env []string, over ...string) []string {
	out := []string{}
	index := map[string]int{}
	for _, kv := range append(append([]string{}, env...), over...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			out[i] = kv
			continue
		}
		index[k] = len(out)
		out = append(out, kv)
	}
	return out
}
