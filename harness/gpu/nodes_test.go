package gpu_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/sandbox"
)

// TestLeasedGPUIsTheOnlyOneInside runs a real sandbox with GPU 2 of a fake 4-GPU device set:
// inside, only /dev/nvidia2 (and the control node) exist, it can be opened, and CUDA's
// numbering starts at 0.
func TestLeasedGPUIsTheOnlyOneInside(t *testing.T) {
	testenv.RequireSandbox(t)
	bb, err := os.ReadFile("/bin/busybox")
	testenv.Require(t, err == nil, "busybox-static")
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "work"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "bin", "busybox"), bb, 0o755)
	os.Symlink("busybox", filepath.Join(root, "bin", "sh"))
	fake := gpu.FakeNodes{Dir: filepath.Join(t.TempDir(), "dev"), N: 4}
	if err := fake.Create(); err != nil {
		t.Fatal(err)
	}
	p, err := fake.Passthrough([]int{2})
	if err != nil {
		t.Fatal(err)
	}
	ov, err := sandbox.MountOverlay([]string{root}, filepath.Join(t.TempDir(), "ov"), 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ov.Unmount()
	var out bytes.Buffer
	res, err := (&sandbox.Runc{StateDir: t.TempDir()}).Run(context.Background(), sandbox.Spec{
		Root: ov.Merged, Args: []string{"/bin/sh", "-c", "/bin/busybox ls /dev | /bin/busybox grep nvidia; echo x > /dev/nvidia2 && echo open-ok; echo $CUDA_VISIBLE_DEVICES/$NVIDIA_VISIBLE_DEVICES"},
		Env: append([]string{"PATH=/bin"}, p.Env...), Devices: p.Devices, Stdout: &out, Stderr: &out,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("run: %v, exit %v\n%s", err, res, out.String())
	}
	got := strings.Fields(out.String())
	want := []string{"nvidia2", "nvidiactl", "open-ok", "0/2"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("inside the sandbox: %q, want %q", got, want)
	}
}

func TestHostNodesNeedTheDevices(t *testing.T) {
	_, err := gpu.HostNodes{Machine: &gpu.Machine{Devices: []gpu.Device{{Index: 0, Minor: 0}}}, Dev: t.TempDir()}.Passthrough([]int{0})
	if err == nil || !strings.Contains(err.Error(), "nvidia0") {
		t.Errorf("pass-through without device nodes: %v, want an error naming nvidia0", err)
	}
}
