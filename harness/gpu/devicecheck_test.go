//go:build gpu

// The device check: run by tools/gpu-check/run on a machine with NVIDIA GPUs and their
// driver. It is behind the gpu build tag because it needs real hardware.

package gpu_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/lease"
	"github.com/infradev/infradev/harness/sandbox"
)

// rootFor makes a minimal root filesystem holding prog and the shared libraries it links.
func rootFor(t *testing.T, prog string) string {
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	copyFile := func(src, dst string) {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(prog, filepath.Join(root, "bin", "cuda_alloc"))
	out, err := exec.Command("ldd", prog).Output()
	if err != nil {
		t.Fatal(err)
	}
	// libcuda's own needs are glibc's; bring those that the program does not link itself.
	libs := []string{"/lib/x86_64-linux-gnu/libm.so.6", "/lib/x86_64-linux-gnu/librt.so.1", "/lib/x86_64-linux-gnu/libpthread.so.0"}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				libs = append(libs, f)
			}
		}
	}
	for _, l := range libs {
		if real, err := filepath.EvalSymlinks(l); err == nil {
			copyFile(real, filepath.Join(root, l))
		}
	}
	return root
}

func TestDeviceCheck(t *testing.T) {
	prog := os.Getenv("INFRADEV_CUDA_ALLOC")
	if prog == "" {
		t.Fatal("INFRADEV_CUDA_ALLOC must name the built tools/gpu-check/cuda_alloc")
	}
	lib := nvml.New()
	m, err := gpu.Discover(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Shutdown()
	for _, d := range m.Devices {
		h, _ := gpu.CheckHealth(lib, d.Index)
		t.Logf("GPU %d %s %s %.0f GiB compute %s minor %d health %+v", d.Index, d.UUID, d.Name, float64(d.MemoryBytes)/(1<<30), d.Compute, d.Minor, h)
	}
	l, err := lease.Acquire(context.Background(), t.TempDir(), m, lease.Request{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	t.Logf("leased GPU %v", l.Indices)
	pt, err := gpu.HostNodes{Machine: m}.Passthrough(l.Indices)
	if err != nil {
		t.Fatal(err)
	}
	root := rootFor(t, prog)
	run := func(mib int) (uint64, string) {
		ov, err := sandbox.MountOverlay([]string{root}, filepath.Join(t.TempDir(), "ov"), 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		defer ov.Unmount()
		var out bytes.Buffer
		s := gpu.Sample(lib, l.Indices, 20*time.Millisecond)
		res, err := (&sandbox.Runc{StateDir: t.TempDir()}).Run(context.Background(), sandbox.Spec{
			Root: ov.Merged, Args: []string{"/bin/cuda_alloc", fmt.Sprint(mib), "2"},
			Env: append([]string{"PATH=/bin"}, pt.Env...), Devices: pt.Devices, Mounts: pt.Mounts,
			Stdout: &out, Stderr: &out, Timeout: time.Minute,
		})
		peak := s.Stop()
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("cuda_alloc %d: %v %+v\n%s", mib, err, res, out.String())
		}
		return peak, out.String()
	}
	ctxOnly, out0 := run(0)
	if !strings.Contains(out0, "visible_gpus=1") {
		t.Errorf("the sandbox must see exactly its leased GPU:\n%s", out0)
	}
	const mib = 2048
	withAlloc, out1 := run(mib)
	got := float64(withAlloc-ctxOnly) / (1 << 20)
	t.Logf("meter: context only %.0f MiB, with %d MiB allocated %.0f MiB: allocation read as %.0f MiB\n%s",
		float64(ctxOnly)/(1<<20), mib, float64(withAlloc)/(1<<20), got, out1)
	if math.Abs(got-mib)/mib > 0.05 {
		t.Errorf("the meter read %.0f MiB for a %d MiB allocation: more than 5%% off", got, mib)
	}
}
