package image_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/internal/fixture"
	"github.com/infradev/infradev/harness/mirror"
)

// TestTaskRepositoryLayer builds a task image (an environment plus the upstream repository at
// the base commit, from a mirror) twice from empty stores: the same digest, a shallow
// repository at exactly the base commit, and the base's files.
func TestTaskRepositoryLayer(t *testing.T) {
	u := fixture.New(t)
	env, err := envspec.Load(newEnv(t))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := mirror.Parse(fixture.URL+"="+u.GitDir, "test")
	repo := image.TaskRepo{Name: "task-calc", URL: fixture.URL, Commit: u.Base, Dest: "/workspace/calc"}
	var manifests []string
	var last *image.Built
	var store string
	for i := 0; i < 2; i++ {
		store = t.TempDir()
		b, err := image.BuildTask(context.Background(), env, repo, image.Store{Dir: store}, image.Options{Mirrors: m})
		if err != nil {
			t.Fatal(err)
		}
		manifests, last = append(manifests, b.Manifest), b
	}
	if manifests[0] != manifests[1] {
		t.Fatalf("two clean builds of the task image: %s vs %s", manifests[0], manifests[1])
	}
	top := last.Layers[len(last.Layers)-1]
	files := layerEntries(t, filepath.Join(store, "oci", "blobs", "sha256", strings.TrimPrefix(top.Digest, "sha256:")))
	if got := strings.TrimSpace(files["workspace/calc/.git/HEAD"]); got != u.Base {
		t.Errorf(".git/HEAD = %q, want the base commit %s", got, u.Base)
	}
	if got := strings.TrimSpace(files["workspace/calc/.git/shallow"]); got != u.Base {
		t.Errorf(".git/shallow = %q, want the base commit", got)
	}
	if ops := files["workspace/calc/calc/ops.py"]; ops == "" || strings.Contains(ops, "def mul") {
		t.Errorf("calc/ops.py is not the base's: %q", ops)
	}
	for name := range files {
		if strings.Contains(name, ".git/logs") || strings.HasSuffix(name, ".git/index") {
			t.Errorf("%s in the layer: it varies from build to build", name)
		}
	}

	wrong, _ := mirror.Parse(fixture.URL+"="+t.TempDir(), "test")
	_, err = image.BuildTask(context.Background(), env, repo, image.Store{Dir: t.TempDir()}, image.Options{Mirrors: wrong})
	if !errors.Is(err, mirror.ErrNotFound) || !strings.Contains(err.Error(), u.Base) {
		t.Errorf("a mirror without the repository: %v", err)
	}
}
