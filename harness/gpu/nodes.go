package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/infradev/infradev/harness/sandbox"
)

// Passthrough is what a sandbox needs to use some GPUs: their device nodes and the driver's
// control nodes, the driver's libraries and utilities (read-only), and environment.
type Passthrough struct {
	Devices []sandbox.Device
	Mounts  []sandbox.Mount
	Env     []string
}

// Nodes supplies the device nodes of GPUs by index.
type Nodes interface {
	Passthrough(indices []int) (Passthrough, error)
}

// HostNodes passes the host's NVIDIA devices through as the NVIDIA container toolkit does:
// /dev/nvidia<minor> for each leased GPU, /dev/nvidiactl and /dev/nvidia-uvm(-tools), and the
// driver's user-space libraries and utilities bound read-only.
type HostNodes struct {
	Machine *Machine
	// Dev is the host's device directory. Default /dev.
	Dev string
	// LibDirs are searched for the driver's libraries. Default: Debian's and the usual others.
	LibDirs []string
}

// driverLibs are the libraries a CUDA program and nvidia-smi load from the driver.
var driverLibs = []string{"libcuda.so*", "libnvidia-ml.so*", "libnvidia-ptxjitcompiler.so*", "libnvidia-nvvm.so*", "libcudadebugger.so*"}

// Passthrough implements Nodes.
func (h HostNodes) Passthrough(indices []int) (Passthrough, error) {
	dev := h.Dev
	if dev == "" {
		dev = "/dev"
	}
	var p Passthrough
	add := func(name string, required bool) error {
		d, err := charDevice(filepath.Join(dev, name))
		if err != nil {
			if required {
				return err
			}
			return nil
		}
		d.Path = "/dev/" + name
		p.Devices = append(p.Devices, d)
		return nil
	}
	for _, i := range indices {
		if i < 0 || i >= len(h.Machine.Devices) {
			return p, fmt.Errorf("GPU %d does not exist", i)
		}
		if err := add("nvidia"+strconv.Itoa(h.Machine.Devices[i].Minor), true); err != nil {
			return p, fmt.Errorf("GPU %d: %w", i, err)
		}
	}
	if err := add("nvidiactl", true); err != nil {
		return p, err
	}
	add("nvidia-uvm", false)
	add("nvidia-uvm-tools", false)
	dirs := h.LibDirs
	if dirs == nil {
		dirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"}
	}
	seen := map[string]bool{}
	for _, d := range dirs {
		for _, pat := range driverLibs {
			matches, _ := filepath.Glob(filepath.Join(d, pat))
			sort.Strings(matches)
			for _, m := range matches {
				if real, err := filepath.EvalSymlinks(m); err == nil && !seen[m] {
					seen[m] = true
					p.Mounts = append(p.Mounts, sandbox.Mount{Source: real, Dest: m, ReadOnly: true})
				}
			}
		}
	}
	for _, tool := range []string{"/usr/bin/nvidia-smi"} {
		if _, err := os.Stat(tool); err == nil {
			p.Mounts = append(p.Mounts, sandbox.Mount{Source: tool, Dest: tool, ReadOnly: true})
		}
	}
	p.Env = Visibility(indices)
	return p, nil
}

// FakeNodes is a set of stand-in GPU device nodes for machines without GPUs: real character
// devices (with /dev/null's numbers, 1:3) under Dir, so that the whole lease-and-run path,
// device cgroup included, runs in CI.
type FakeNodes struct {
	Dir string
	N   int
}

// Create makes the fake nodes nvidia0..N-1 and nvidiactl.
func (f FakeNodes) Create() error {
	if err := os.MkdirAll(f.Dir, 0o755); err != nil {
		return err
	}
	names := []string{"nvidiactl"}
	for i := 0; i < f.N; i++ {
		names = append(names, "nvidia"+strconv.Itoa(i))
	}
	for _, n := range names {
		p := filepath.Join(f.Dir, n)
		os.Remove(p)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			return fmt.Errorf("fake GPU node %s: %w", p, err)
		}
	}
	return nil
}

// Passthrough implements Nodes for the fake set (minor number = index).
func (f FakeNodes) Passthrough(indices []int) (Passthrough, error) {
	m := &Machine{}
	for i := 0; i < f.N; i++ {
		m.Devices = append(m.Devices, Device{Index: i, Minor: i})
	}
	return HostNodes{Machine: m, Dev: f.Dir, LibDirs: []string{}}.Passthrough(indices)
}

// Visibility is the environment of a sandbox given the GPUs with these host indices: inside,
// CUDA numbers the visible devices from 0; NVIDIA_VISIBLE_DEVICES names the host's indices.
func Visibility(indices []int) []string {
	local, host := "", ""
	for i, x := range indices {
		if i > 0 {
			local, host = local+",", host+","
		}
		local += strconv.Itoa(i)
		host += strconv.Itoa(x)
	}
	return []string{"CUDA_VISIBLE_DEVICES=" + local, "NVIDIA_VISIBLE_DEVICES=" + host}
}

func charDevice(path string) (sandbox.Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return sandbox.Device{}, fmt.Errorf("%s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return sandbox.Device{}, fmt.Errorf("%s is not a character device", path)
	}
	return sandbox.Device{Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev))}, nil
}
