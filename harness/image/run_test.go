package image_test

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/testenv"
)

// layerEntries reads a gzipped layer blob: entry name (without a leading "./") -> contents.
func layerEntries(t *testing.T, blob string) map[string]string {
	t.Helper()
	f, err := os.Open(blob)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		out[strings.TrimPrefix(h.Name, "./")] = string(body)
	}
}

// TestRunStepLayerIsWhatTheCommandChanged runs a real command in the sandbox over a busybox
// base and checks the layer holds its additions and its deletion as a whiteout.
func TestRunStepLayerIsWhatTheCommandChanged(t *testing.T) {
	testenv.Require(t, os.Geteuid() == 0, "root (run steps use runc and overlayfs)")
	_, err := exec.LookPath("runc")
	testenv.Require(t, err == nil, "runc")
	root := filepath.Join(t.TempDir(), "busy")
	base := filepath.Join(root, "base")
	for _, d := range []string{"bin", "etc", "tmp"} {
		os.MkdirAll(filepath.Join(base, d), 0o755)
	}
	bb, err := os.ReadFile("/bin/busybox")
	testenv.Require(t, err == nil, "busybox-static")
	os.WriteFile(filepath.Join(base, "bin", "busybox"), bb, 0o755)
	os.Symlink("busybox", filepath.Join(base, "bin", "sh"))
	os.WriteFile(filepath.Join(base, "etc", "motd"), []byte("old\n"), 0o644)
	os.WriteFile(filepath.Join(root, "env.yaml"), []byte(`schema: infradev.env/v1
name: busy
layers:
  - name: base
    copy: {source: base, dest: /}
  - name: change
    run:
      command: [/bin/sh, -c, "/bin/busybox mkdir -p /opt && echo hi > /opt/x && /bin/busybox rm /etc/motd"]
config: {env: {PATH: /bin}}
`), 0o644)
	store := t.TempDir()
	b, log := build(t, root, store)
	if !strings.Contains(log, "change       run    built") {
		t.Fatalf("log:\n%s", log)
	}
	got := layerEntries(t, filepath.Join(store, "oci", "blobs", "sha256", strings.TrimPrefix(b.Layers[1].Digest, "sha256:")))
	if got["opt/x"] != "hi\n" {
		t.Errorf("run layer lacks opt/x: %v", keys(got))
	}
	if _, ok := got["etc/.wh.motd"]; !ok {
		t.Errorf("run layer lacks the whiteout etc/.wh.motd: %v", keys(got))
	}
	if _, ok := got["bin/busybox"]; ok {
		t.Errorf("run layer copies unchanged files from below")
	}
	// A second clean build gives the same bytes: times are normalised.
	again, _ := build(t, root, t.TempDir())
	if again.Layers[1].Digest != b.Layers[1].Digest {
		t.Errorf("run layer not reproducible: %s vs %s", b.Layers[1].Digest, again.Layers[1].Digest)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
