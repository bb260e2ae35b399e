package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gofrs/flock"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/envspec"
)

// LockSchema is the schema version of env.lock.
const LockSchema = "infradev.envlock/v1"

// LockFile is the lock file's name inside an environment's directory.
const LockFile = "env.lock"

// Lock pins an environment to exact bytes: every layer's step key and digests, and the
// manifest digest.
type Lock struct {
	Schema   string        `json:"schema"`
	Name     string        `json:"name"`
	Manifest string        `json:"manifest"`
	Layers   []LockedLayer `json:"layers"`
}

// LockedLayer is one pinned layer.
type LockedLayer struct {
	Step   string `json:"step"`
	Key    string `json:"key"`
	Digest string `json:"digest"`
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"`
}

// LockOf is the lock of a built image.
func LockOf(b *Built) *Lock {
	l := &Lock{Schema: LockSchema, Name: b.Name, Manifest: b.Manifest}
	for _, bl := range b.Layers {
		l.Layers = append(l.Layers, LockedLayer{Step: bl.Step, Key: bl.Key, Digest: bl.Digest, DiffID: bl.DiffID, Size: bl.Size})
	}
	return l
}

// ReadLock reads env.lock from an environment directory; nil, nil when there is none.
func ReadLock(envDir string) (*Lock, error) {
	p := filepath.Join(envDir, LockFile)
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var l Lock
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if l.Schema != LockSchema {
		return nil, fmt.Errorf("%s: schema %q, want %q", p, l.Schema, LockSchema)
	}
	return &l, nil
}

// WriteLock writes env.lock atomically.
func WriteLock(envDir string, l *Lock) error {
	return atomicfile.WriteJSON(filepath.Join(envDir, LockFile), l)
}

// checkLayer reports how a built layer differs from the lock, naming the layer.
func (l *Lock) checkLayer(i int, bl BuiltLayer) error {
	if i >= len(l.Layers) {
		return fmt.Errorf("layer %s is not in %s (the lock has %d layers)", bl.Step, LockFile, len(l.Layers))
	}
	want := l.Layers[i]
	switch {
	case want.Step != bl.Step:
		return fmt.Errorf("layer %d is %s, but %s has %s there", i+1, bl.Step, LockFile, want.Step)
	case want.Key != bl.Key:
		return fmt.Errorf("layer %s: its step changed (key %s, %s has %s)", bl.Step, short(bl.Key), LockFile, short(want.Key))
	case want.Digest != bl.Digest:
		return fmt.Errorf("layer %s: built %s, %s has %s: the step no longer gives the same bytes", bl.Step, short(bl.Digest), LockFile, short(want.Digest))
	}
	return nil
}

// Verify re-hashes every blob of the image named name in the layout (manifest, config, and
// each layer both compressed and uncompressed) and, if lock is not nil, checks the image is
// the locked one. It returns every problem found.
func Verify(ctx context.Context, layoutDir, name string, lock *Lock) error {
	manifest, err := Resolve(layoutDir, name)
	if err != nil {
		return err
	}
	var problems []string
	if lock != nil && lock.Manifest != manifest {
		problems = append(problems, fmt.Sprintf("image %s is %s, %s has %s", name, manifest, LockFile, lock.Manifest))
	}
	raw, err := rehash(layoutDir, manifest)
	if err != nil {
		return err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("manifest %s: %w", manifest, err)
	}
	cfgRaw, err := rehash(layoutDir, m.Config.Digest.String())
	if err != nil {
		problems = append(problems, err.Error())
	}
	var cfg *v1.ConfigFile
	if cfgRaw != nil {
		if cfg, err = v1.ParseConfigFile(bytes.NewReader(cfgRaw)); err != nil {
			problems = append(problems, fmt.Sprintf("config: %v", err))
		}
	}
	for i, l := range m.Layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		diffID := ""
		if cfg != nil && i < len(cfg.RootFS.DiffIDs) {
			diffID = cfg.RootFS.DiffIDs[i].String()
		}
		if err := verifyLayer(layoutDir, l.Digest.String(), diffID); err != nil {
			step := fmt.Sprintf("layer %d", i+1)
			if lock != nil && i < len(lock.Layers) {
				step = "layer " + lock.Layers[i].Step
			}
			problems = append(problems, step+": "+err.Error())
		}
		if lock != nil && i < len(lock.Layers) && lock.Layers[i].Digest != l.Digest.String() {
			problems = append(problems, fmt.Sprintf("layer %s is %s, %s has %s", lock.Layers[i].Step, l.Digest, LockFile, lock.Layers[i].Digest))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// rehash reads a small blob and checks it against its digest.
func rehash(layoutDir, digest string) ([]byte, error) {
	data, err := os.ReadFile(blobPath(layoutDir, digest))
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", digest, err)
	}
	if got := sha256.Sum256(data); "sha256:"+hex.EncodeToString(got[:]) != digest {
		return nil, fmt.Errorf("blob %s is corrupt (sha256:%x)", digest, got)
	}
	return data, nil
}

func verifyLayer(layoutDir, digest, diffID string) error {
	f, err := os.Open(blobPath(layoutDir, digest))
	if err != nil {
		return err
	}
	defer f.Close()
	comp, diff := sha256.New(), sha256.New()
	zr, err := gzip.NewReader(io.TeeReader(f, comp))
	if err != nil {
		return fmt.Errorf("blob %s is corrupt: %w", digest, err)
	}
	if _, err := io.Copy(diff, zr); err != nil {
		return fmt.Errorf("blob %s is corrupt: %w", digest, err)
	}
	if _, err := io.Copy(comp, f); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(comp.Sum(nil)); got != digest {
		return fmt.Errorf("blob %s is corrupt (its bytes hash to %s)", digest, got)
	}
	if got := "sha256:" + hex.EncodeToString(diff.Sum(nil)); diffID != "" && got != diffID {
		return fmt.Errorf("blob %s is corrupt (uncompressed %s, config says %s)", digest, got, diffID)
	}
	return nil
}

// GC removes every blob that no image named in the layout references, and leftover temporary
// files, under the store's lock. It returns the number of files and bytes removed.
func GC(st Store) (files int, freed int64, err error) {
	lock := flock.New(filepath.Join(st.Dir, "lock"))
	if err := lock.Lock(); err != nil {
		return 0, 0, err
	}
	defer lock.Unlock()
	dir := st.Layout()
	idx, err := readIndex(dir)
	if err != nil {
		return 0, 0, err
	}
	keep := map[string]bool{}
	for _, desc := range idx.Manifests {
		keep[desc.Digest.Hex] = true
		raw, err := os.ReadFile(blobPath(dir, desc.Digest.String()))
		if err != nil {
			return 0, 0, fmt.Errorf("manifest %s: %w", desc.Digest, err)
		}
		m, err := v1.ParseManifest(bytes.NewReader(raw))
		if err != nil {
			return 0, 0, fmt.Errorf("manifest %s: %w", desc.Digest, err)
		}
		keep[m.Config.Digest.Hex] = true
		for _, l := range m.Layers {
			keep[l.Digest.Hex] = true
		}
	}
	entries, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
	if err != nil {
		return 0, 0, err
	}
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		p := filepath.Join(dir, "blobs", "sha256", e.Name())
		if fi, err := e.Info(); err == nil {
			freed += fi.Size()
		}
		if err := os.Remove(p); err != nil {
			return files, freed, err
		}
		files++
	}
	// Step records whose blob is gone are dropped too, so they cannot claim a cache hit.
	recs, _ := filepath.Glob(filepath.Join(st.stepsDir(), "*.json"))
	for _, r := range recs {
		data, err := os.ReadFile(r)
		var rec stepRecord
		if err != nil || json.Unmarshal(data, &rec) != nil || !keep[hexOf(rec.Digest)] {
			os.Remove(r)
		}
	}
	return files, freed, os.RemoveAll(st.tmpDir())
}

// Plan computes every layer's step key without building anything: what `env build` would
// look up in the step cache.
func Plan(env *envspec.Env) ([]BuiltLayer, error) {
	b := &builder{env: env}
	var out []BuiltLayer
	parent := ""
	for _, s := range env.Layers {
		key, err := b.key(parent, s)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", s.Name, err)
		}
		out = append(out, BuiltLayer{Step: s.Name, Kind: s.Kind(), Key: key})
		parent = key
	}
	return out, nil
}

// Describe lists an image's layers (digest, diff id, size) from the layout.
func Describe(layoutDir, manifest string) (*Built, error) {
	raw, err := rehash(layoutDir, manifest)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	out := &Built{Manifest: manifest}
	for _, l := range m.Layers {
		out.Layers = append(out.Layers, BuiltLayer{Digest: l.Digest.String(), Size: l.Size})
	}
	return out, nil
}
