// Package image owns building environments into content-addressed OCI images. Every image lives
// in one OCI image layout inside a Store, so a layer shared by many images is stored once.
// Each layer is keyed by its parent's key and its step's definition and inputs; a rebuild
// runs only the steps whose key changed.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/gofrs/flock"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/mirror"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/unpack"
)

// RefAnnotation is the OCI annotation that names an image in the layout.
const RefAnnotation = "org.opencontainers.image.ref.name"

// Store is a directory holding the OCI layout (oci/), the step cache (steps/) and scratch
// space (tmp/). Several processes may share one Store.
type Store struct{ Dir string }

// Layout is the path of the store's OCI image layout.
func (s Store) Layout() string { return filepath.Join(s.Dir, "oci") }

func (s Store) stepsDir() string { return filepath.Join(s.Dir, "steps") }
func (s Store) tmpDir() string   { return filepath.Join(s.Dir, "tmp") }

// wheelsDir is the wheel store: every archive a pip step installs, by digest
// (sha256/<hex>/<file name>), kept across builds so a rebuild downloads nothing.
func (s Store) wheelsDir() string { return filepath.Join(s.Dir, "wheels") }

// Built is the outcome of a build.
type Built struct {
	Name     string       `json:"name"`
	Manifest string       `json:"manifest"` // "sha256:<hex>" of the image manifest
	Layers   []BuiltLayer `json:"layers"`
}

// BuiltLayer is one layer of a built image.
type BuiltLayer struct {
	Step   string `json:"step"`
	Kind   string `json:"kind"`
	Key    string `json:"key"`
	Digest string `json:"digest"`
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"`
	Cached bool   `json:"cached"`
}

// Options tune Build. The zero value logs nothing and checks no lock.
type Options struct {
	// Log receives one line per step saying whether it ran or was cached. Default: discarded.
	Log io.Writer
	// Locked, when set, makes Build fail at the first layer whose step or bytes differ from
	// the lock, naming it, and at a manifest that differs.
	Locked *Lock
	// Unpack holds unpacked layers for run steps. Default: the store's unpacked/ directory.
	Unpack *unpack.Cache
	// Sandbox runs run steps. Default: runc with its state under the store.
	Sandbox sandbox.Sandbox
	// Wheels is the wheel store pip steps install from (archives by digest). Default: the
	// store's wheels/ directory.
	Wheels string
	// Mirrors resolve the repositories of git url steps without the network; a repository
	// the map has no entry for is fetched from its URL.
	Mirrors mirror.Map
}

// Build builds env into the store and names it env.Name in the layout. Concurrent builds
// into one store are serialised by a file lock; the second finds every step cached.
func Build(ctx context.Context, env *envspec.Env, st Store, o Options) (*Built, error) {
	b, unlock, err := openBuilder(env, st, o)
	if err != nil {
		return nil, err
	}
	defer unlock()
	out := &Built{Name: env.Name}
	bls, layers, err := b.layers(ctx, len(env.Layers), o.Locked)
	if err != nil {
		return nil, err
	}
	out.Layers = bls
	if o.Locked != nil && len(o.Locked.Layers) != len(out.Layers) {
		return nil, fmt.Errorf("environment %s is not as locked: %d layers, %s has %d", env.Name, len(out.Layers), LockFile, len(o.Locked.Layers))
	}
	img, err := assemble(env, layers)
	if err != nil {
		return nil, fmt.Errorf("environment %s: assembling image: %w", env.Name, err)
	}
	digest, err := putImage(b.st.Layout(), img, env.Name)
	if err != nil {
		return nil, fmt.Errorf("environment %s: writing image: %w", env.Name, err)
	}
	out.Manifest = digest
	if o.Locked != nil && o.Locked.Manifest != digest {
		return nil, fmt.Errorf("environment %s is not as locked: manifest %s, %s has %s", env.Name, digest, LockFile, o.Locked.Manifest)
	}
	fmt.Fprintf(b.log, "image %s %s\n", env.Name, out.Manifest)
	return out, nil
}

// openBuilder prepares the store, takes its lock (unlock releases it) and fills in o's
// defaults.
func openBuilder(env *envspec.Env, st Store, o Options) (b *builder, unlock func(), err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	// Sandboxes are given paths under the store: the runtime resolves them from elsewhere.
	if abs, err := filepath.Abs(st.Dir); err == nil {
		st.Dir = abs
	}
	for _, d := range []string{st.Dir, st.stepsDir(), st.tmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, nil, fmt.Errorf("preparing store: %w", err)
		}
	}
	lock := flock.New(filepath.Join(st.Dir, "lock"))
	if err := lock.Lock(); err != nil {
		return nil, nil, fmt.Errorf("locking store %s: %w", st.Dir, err)
	}
	if err := initLayout(st.Layout()); err != nil {
		lock.Unlock()
		return nil, nil, fmt.Errorf("preparing OCI layout %s: %w", st.Layout(), err)
	}
	b = &builder{env: env, st: st, log: o.Log, unpack: o.Unpack, sandbox: o.Sandbox, mirrors: o.Mirrors, wheels: o.Wheels}
	if b.unpack == nil {
		b.unpack = &unpack.Cache{Dir: filepath.Join(st.Dir, "unpacked")}
	}
	if b.sandbox == nil {
		b.sandbox = &sandbox.Runc{StateDir: filepath.Join(st.Dir, "sandbox")}
	}
	if b.wheels == "" {
		b.wheels = st.wheelsDir()
	}
	return b, func() { lock.Unlock() }, nil
}

// layers builds the first n steps of the environment, or finds them cached, in order; with
// locked set it fails at the first layer that differs from the lock.
func (b *builder) layers(ctx context.Context, n int, locked *Lock) ([]BuiltLayer, []v1.Layer, error) {
	var out []BuiltLayer
	var layers []v1.Layer
	parentKey := ""
	for i, step := range b.env.Layers[:n] {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		key, err := b.key(parentKey, step)
		if err != nil {
			return nil, nil, fmt.Errorf("environment %s, layer %s: %w", b.env.Name, step.Name, err)
		}
		var bls []BuiltLayer
		var ls []v1.Layer
		if step.Image != nil {
			bls, ls, err = b.baseImage(ctx, key, step)
		} else {
			var bl BuiltLayer
			var l v1.Layer
			bl, l, err = b.layer(ctx, i, key, step)
			bls, ls = []BuiltLayer{bl}, []v1.Layer{l}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("environment %s, layer %s (%s): %w", b.env.Name, step.Name, step.Kind(), err)
		}
		for j, bl := range bls {
			state := "built"
			if bl.Cached {
				state = "cached"
			}
			fmt.Fprintf(b.log, "layer %d/%d %-12s %-6s %s %s %s\n", i+1, len(b.env.Layers), bl.Step, step.Kind(), state, short(bl.Digest), sizeText(bl.Size))
			if locked != nil {
				if err := locked.checkLayer(len(out), bl); err != nil {
					return nil, nil, fmt.Errorf("environment %s is not as locked: %w", b.env.Name, err)
				}
			}
			out = append(out, bl)
			layers = append(layers, ls[j])
		}
		parentKey = key
	}
	return out, layers, nil
}

type builder struct {
	env     *envspec.Env
	st      Store
	log     io.Writer
	unpack  *unpack.Cache
	sandbox sandbox.Sandbox
	mirrors mirror.Map
	wheels  string
	// built layers of this build, by index, for steps that read their parents (apt).
	done []BuiltLayer
}

// key is the digest of the parent's key, the step's canonical definition and its inputs.
func (b *builder) key(parent string, s envspec.Step) (string, error) {
	def, err := json.Marshal(s) // struct field order is fixed: canonical for these types
	if err != nil {
		return "", err
	}
	h := sha256.New()
	// v2: Debian layers are built with a fixed tool environment (toolEnv). v3: a hard link
	// never points outside its layer (a link to a lower layer is written as a file).
	fmt.Fprintf(h, "infradev.step/v3\nparent %s\nstep %s\n", parent, def)
	if s.Pip != nil {
		// The lock is what the layer is made of: any change to it rebuilds exactly this step.
		_, data, err := ReadPipLock(s)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "lock sha256:%x\n", sha256.Sum256(data))
	}
	var src string
	switch {
	case s.Git != nil:
		src = s.Git.Source
	case s.Copy != nil:
		src = s.Copy.Source
	}
	if src != "" {
		td, err := digest.Tree(s.Source(src))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "source %s\n", td)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

type stepRecord struct {
	Digest string `json:"digest"`
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"`
}

func (b *builder) layer(ctx context.Context, i int, key string, s envspec.Step) (BuiltLayer, v1.Layer, error) {
	bl := BuiltLayer{Step: s.Name, Kind: s.Kind(), Key: key}
	recPath := filepath.Join(b.st.stepsDir(), hexOf(key)+".json")
	if data, err := os.ReadFile(recPath); err == nil {
		var rec stepRecord
		if json.Unmarshal(data, &rec) == nil {
			if l, err := b.blobLayer(rec); err == nil {
				bl.Digest, bl.DiffID, bl.Size, bl.Cached = rec.Digest, rec.DiffID, rec.Size, true
				b.done = append(b.done, bl)
				return bl, l, nil
			}
		}
	}
	tmp, err := os.MkdirTemp(b.st.tmpDir(), "step-")
	if err != nil {
		return bl, nil, err
	}
	defer os.RemoveAll(tmp)
	info, err := b.step(ctx, i, s, tmp)
	if err != nil {
		return bl, nil, err
	}
	// The layer becomes a blob by rename: a crash never leaves a partial blob under its digest.
	blob := b.blobPath(info.Digest)
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return bl, nil, err
	}
	if err := os.Rename(info.Path, blob); err != nil {
		return bl, nil, err
	}
	rec := stepRecord{Digest: info.Digest, DiffID: info.DiffID, Size: info.Size}
	if err := atomicfile.WriteJSON(recPath, rec); err != nil {
		return bl, nil, err
	}
	l, err := b.blobLayer(rec)
	if err != nil {
		return bl, nil, err
	}
	bl.Digest, bl.DiffID, bl.Size = rec.Digest, rec.DiffID, rec.Size
	b.done = append(b.done, bl)
	return bl, l, nil
}

func (b *builder) blobPath(digest string) string { return blobPath(b.st.Layout(), digest) }

// blobLayer is a layer backed by a blob already in the layout.
func (b *builder) blobLayer(rec stepRecord) (v1.Layer, error) {
	return b.blobLayerIn(b.st.Layout(), rec)
}

func (b *builder) blobLayerIn(layoutDir string, rec stepRecord) (v1.Layer, error) {
	path := blobPath(layoutDir, rec.Digest)
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Size() != rec.Size {
		return nil, fmt.Errorf("blob %s has %d bytes, want %d", rec.Digest, fi.Size(), rec.Size)
	}
	d, err := v1.NewHash(rec.Digest)
	if err != nil {
		return nil, err
	}
	diff, err := v1.NewHash(rec.DiffID)
	if err != nil {
		return nil, err
	}
	return partial.CompressedToLayer(&fileLayer{path: path, digest: d, diffID: diff, size: rec.Size})
}

// assemble makes the image: OCI media types, a fixed creation time, one history entry a layer.
func assemble(env *envspec.Env, layers []v1.Layer) (v1.Image, error) {
	arch := "amd64"
	if env.Layers[0].Debian != nil {
		arch = env.Layers[0].Debian.Architecture
	}
	created := v1.Time{Time: time.Unix(0, 0).UTC()}
	if env.Layers[0].Debian != nil {
		created = v1.Time{Time: time.Unix(env.Layers[0].Debian.SourceDateEpoch, 0).UTC()}
	}
	var envList []string
	keys := make([]string, 0, len(env.Config.Env))
	for k := range env.Config.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		envList = append(envList, k+"="+env.Config.Env[k])
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      created,
		Config:       v1.Config{Env: envList, WorkingDir: env.Config.WorkingDir},
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{
			Layer:     l,
			MediaType: types.OCILayer,
			History:   v1.History{Created: created, CreatedBy: "infradev " + env.Layers[i].Kind() + " " + env.Layers[i].Name},
		}
	}
	img, err = mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, created)
}

// fileLayer is a compressed layer in a file whose digests are already known.
type fileLayer struct {
	path           string
	digest, diffID v1.Hash
	size           int64
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return types.OCILayer, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }
func (l *fileLayer) Descriptor() (*v1.Descriptor, error) {
	return &v1.Descriptor{MediaType: types.OCILayer, Size: l.size, Digest: l.digest}, nil
}

func hexOf(digest string) string {
	if len(digest) > 7 && digest[:7] == "sha256:" {
		return digest[7:]
	}
	return digest
}

func short(digest string) string {
	h := hexOf(digest)
	if len(h) > 12 {
		h = h[:12]
	}
	return "sha256:" + h
}

func sizeText(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
