package image_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/unpack"
)

// six 1.16.0's only wheel on PyPI; files on PyPI never change.
const sixWheel = "six==1.16.0 --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254 # six-1.16.0-py2.py3-none-any.whl"

// countingSandbox counts the runs that had the network.
type countingSandbox struct {
	sandbox.Sandbox
	network int
}

func (c *countingSandbox) Run(ctx context.Context, s sandbox.Spec) (*sandbox.Result, error) {
	if s.Network {
		c.network++
	}
	return c.Sandbox.Run(ctx, s)
}

// pipEnv writes environments/{demo -> the repository's demo, six} in a new directory: an
// environment that stacks a pip step on the demo image.
func pipEnv(t *testing.T, requirements string) string {
	t.Helper()
	envs := filepath.Join(t.TempDir(), "environments")
	os.MkdirAll(filepath.Join(envs, "six"), 0o755)
	if err := os.Symlink(filepath.Join(testenv.RepoRoot(t), "environments", "demo"), filepath.Join(envs, "demo")); err != nil {
		t.Fatal(err)
	}
	writeEnv(t, filepath.Join(envs, "six"), requirements)
	return filepath.Join(envs, "six")
}

func writeEnv(t *testing.T, dir, requirements string) {
	t.Helper()
	err := os.WriteFile(filepath.Join(dir, "env.yaml"), []byte(`schema: infradev.env/v1
name: six
from: demo
layers:
  - name: six
    pip:
      venv: /opt/venv
      requirements: [`+requirements+`]
      lock: six.lock
config:
  env:
    PATH: /opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin
`), 0o644)
	if err != nil {
		t.Fatal(err)
	}
}

// seededStore is a new store holding only the demo environment's layers (hard links to the
// shared store's blobs, and their step records): a pip step over the demo builds from nothing
// there (no wheels, no unpacked layers, no record of its own) without rebuilding Debian.
func seededStore(t *testing.T) image.Store {
	t.Helper()
	testenv.DemoImage(t)
	shared := image.Store{Dir: testenv.Store(t)}
	st := image.Store{Dir: t.TempDir()}
	plan, err := image.Plan(load(t, filepath.Join(testenv.RepoRoot(t), "environments", "demo")))
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(st.Layout(), "blobs", "sha256"), 0o755)
	os.MkdirAll(filepath.Join(st.Dir, "steps"), 0o755)
	for _, l := range plan {
		rec := strings.TrimPrefix(l.Key, "sha256:") + ".json"
		data, err := os.ReadFile(filepath.Join(shared.Dir, "steps", rec))
		if err != nil {
			t.Fatalf("the shared store lacks the demo's step %s: %v", l.Step, err)
		}
		os.WriteFile(filepath.Join(st.Dir, "steps", rec), data, 0o644)
		var digest string
		if i := strings.Index(string(data), `"sha256:`); i >= 0 {
			digest = string(data[i+8 : i+8+64])
		}
		src := filepath.Join(shared.Layout(), "blobs", "sha256", digest)
		dst := filepath.Join(st.Layout(), "blobs", "sha256", digest)
		if err := os.Link(src, dst); err != nil {
			blob, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(dst, blob, 0o644)
		}
	}
	return st
}

// sharedUnpack is the unpack cache the end-to-end tests share: layers unpacked there are
// checked against both digests, so sharing it changes nothing a build makes.
func sharedUnpack(t *testing.T) *unpack.Cache {
	return &unpack.Cache{Dir: filepath.Join(testenv.Cache(t), "unpacked")}
}

func requirePyPI(t *testing.T) {
	t.Helper()
	testenv.RequireSandbox(t)
	c, err := net.DialTimeout("tcp", "pypi.org:443", 10*time.Second)
	if err == nil {
		c.Close()
	}
	testenv.Require(t, err == nil, "PyPI (pip steps lock and download from it)")
}

// TestPipStepIsLockedReproducibleAndOffline locks a real package from PyPI over the demo image,
// builds the pip step from two empty stores (same layer digest), rebuilds it from the wheel
// store without the network, and imports the package in the built image.
func TestPipStepIsLockedReproducibleAndOffline(t *testing.T) {
	requirePyPI(t)
	ctx := context.Background()
	dir := pipEnv(t, `"six==1.16.0"`)
	env := load(t, dir)

	// Before the lock exists, building and planning name the file and the command.
	var missing *image.UnlockedError
	if _, err := image.Plan(env); !errors.As(err, &missing) || !strings.Contains(err.Error(), "six.lock does not exist: run `infradev env lock "+dir+"`") {
		t.Fatalf("Plan() without a lock: %v, want a UnlockedError naming six.lock and the command", err)
	}

	a := seededStore(t)
	var log bytes.Buffer
	if _, err := image.LockPip(ctx, env, a, image.Options{Log: &log, Unpack: sharedUnpack(t)}); err != nil {
		t.Fatalf("LockPip: %v\n%s", err, log.String())
	}
	lock, _ := os.ReadFile(filepath.Join(dir, "six.lock"))
	if lines := strings.Split(strings.TrimSpace(string(lock)), "\n"); len(lines) != 4 || lines[3] != sixWheel ||
		!strings.Contains(lines[0], "step six") || lines[2] != `# requirements: ["six==1.16.0"]` {
		t.Fatalf("six.lock:\n%s\nwant a header naming the step and requirements, then\n%s", lock, sixWheel)
	}

	buildIn := func(st image.Store) (*image.Built, *countingSandbox, string) {
		t.Helper()
		sb := &countingSandbox{Sandbox: &sandbox.Runc{StateDir: filepath.Join(st.Dir, "sandbox")}}
		var log bytes.Buffer
		b, err := image.Build(ctx, load(t, dir), st, image.Options{Log: &log, Sandbox: sb, Unpack: sharedUnpack(t)})
		if err != nil {
			t.Fatalf("Build: %v\n%s", err, log.String())
		}
		return b, sb, log.String()
	}
	first, sb, log1 := buildIn(a)
	if sb.network == 0 || !strings.Contains(log1, "1 to download") {
		t.Errorf("first build: %d network runs, log:\n%s\nwant the wheel downloaded", sb.network, log1)
	}
	pipLayer := first.Layers[len(first.Layers)-1]
	if pipLayer.Kind != "pip" || pipLayer.Cached {
		t.Fatalf("last layer %+v, want a pip layer built", pipLayer)
	}
	second, _, _ := buildIn(seededStore(t))
	if got := second.Layers[len(second.Layers)-1].Digest; got != pipLayer.Digest || second.Manifest != first.Manifest {
		t.Errorf("two builds from empty stores: pip layer %s vs %s, manifest %s vs %s", pipLayer.Digest, got, first.Manifest, second.Manifest)
	}

	// Rebuilding the step in the same store takes the wheel from the store: no network at all.
	os.Remove(filepath.Join(a.Dir, "steps", strings.TrimPrefix(pipLayer.Key, "sha256:")+".json"))
	again, sb, log3 := buildIn(a)
	if sb.network != 0 || !strings.Contains(log3, "1 in the wheel store, 0 to download") {
		t.Errorf("rebuild: %d network runs, log:\n%s\nwant nothing downloaded", sb.network, log3)
	}
	if got := again.Layers[len(again.Layers)-1]; got.Cached || got.Digest != pipLayer.Digest {
		t.Errorf("rebuild: %+v, want the same layer built again", got)
	}

	// The layer holds the package, a hash-based pyc, and nothing of pip's own.
	entries := layerEntries(t, filepath.Join(a.Layout(), "blobs", "sha256", strings.TrimPrefix(pipLayer.Digest, "sha256:")))
	pyc := entries["opt/venv/lib/python3.11/site-packages/__pycache__/six.cpython-311.pyc"]
	if len(pyc) < 16 || pyc[4] != 1 {
		t.Errorf("six's pyc missing or not an unchecked hash-based pyc (flags %v)", []byte(pyc[:min(len(pyc), 8)]))
	}
	for name := range entries {
		if !strings.HasPrefix(name, "opt/") {
			t.Errorf("the pip layer holds %s, outside the venv", name)
		}
	}

	// The package imports in the built image, without the network, from its pyc.
	lowers, _, err := sharedUnpack(t).Stack(ctx, a.Layout(), first.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	ov, err := sandbox.MountOverlay(lowers, filepath.Join(t.TempDir(), "run"), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ov.Unmount()
	var out bytes.Buffer
	res, err := (&sandbox.Runc{StateDir: filepath.Join(a.Dir, "sandbox")}).Run(ctx, sandbox.Spec{
		Root: ov.Merged, Env: []string{"PATH=/opt/venv/bin:/usr/bin:/bin"}, Stdout: &out, Stderr: &out,
		Args: []string{"python3", "-c", "import six, sys; print(six.__version__, sys.prefix, six.__spec__.cached)"},
	})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(out.String()) != "1.16.0 /opt/venv /opt/venv/lib/python3.11/site-packages/__pycache__/six.cpython-311.pyc" {
		t.Errorf("import six in the image: %v %+v\n%s", err, res, out.String())
	}
}

// TestPipStepRefusals: a lock whose hash the archive does not match, a lock that no longer
// fits env.yaml, and a corrupt archive in the wheel store.
func TestPipStepRefusals(t *testing.T) {
	requirePyPI(t)
	ctx := context.Background()
	dir := pipEnv(t, `"six==1.16.0"`)
	st := seededStore(t)
	lockFile := filepath.Join(dir, "six.lock")
	header := "# infradev pip lock: environment six, step six. Written by `infradev env lock`; do not edit.\n# venv: /opt/venv\n# requirements: [\"six==1.16.0\"]\n"
	buildErr := func() (string, error) {
		var log bytes.Buffer
		_, err := image.Build(ctx, load(t, dir), st, image.Options{Log: &log, Unpack: sharedUnpack(t)})
		return log.String(), err
	}

	// One hex digit off: pip refuses the archive, and the error names the package.
	os.WriteFile(lockFile, []byte(header+strings.Replace(sixWheel, "sha256:8abb", "sha256:0abb", 1)+"\n"), 0o644)
	if _, err := buildErr(); err == nil || !strings.Contains(err.Error(), "six==1.16.0") || !strings.Contains(err.Error(), "HASHES") {
		t.Errorf("build with a wrong hash: %v, want pip's hash refusal naming six==1.16.0", err)
	}

	// The right lock builds; a corrupt copy in the wheel store is fetched again.
	os.WriteFile(lockFile, []byte(header+sixWheel+"\n"), 0o644)
	if log, err := buildErr(); err != nil {
		t.Fatalf("build: %v\n%s", err, log)
	}
	wheel := filepath.Join(st.Dir, "wheels", "sha256", "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254", "six-1.16.0-py2.py3-none-any.whl")
	if err := os.WriteFile(wheel, []byte("not a wheel"), 0o644); err != nil {
		t.Fatal(err)
	}
	plan, _ := image.Plan(load(t, dir))
	os.Remove(filepath.Join(st.Dir, "steps", strings.TrimPrefix(plan[len(plan)-1].Key, "sha256:")+".json"))
	if log, err := buildErr(); err != nil || !strings.Contains(log, "is corrupt; fetching it again") {
		t.Errorf("build over a corrupt wheel store: %v\n%s\nwant the wheel fetched again", err, log)
	}

	// env.yaml asks for something else than the lock was resolved for.
	writeEnv(t, dir, `"six==1.17.0"`)
	if _, err := buildErr(); err == nil || !strings.Contains(err.Error(), `requirements ["six==1.16.0"]`) || !strings.Contains(err.Error(), "run `infradev env lock "+dir+"`") {
		t.Errorf("build with a stale lock: %v, want it to name the lock's requirements and the command", err)
	}
}

func TestPipLockFormatIsCheckedWithLines(t *testing.T) {
	data := "# venv: /opt/venv\n# requirements: [\"six\"]\nsix==1.16.0\nsix==1.16.0 --hash=sha256:" + strings.Repeat("a", 64) + " # six.whl\nsix==1.16.0 --hash=sha256:" + strings.Repeat("b", 64) + " # six2.whl\n"
	_, err := image.ParsePipLock("x.lock", []byte(data))
	for _, want := range []string{"x.lock:3: want `name==version --hash=sha256:<64 hex> # <file>`", "x.lock:5: six is pinned twice"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePipLock error lacks %q:\n%v", want, err)
		}
	}
	l := &image.PipLock{Env: "e", Step: "s", Venv: "/v", Requirements: []string{"b>=1", "a"}, Packages: []image.PipPackage{
		{Name: "b", Version: "2", SHA256: strings.Repeat("b", 64), File: "b-2-py3-none-any.whl"},
		{Name: "a", Version: "1", SHA256: strings.Repeat("a", 64), File: "a-1.tar.gz"},
	}}
	back, err := image.ParsePipLock("l", l.Format())
	if err != nil || back.Packages[0].Name != "a" || back.Packages[0].Wheel() || !back.Packages[1].Wheel() || back.Venv != "/v" || len(back.Requirements) != 2 || back.Step != "s" {
		t.Errorf("ParsePipLock(Format()) = %+v, %v; want the lock back, sorted by name", back, err)
	}
}

// TestPipLockChangesOnlyItsStepKey: the key of a pip step covers its lock's bytes; the steps
// below keep theirs.
func TestPipLockChangesOnlyItsStepKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "py")
	os.MkdirAll(filepath.Join(dir, "files"), 0o755)
	os.WriteFile(filepath.Join(dir, "files", "motd"), []byte("hi\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "env.yaml"), []byte(`schema: infradev.env/v1
name: py
layers:
  - {name: files, copy: {source: files, dest: /}}
  - {name: six, pip: {venv: /opt/venv, requirements: ["six==1.16.0"], lock: six.lock}}
  - {name: after, copy: {source: files, dest: /etc}}
`), 0o644)
	header := "# infradev pip lock: environment py, step six. Written by `infradev env lock`; do not edit.\n# venv: /opt/venv\n# requirements: [\"six==1.16.0\"]\n"
	os.WriteFile(filepath.Join(dir, "six.lock"), []byte(header+sixWheel+"\n"), 0o644)
	before, err := image.Plan(load(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "six.lock"), []byte(header+strings.Replace(sixWheel, "8abb", "9abb", 1)+"\n"), 0o644)
	after, err := image.Plan(load(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if before[0].Key != after[0].Key || before[1].Key == after[1].Key || before[2].Key == after[2].Key {
		t.Errorf("keys %v -> %v: want the step below unchanged, the pip step and those above changed", before, after)
	}
}

// TestPipStepBuildsASourceDistribution: a package PyPI has only as an sdist is locked by its
// archive's hash and built offline with the venv's setuptools, reproducibly; without
// setuptools, the lock is refused, naming the package.
func TestPipStepBuildsASourceDistribution(t *testing.T) {
	requirePyPI(t)
	ctx := context.Background()
	dir := pipEnv(t, `"six==1.16.0"`)
	write := func(reqs string) {
		os.WriteFile(filepath.Join(dir, "env.yaml"), []byte(`schema: infradev.env/v1
name: six
from: demo
layers:
  - {name: antlr, pip: {venv: /opt/venv, requirements: [`+reqs+`], lock: antlr.lock}}
`), 0o644)
	}
	st := seededStore(t)
	opts := func(log *bytes.Buffer) image.Options { return image.Options{Log: log, Unpack: sharedUnpack(t)} }

	write(`"antlr4-python3-runtime==4.9.3"`)
	var log bytes.Buffer
	if _, err := image.LockPip(ctx, load(t, dir), st, opts(&log)); err == nil || !strings.Contains(err.Error(), "antlr4-python3-runtime==4.9.3: only a source distribution") {
		t.Errorf("LockPip of an sdist without setuptools: %v, want a refusal naming the package", err)
	}

	write(`"antlr4-python3-runtime==4.9.3", "setuptools==75.8.0"`)
	locks, err := image.LockPip(ctx, load(t, dir), st, opts(&log))
	if err != nil {
		t.Fatalf("LockPip: %v\n%s", err, log.String())
	}
	if ps := locks[0].Packages; len(ps) != 2 || ps[0].Wheel() || ps[0].File != "antlr4-python3-runtime-4.9.3.tar.gz" || !ps[1].Wheel() {
		t.Fatalf("locked %+v, want the antlr4 sdist and the setuptools wheel", ps)
	}
	first, err := image.Build(ctx, load(t, dir), st, opts(&log))
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, log.String())
	}
	second, err := image.Build(ctx, load(t, dir), seededStore(t), opts(&log))
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, log.String())
	}
	a, b := first.Layers[len(first.Layers)-1], second.Layers[len(second.Layers)-1]
	if a.Digest != b.Digest {
		t.Errorf("the sdist's layer from two empty stores: %s vs %s", a.Digest, b.Digest)
	}
	entries := layerEntries(t, filepath.Join(st.Layout(), "blobs", "sha256", strings.TrimPrefix(a.Digest, "sha256:")))
	if _, ok := entries["opt/venv/lib/python3.11/site-packages/antlr4/__pycache__/Token.cpython-311.pyc"]; !ok {
		t.Errorf("the layer lacks antlr4's compiled modules")
	}
}
