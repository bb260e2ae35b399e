// Package testenv owns what the end-to-end tests share: the checks that the machine can run
// sandboxes, the repository root, and the demo environment built once into a store kept under
// .infradev/ (as tools/demo uses), so the Debian layers are built once across packages and runs.
package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/unpack"
)

// RequireSandbox skips where attempts cannot run (not root; runc, mmdebstrap or git missing),
// except under CI, where that is a failure: CI installs all of them.
func RequireSandbox(t testing.TB) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, bin := range []string{"runc", "mmdebstrap", "git"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("end-to-end tests need %s", strings.Join(missing, ", "))
	}
	t.Skipf("end-to-end tests need %s", strings.Join(missing, ", "))
}

// Require skips the test when ok is false (why says what is missing), except under CI, which
// installs every prerequisite: there it fails.
func Require(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("prerequisite missing: %s", why)
	}
	t.Skipf("prerequisite missing: %s", why)
}

// RepoRoot is the monorepo root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Store and Cache are the shared image store and local cache directories.
func Store(t testing.TB) string {
	if s := os.Getenv("INFRADEV_TEST_STORE"); s != "" {
		return s
	}
	return filepath.Join(RepoRoot(t), ".infradev", "store")
}

// Cache is the shared unpack cache and sandbox state directory.
func Cache(t testing.TB) string { return filepath.Join(RepoRoot(t), ".infradev", "cache") }

var (
	demoOnce  sync.Once
	demoImage string
	demoErr   error
)

// DemoImage builds (or finds built) the demo environment and returns its manifest digest.
func DemoImage(t testing.TB) string {
	t.Helper()
	RequireSandbox(t)
	demoOnce.Do(func() {
		env, err := envspec.Load(filepath.Join(RepoRoot(t), "environments", "demo"))
		if err != nil {
			demoErr = err
			return
		}
		b, err := image.Build(context.Background(), env, image.Store{Dir: Store(t)}, image.Options{})
		if err != nil {
			demoErr = err
			return
		}
		demoImage = b.Manifest
	})
	if demoErr != nil {
		t.Fatal(demoErr)
	}
	return demoImage
}

// Task loads a task of the repository and its probes, e.g. Task(t, "demo", "minitron-0001").
func Task(t testing.TB, project, id string) (*task.Task, *probe.Set) {
	t.Helper()
	root := RepoRoot(t)
	tk, err := task.Load(filepath.Join(root, "tasks", project, id))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := probe.Load(filepath.Join(root, "probes", project, id), tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	return tk, ps
}

// Runner is a runner on the shared cache with the given sandbox (nil: runc).
func Runner(t testing.TB, sb sandbox.Sandbox) *runner.Runner {
	t.Helper()
	cache := Cache(t)
	if sb == nil {
		sb = &sandbox.Runc{StateDir: filepath.Join(cache, "sandbox")}
	}
	return &runner.Runner{Sandbox: sb, Cache: unpack.Cache{Dir: filepath.Join(cache, "unpacked")},
		Scratch: t.TempDir(), Harness: "infradev/test"}
}

// Inputs are the inputs of an attempt of tk on the demo image with patch.
func Inputs(t testing.TB, tk *task.Task, ps *probe.Set, patch []byte) runner.Inputs {
	return runner.Inputs{Task: tk, Probes: ps, Layout: filepath.Join(Store(t), "oci"), Image: DemoImage(t), Patch: patch}
}
