package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// cgroupRoot is where cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// runCgroup is the parent cgroup of one run. The runtime creates the container's cgroup as its
// child and deletes that child when the container exits, so peak figures are read from here.
type runCgroup struct {
	rel string // path below each hierarchy's root, e.g. "/infradev/<id>"
	v2  bool
}

// isV2 reports whether the host uses the unified (v2-only) hierarchy.
func isV2() bool {
	_, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers"))
	return err == nil
}

// v1Controllers are the hybrid/v1 hierarchies whose figures are read.
var v1Controllers = []string{"memory", "cpuacct", "pids"}

func newRunCgroup(id string) (*runCgroup, error) {
	c := &runCgroup{rel: "/infradev/" + id, v2: isV2()}
	if c.v2 {
		top := filepath.Join(cgroupRoot, "infradev")
		if err := os.MkdirAll(top, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		// Controllers must be delegated at every level down to the container's cgroup.
		for _, d := range []string{cgroupRoot, top} {
			_ = os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0o644)
		}
		p := filepath.Join(cgroupRoot, c.rel)
		if err := os.Mkdir(p, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		if err := os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0o644); err != nil {
			c.remove()
			return nil, fmt.Errorf("cgroup: delegating controllers: %w", err)
		}
		return c, nil
	}
	for _, ctl := range v1Controllers {
		if err := os.MkdirAll(filepath.Join(cgroupRoot, ctl, c.rel), 0o755); err != nil {
			c.remove()
			return nil, fmt.Errorf("cgroup %s: %w", ctl, err)
		}
	}
	return c, nil
}

// childPath is the cgroupsPath for the runtime.
func (c *runCgroup) childPath() string { return c.rel + "/c" }

type usage struct {
	cpu        time.Duration
	peakMemory int64
}

func (c *runCgroup) read() (usage, error) {
	var u usage
	if c.v2 {
		p := filepath.Join(cgroupRoot, c.rel)
		peak, err := readInt(filepath.Join(p, "memory.peak"))
		if err != nil {
			return u, err
		}
		u.peakMemory = peak
		stat, err := os.ReadFile(filepath.Join(p, "cpu.stat"))
		if err != nil {
			return u, err
		}
		for _, line := range strings.Split(string(stat), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "usage_usec" {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				u.cpu = time.Duration(n) * time.Microsecond
			}
		}
		return u, nil
	}
	peak, err := readInt(filepath.Join(cgroupRoot, "memory", c.rel, "memory.max_usage_in_bytes"))
	if err != nil {
		return u, err
	}
	cpu, err := readInt(filepath.Join(cgroupRoot, "cpuacct", c.rel, "cpuacct.usage"))
	if err != nil {
		return u, err
	}
	u.peakMemory, u.cpu = peak, time.Duration(cpu)
	return u, nil
}

// remove deletes the run's cgroup in every hierarchy the runtime may have created it in,
// children first. Errors are ignored: a cgroup still busy is reported by the next run's setup.
func (c *runCgroup) remove() {
	var roots []string
	if c.v2 {
		roots = []string{cgroupRoot}
	} else {
		entries, _ := os.ReadDir(cgroupRoot)
		for _, e := range entries {
			roots = append(roots, filepath.Join(cgroupRoot, e.Name()))
		}
	}
	for _, r := range roots {
		_ = os.Remove(filepath.Join(r, c.childPath()))
		_ = os.Remove(filepath.Join(r, c.rel))
	}
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
