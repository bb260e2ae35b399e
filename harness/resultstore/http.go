package resultstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	repb "github.com/bazelbuild/remote-apis/build/bazel/remote/execution/v2"
	"google.golang.org/protobuf/proto"

	"github.com/infradev/infradev/harness/result"
)

// HTTP is a results store on a Bazel HTTP remote cache: the server Bazel itself uses with
// --remote_cache=http://... (nginx with WebDAV, bazel-remote, ...), so task targets under
// `bazel test` and `infradev eval` share one cache. A result is an action result at
// /ac/<key> (a REAPI ActionResult message, as Bazel writes them) whose output files are the
// run folder's files, each stored by content at /cas/<sha256>.
type HTTP struct {
	// URL is the cache's base URL, e.g. http://cache.example:8080 (a path prefix is kept).
	URL string
	// Client makes the requests; default: a client with a 5-minute timeout.
	Client *http.Client
}

func (h HTTP) client() *http.Client {
	if h.Client != nil {
		return h.Client
	}
	return &http.Client{Timeout: 5 * time.Minute}
}

// Reachable asks the server for an action result that cannot exist: any HTTP answer means it
// is there (a cache answers 404); a transport error or a 5xx means it is not.
func (h HTTP) Reachable() error {
	c := *h.client()
	c.Timeout = 30 * time.Second
	resp, err := c.Get(h.url("ac", strings.Repeat("0", 64)))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		return fmt.Errorf("GET %s: %s", h.url("ac", strings.Repeat("0", 64)), resp.Status)
	}
	return nil
}

func (h HTTP) url(kind, hash string) string {
	return strings.TrimSuffix(h.URL, "/") + "/" + kind + "/" + hash
}

func (h HTTP) get(kind, hash string) ([]byte, bool, error) {
	resp, err := h.client().Get(h.url(kind, hash))
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		data, err := io.ReadAll(resp.Body)
		return data, err == nil, err
	case http.StatusNotFound:
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("GET %s: %s", h.url(kind, hash), resp.Status)
}

func (h HTTP) put(ctx context.Context, kind, hash string, data []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, h.url(kind, hash), bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.ContentLength = int64(len(data))
	resp, err := h.client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT %s: %s", h.url(kind, hash), resp.Status)
	}
	return nil
}

// actionResult reads the entry for key; ok is false when there is none.
func (h HTTP) actionResult(key string) (*repb.ActionResult, bool, error) {
	data, ok, err := h.get("ac", key)
	if err != nil || !ok {
		return nil, false, err
	}
	var ar repb.ActionResult
	if err := proto.Unmarshal(data, &ar); err != nil {
		return nil, false, fmt.Errorf("ac/%s: %w", key, err)
	}
	return &ar, true, nil
}

// blob fetches a CAS blob and checks it against its digest.
func (h HTTP) blob(d *repb.Digest) ([]byte, error) {
	data, ok, err := h.get("cas", d.GetHash())
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	if !ok || hex.EncodeToString(sum[:]) != d.GetHash() || int64(len(data)) != d.GetSizeBytes() {
		return nil, fmt.Errorf("cas/%s: missing or corrupt: %w", d.GetHash(), ErrNotStored)
	}
	return data, nil
}

// Get returns the stored result for key, if any. A cache that cannot be reached or holds a
// broken entry counts as a miss: the attempt runs again.
func (h HTTP) Get(key string) (*result.Result, bool) {
	ar, ok, err := h.actionResult(key)
	if err != nil || !ok {
		return nil, false
	}
	for _, f := range ar.GetOutputFiles() {
		if f.GetPath() == "result.json" {
			data, err := h.blob(f.GetDigest())
			if err != nil {
				return nil, false
			}
			r, err := result.Parse(data)
			return r, err == nil
		}
	}
	return nil, false
}

// Put stores the run folder src under key: every file to the CAS, then the action result.
// An existing entry is kept.
func (h HTTP) Put(key, src string) error {
	if _, ok, err := h.actionResult(key); err != nil {
		return err
	} else if ok {
		return nil
	}
	ctx := context.Background()
	ar := &repb.ActionResult{ExitCode: 0}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		hash := hex.EncodeToString(sum[:])
		if err := h.put(ctx, "cas", hash, data); err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		ar.OutputFiles = append(ar.OutputFiles, &repb.OutputFile{Path: filepath.ToSlash(rel),
			Digest: &repb.Digest{Hash: hash, SizeBytes: int64(len(data))}, IsExecutable: fi.Mode()&0o111 != 0})
		return nil
	})
	if err != nil {
		return fmt.Errorf("storing result %s: %w", key, err)
	}
	data, err := proto.Marshal(ar)
	if err != nil {
		return err
	}
	return h.put(ctx, "ac", key, data)
}

// CopyOut writes the stored entry for key to dst relabelled as the result of id: every
// file fetched and checked, then the folder renamed into place. A cache that cannot be reached,
// or a missing or corrupt blob, is a miss (ErrNotStored); an entry naming a path outside the run
// folder is an error.
func (h HTTP) CopyOut(key, dst string, id result.Identity) (*result.Result, error) {
	ar, ok, err := h.actionResult(key)
	if err != nil {
		return nil, fmt.Errorf("result %s: %v: %w", key, err, ErrNotStored)
	}
	if !ok {
		return nil, fmt.Errorf("result %s: %w (%s)", key, ErrNotStored, h.URL)
	}
	tmp := dst + ".tmp"
	os.RemoveAll(tmp)
	for _, f := range ar.GetOutputFiles() {
		if !filepath.IsLocal(f.GetPath()) {
			return nil, fmt.Errorf("result %s: output path %q leaves the run folder", key, f.GetPath())
		}
		data, err := h.blob(f.GetDigest())
		if err != nil {
			return nil, err
		}
		target := filepath.Join(tmp, filepath.FromSlash(f.GetPath()))
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return nil, err
		}
		mode := os.FileMode(0o644)
		if f.GetIsExecutable() {
			mode = 0o755
		}
		if err := os.WriteFile(target, data, mode); err != nil {
			return nil, err
		}
	}
	return finishCopy(tmp, dst, id)
}
