// Package resultstore owns the content-addressed store of attempt results: one entry per key,
// the digest of everything that can change a verdict (task, environment, probes, patch,
// harness, hardware). A key is never a run id, so identical submissions, from any model or
// run, are graded once. Entries appear whole or not at all. Two backends: a directory
// (Store) and a Bazel HTTP remote cache shared with Bazel (HTTP).
package resultstore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/result"
)

// Backend stores run folders by key.
type Backend interface {
	// Get returns the stored result for key, if any.
	Get(key string) (*result.Result, bool)
	// Put stores the run folder src under key, keeping an existing entry.
	Put(key, src string) error
	// CopyOut writes the entry for key to dst relabelled as the result of id. Without a
	// usable entry it returns an error wrapping ErrNotStored: the attempt must run.
	CopyOut(key, dst string, id result.Identity) (*result.Result, error)
}

// ErrNotStored is wrapped by CopyOut's error when the store holds no usable entry for a key.
var ErrNotStored = errors.New("not in the results store")

// Open returns the backend a --results value names: "" none (nil), an http:// or https://
// URL a Bazel HTTP remote cache, anything else a directory.
func Open(spec string) (Backend, error) {
	switch {
	case spec == "":
		return nil, nil
	case strings.HasPrefix(spec, "http://") || strings.HasPrefix(spec, "https://"):
		h := HTTP{URL: spec}
		// A server that cannot be reached would turn every lookup into a miss and every
		// store into a lost result: say so now rather than run everything unshared.
		if err := h.Reachable(); err != nil {
			return nil, fault.Wrap(fault.Infra, fmt.Errorf("the results server %s cannot be reached: %w", spec, err))
		}
		return h, nil
	}
	return Store{Dir: spec}, nil
}

// Store is a directory of results by key.
type Store struct{ Dir string }

// Key is the store key of an attempt with these inputs.
func Key(in result.Inputs) string {
	data, _ := json.Marshal(in) // fixed field order: canonical
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Get returns the stored result for key, if any.
func (s Store) Get(key string) (*result.Result, bool) {
	if s.Dir == "" {
		return nil, false
	}
	r, err := result.Read(filepath.Join(s.Dir, key, "result.json"))
	return r, err == nil
}

// Put stores the run folder src under key (copied, then renamed into place). An existing
// entry is kept.
func (s Store) Put(key, src string) error {
	if s.Dir == "" {
		return nil
	}
	final := filepath.Join(s.Dir, key)
	if _, err := os.Stat(final); err == nil {
		return nil
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.Dir, ".put-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := copyTree(src, tmp); err != nil {
		return fmt.Errorf("storing result %s: %w", key, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(final); serr == nil {
			return nil // stored meanwhile by another process
		}
		return err
	}
	return nil
}

// CopyOut writes the stored entry for key to dst relabelled as the result of id: the
// folder is copied whole, then renamed into place.
func (s Store) CopyOut(key, dst string, id result.Identity) (*result.Result, error) {
	src := filepath.Join(s.Dir, key)
	if _, ok := s.Get(key); !ok {
		return nil, fmt.Errorf("result %s: %w", key, ErrNotStored)
	}
	tmp := dst + ".tmp"
	os.RemoveAll(tmp)
	if err := copyTree(src, tmp); err != nil {
		return nil, err
	}
	return finishCopy(tmp, dst, id)
}

// finishCopy records id in the copied folder tmp and renames it to dst.
func finishCopy(tmp, dst string, id result.Identity) (*result.Result, error) {
	r, err := result.Read(filepath.Join(tmp, "result.json"))
	if err != nil {
		return nil, err
	}
	r.SetIdentity(id)
	if err := result.Write(filepath.Join(tmp, "result.json"), r); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dst); err != nil {
		return nil, err
	}
	return r, os.Rename(tmp, dst)
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return atomicfile.Copy(p, target)
	})
}
