package image_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/internal/testenv"
)

// newEnv writes an environment of copy and git steps (no Debian: fast and offline).
func newEnv(t *testing.T) string {
	t.Helper()
	_, err := exec.LookPath("git")
	testenv.Require(t, err == nil, "git")
	root := filepath.Join(t.TempDir(), "tiny")
	write := func(rel, body string, mode os.FileMode) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("files/etc/motd", "hello\n", 0o644)
	write("proj/pkg/mod.py", "X = 1\n", 0o644)
	write("proj/run.sh", "#!/bin/sh\n", 0o755)
	write("env.yaml", `schema: infradev.env/v1
name: tiny
layers:
  - name: files
    copy: {source: files, dest: /}
  - name: proj
    git: {source: proj, dest: /workspace/proj, date: "2024-01-01T00:00:00Z", message: base, author: "A <a@example.com>"}
config: {workdir: /workspace, env: {PATH: /bin}}
`, 0o644)
	return root
}

func build(t *testing.T, envDir, store string) (*image.Built, string) {
	t.Helper()
	env, err := envspec.Load(envDir)
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	b, err := image.Build(context.Background(), env, image.Store{Dir: store}, image.Options{Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	return b, log.String()
}

func TestBuildIsReproducibleAndValid(t *testing.T) {
	envDir := newEnv(t)
	a, _ := build(t, envDir, t.TempDir())
	// Touch every source file: times must not reach the digests.
	later := time.Now().Add(time.Hour)
	filepath.Walk(envDir, func(p string, _ os.FileInfo, _ error) error { return os.Chtimes(p, later, later) })
	b, _ := build(t, envDir, t.TempDir())
	if a.Manifest != b.Manifest {
		t.Fatalf("two clean builds: manifest %s vs %s", a.Manifest, b.Manifest)
	}

	store := t.TempDir()
	built, _ := build(t, envDir, store)
	p, err := layout.FromPath(image.Store{Dir: store}.Layout())
	if err != nil {
		t.Fatal(err)
	}
	h, _ := v1.NewHash(built.Manifest)
	img, err := p.Image(h)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("go-containerregistry's validate.Image: %v", err)
	}
	m, _ := img.Manifest()
	if m.MediaType != "application/vnd.oci.image.manifest.v1+json" || len(m.Layers) != 2 {
		t.Errorf("manifest media type %s with %d layers; want OCI with 2", m.MediaType, len(m.Layers))
	}
}

func TestRebuildRunsOnlyChangedSteps(t *testing.T) {
	envDir := newEnv(t)
	store := t.TempDir()
	first, log := build(t, envDir, store)
	if strings.Count(log, " built ") != 2 {
		t.Fatalf("first build log:\n%s\nwant 2 layers built", log)
	}
	_, log = build(t, envDir, store)
	if strings.Count(log, " cached ") != 2 {
		t.Fatalf("unchanged rebuild log:\n%s\nwant 2 layers cached", log)
	}
	os.WriteFile(filepath.Join(envDir, "proj", "pkg", "mod.py"), []byte("X = 2\n"), 0o644)
	second, log := build(t, envDir, store)
	if !strings.Contains(log, "files        copy   cached") || !strings.Contains(log, "proj         git    built") {
		t.Fatalf("after changing proj, log:\n%s\nwant files cached and proj built", log)
	}
	if first.Layers[0].Digest != second.Layers[0].Digest || first.Layers[1].Digest == second.Layers[1].Digest {
		t.Errorf("layer digests: %v -> %v; want only the proj layer to change", first.Layers, second.Layers)
	}
	// The layout names one image per environment, the newest.
	idx, _ := os.ReadFile(filepath.Join(store, "oci", "index.json"))
	if c := strings.Count(string(idx), `"org.opencontainers.image.ref.name": "tiny"`); c != 1 {
		t.Errorf("index.json names tiny %d times, want 1:\n%s", c, idx)
	}
}

func TestGitLayerIsAPlainRepository(t *testing.T) {
	envDir := newEnv(t)
	store := t.TempDir()
	b, _ := build(t, envDir, store)
	blob := filepath.Join(store, "oci", "blobs", "sha256", strings.TrimPrefix(b.Layers[1].Digest, "sha256:"))
	out, err := exec.Command("tar", "xzf", blob, "-O", "workspace/proj/.git/config").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "worktree") || strings.Contains(string(out), envDir) {
		t.Errorf(".git/config mentions the host tree:\n%s", out)
	}
	list, _ := exec.Command("tar", "tzvf", blob).Output()
	if strings.Contains(string(list), ".git/index") {
		t.Errorf("the layer holds .git/index (inode numbers and times)")
	}
	if !strings.Contains(string(list), "-rwxr-xr-x 0/0") || !strings.Contains(string(list), "workspace/proj/run.sh") {
		t.Errorf("run.sh should keep its execute bit, root-owned:\n%s", list)
	}
}

// With $INFRADEV_DOCKER_ARCHIVES set, every image written is also saved once as a
// docker-archive holding the same config and layers.
func TestImagesAreSavedAsDockerArchives(t *testing.T) {
	envDir := newEnv(t)
	archives := t.TempDir()
	t.Setenv(image.ArchivesEnv, archives)
	store := t.TempDir()
	built, _ := build(t, envDir, store)
	h, _ := v1.NewHash(built.Manifest)
	path := filepath.Join(archives, h.Hex+".tar")
	tag, _ := name.NewTag("infradev/tiny:" + h.Hex[:12])
	saved, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatalf("reading the saved archive: %v", err)
	}
	p, _ := layout.FromPath(image.Store{Dir: store}.Layout())
	orig, _ := p.Image(h)
	wantCfg, _ := orig.ConfigName()
	gotCfg, err := saved.ConfigName()
	if err != nil || gotCfg != wantCfg {
		t.Errorf("archive config %v (%v); want %v", gotCfg, err, wantCfg)
	}
	wantLayers, _ := orig.Layers()
	gotLayers, _ := saved.Layers()
	if len(gotLayers) != len(wantLayers) {
		t.Fatalf("archive has %d layers; want %d", len(gotLayers), len(wantLayers))
	}
	for i := range wantLayers {
		w, _ := wantLayers[i].Digest()
		g, _ := gotLayers[i].Digest()
		if w != g {
			t.Errorf("layer %d: archive %s; want %s", i, g, w)
		}
	}
	// Built again (the steps cached): the archive is kept, not written again.
	before, _ := os.Stat(path)
	old := before.ModTime().Add(-time.Hour)
	os.Chtimes(path, old, old)
	build(t, envDir, store)
	after, _ := os.Stat(path)
	if !after.ModTime().Equal(old) {
		t.Error("the archive of an unchanged image was written again")
	}
	entries, _ := os.ReadDir(archives)
	if len(entries) != 1 {
		t.Errorf("archives folder holds %d entries; want the one archive (no temporary files)", len(entries))
	}

	// A folder that cannot be written fails the build, naming the variable.
	t.Setenv(image.ArchivesEnv, filepath.Join(path, "not-a-dir"))
	env, _ := envspec.Load(envDir)
	_, err = image.Build(context.Background(), env, image.Store{Dir: t.TempDir()}, image.Options{})
	if err == nil || !strings.Contains(err.Error(), image.ArchivesEnv) {
		t.Errorf("build into an unwritable archives folder: %v; want an error naming $%s", err, image.ArchivesEnv)
	}
}
