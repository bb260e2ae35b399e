package image_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/unpack"
)

func load(t *testing.T, dir string) *envspec.Env {
	t.Helper()
	env, err := envspec.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestLockedNamesTheChangedLayer(t *testing.T) {
	envDir := newEnv(t)
	store := image.Store{Dir: t.TempDir()}
	b, _ := build(t, envDir, store.Dir)
	lock := image.LockOf(b)
	if _, err := image.Build(context.Background(), load(t, envDir), store, image.Options{Locked: lock}); err != nil {
		t.Fatalf("unchanged build with --locked: %v", err)
	}
	os.WriteFile(filepath.Join(envDir, "proj", "pkg", "mod.py"), []byte("X = 3\n"), 0o644)
	_, err := image.Build(context.Background(), load(t, envDir), store, image.Options{Locked: lock})
	if err == nil || !strings.Contains(err.Error(), "layer proj: its step changed") {
		t.Errorf("changed step with --locked: error = %v, want it to name layer proj", err)
	}
	// A step whose key is unchanged but whose bytes differ is named too.
	lock.Layers[0].Digest = "sha256:" + strings.Repeat("0", 64)
	_, err = image.Build(context.Background(), load(t, envDir), image.Store{Dir: t.TempDir()}, image.Options{Locked: lock})
	if err == nil || !strings.Contains(err.Error(), "layer files: built") {
		t.Errorf("different bytes with --locked: error = %v, want it to name layer files", err)
	}
}

func TestVerifyAndUnpackRefuseACorruptBlob(t *testing.T) {
	envDir := newEnv(t)
	store := image.Store{Dir: t.TempDir()}
	b, _ := build(t, envDir, store.Dir)
	lock := image.LockOf(b)
	if err := image.Verify(context.Background(), store.Layout(), "tiny", lock); err != nil {
		t.Fatalf("Verify() of an intact image: %v", err)
	}
	blob := filepath.Join(store.Layout(), "blobs", "sha256", strings.TrimPrefix(b.Layers[1].Digest, "sha256:"))
	data, _ := os.ReadFile(blob)
	data[len(data)/2] ^= 0xff
	os.WriteFile(blob, data, 0o644)
	err := image.Verify(context.Background(), store.Layout(), "tiny", lock)
	if err == nil || !strings.Contains(err.Error(), "layer proj") || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("Verify() after corrupting a blob: %v, want it to name layer proj as corrupt", err)
	}
	cache := unpack.Cache{Dir: t.TempDir()}
	if _, _, err := cache.Stack(context.Background(), store.Layout(), b.Manifest); err == nil {
		t.Errorf("the unpack cache accepted a corrupt layer: it must never reach a run")
	}
}

func TestGCRemovesWhatNoImageReferences(t *testing.T) {
	envDir := newEnv(t)
	store := image.Store{Dir: t.TempDir()}
	first, _ := build(t, envDir, store.Dir)
	os.WriteFile(filepath.Join(envDir, "proj", "pkg", "mod.py"), []byte("X = 4\n"), 0o644)
	second, _ := build(t, envDir, store.Dir)
	n, _, err := image.GC(store)
	if err != nil {
		t.Fatal(err)
	}
	// The old proj layer, the old config and the old manifest.
	if n != 3 {
		t.Errorf("GC removed %d blobs, want 3", n)
	}
	if _, err := os.Stat(filepath.Join(store.Layout(), "blobs", "sha256", strings.TrimPrefix(first.Layers[1].Digest, "sha256:"))); err == nil {
		t.Errorf("the unreferenced layer is still there")
	}
	if err := image.Verify(context.Background(), store.Layout(), "tiny", image.LockOf(second)); err != nil {
		t.Errorf("the named image is damaged after GC: %v", err)
	}
	// The step cache does not claim the removed layer: going back rebuilds it.
	os.WriteFile(filepath.Join(envDir, "proj", "pkg", "mod.py"), []byte("X = 1\n"), 0o644)
	again, log := build(t, envDir, store.Dir)
	if !strings.Contains(log, "proj         git    built") || again.Layers[1].Digest != first.Layers[1].Digest {
		t.Errorf("after GC, rebuilding the old source: log\n%s", log)
	}
}

func TestConcurrentBuildsBuildOnce(t *testing.T) {
	envDir := newEnv(t)
	store := t.TempDir()
	var wg sync.WaitGroup
	logs := make([]string, 2)
	digests := make([]string, 2)
	for i := range logs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, log := build(t, envDir, store)
			logs[i], digests[i] = log, b.Manifest
		}()
	}
	wg.Wait()
	if digests[0] != digests[1] {
		t.Errorf("concurrent builds gave %s and %s", digests[0], digests[1])
	}
	if built := strings.Count(logs[0]+logs[1], " built "); built != 2 {
		t.Errorf("each of the 2 layers must be built once across both builds; logs:\n%s\n%s", logs[0], logs[1])
	}
}

func TestPushPullRoundTrip(t *testing.T) {
	envDir := newEnv(t)
	src := image.Store{Dir: t.TempDir()}
	b, _ := build(t, envDir, src.Dir)
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	ref := u.Host + "/infradev/tiny:v1"
	pushed, err := image.Push(context.Background(), src, "tiny", ref)
	if err != nil {
		t.Fatal(err)
	}
	dst := image.Store{Dir: t.TempDir()}
	pulled, err := image.Pull(context.Background(), dst, ref, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	if pushed != b.Manifest || pulled != b.Manifest {
		t.Errorf("built %s, pushed %s, pulled %s: want one digest", b.Manifest, pushed, pulled)
	}
	if err := image.Verify(context.Background(), dst.Layout(), "tiny", image.LockOf(b)); err != nil {
		t.Errorf("the pulled image does not verify against the lock: %v", err)
	}
	byDigest, err := image.Pull(context.Background(), image.Store{Dir: t.TempDir()}, u.Host+"/infradev/tiny@"+b.Manifest, "tiny")
	if err != nil || byDigest != b.Manifest {
		t.Errorf("pull by digest: %s, %v", byDigest, err)
	}
}

func TestPlanKeysAreBuildKeys(t *testing.T) {
	envDir := newEnv(t)
	plan, err := image.Plan(load(t, envDir))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := build(t, envDir, t.TempDir())
	for i := range plan {
		if plan[i].Key != b.Layers[i].Key {
			t.Errorf("layer %s: plan key %s, build key %s", plan[i].Step, plan[i].Key, b.Layers[i].Key)
		}
	}
}

// TestKilledBuildLeavesAUsableLayout kills `infradev env build` (SIGKILL) while it writes a
// large layer: the layout stays valid, no blob is partial, and the same command finishes it.
func TestKilledBuildLeavesAUsableLayout(t *testing.T) {
	envDir := newEnv(t)
	big := make([]byte, 96<<20)
	rand.Read(big)
	os.WriteFile(filepath.Join(envDir, "files", "big.bin"), big, 0o644)
	bin := filepath.Join(t.TempDir(), "infradev")
	gobuild := exec.Command("go", "build", "-o", bin, "./harness/cmd/infradev")
	gobuild.Dir = testenv.RepoRoot(t)
	if out, err := gobuild.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	store := t.TempDir()
	cmd := exec.Command(bin, "--store", store, "env", "build", envDir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		tmps, _ := filepath.Glob(filepath.Join(store, "tmp", "step-*", ".layer-*.tmp"))
		if len(tmps) > 0 {
			if fi, err := os.Stat(tmps[0]); err == nil && fi.Size() > 1<<20 {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the build never started writing its large layer")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	layout := filepath.Join(store, "oci")
	if _, err := os.ReadFile(filepath.Join(layout, "index.json")); err != nil {
		t.Fatalf("index.json after the kill: %v", err)
	}
	blobs, _ := filepath.Glob(filepath.Join(layout, "blobs", "sha256", "*"))
	for _, p := range blobs {
		data, _ := os.ReadFile(p)
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != filepath.Base(p) {
			t.Errorf("blob %s is partial or corrupt after the kill", filepath.Base(p))
		}
	}
	out, err := exec.Command(bin, "--store", store, "env", "build", envDir).CombinedOutput()
	if err != nil {
		t.Fatalf("rerun after the kill: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("image tiny sha256:")) {
		t.Errorf("rerun output:\n%s", out)
	}
	if err := image.Verify(context.Background(), layout, "tiny", nil); err != nil {
		t.Errorf("the finished image does not verify: %v", err)
	}
}
