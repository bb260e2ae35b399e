package resultstore_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	repb "github.com/bazelbuild/remote-apis/build/bazel/remote/execution/v2"
	"google.golang.org/protobuf/proto"

	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/resultstore"
)

// cacheServer serves Bazel's HTTP remote cache protocol from memory: GET and PUT of
// /ac/<sha256> and /cas/<sha256>, 404 for what it does not hold.
type cacheServer struct {
	mu    sync.Mutex
	blobs map[string][]byte
}

var pathRe = regexp.MustCompile(`^/(ac|cas)/[0-9a-f]{64}$`)

func (c *cacheServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !pathRe.MatchString(r.URL.Path) {
		http.NotFound(w, r)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		data, ok := c.blobs[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(data)
	case http.MethodPut:
		data, _ := io.ReadAll(r.Body)
		c.blobs[r.URL.Path] = data
		w.WriteHeader(http.StatusCreated)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func runFolder(t *testing.T) (string, string) {
	t.Helper()
	dir := t.TempDir()
	r := &result.Result{Schema: result.Schema, InstanceID: "t-1", Model: "m", Resolved: true,
		Inputs: result.Inputs{Task: "sha256:aa", Patch: "sha256:bb"}}
	if err := result.Write(filepath.Join(dir, "result.json"), r); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "logs"), 0o755)
	os.WriteFile(filepath.Join(dir, "logs", "tests.log"), []byte("3 passed\n"), 0o644)
	return dir, resultstore.Key(r.Inputs)
}

func TestHTTPStoreRoundTrip(t *testing.T) {
	srv := &cacheServer{blobs: map[string][]byte{}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	store, err := resultstore.Open(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := store.(resultstore.HTTP); !ok {
		t.Fatalf("Open(%s) = %T, want HTTP", ts.URL, store)
	}
	src, key := runFolder(t)
	if _, ok := store.Get(key); ok {
		t.Fatal("Get on an empty cache found a result")
	}
	if _, err := store.CopyOut(key, filepath.Join(t.TempDir(), "run"), result.Identity{Model: "m", InstanceID: "t-1"}); !errors.Is(err, resultstore.ErrNotStored) {
		t.Fatalf("CopyOut on an empty cache: %v, want ErrNotStored", err)
	}
	if err := store.Put(key, src); err != nil {
		t.Fatal(err)
	}
	// The entry is a REAPI ActionResult whose files are in the CAS by content.
	var ar repb.ActionResult
	if err := proto.Unmarshal(srv.blobs["/ac/"+key], &ar); err != nil || len(ar.OutputFiles) != 2 {
		t.Fatalf("ac/%s: %v, %d output files; want an ActionResult with 2", key, err, len(ar.OutputFiles))
	}
	for _, f := range ar.OutputFiles {
		sum := sha256.Sum256(srv.blobs["/cas/"+f.Digest.Hash])
		if hex.EncodeToString(sum[:]) != f.Digest.Hash {
			t.Errorf("%s: cas blob does not match its digest", f.Path)
		}
	}
	r, ok := store.Get(key)
	if !ok || !r.Resolved || r.InstanceID != "t-1" {
		t.Fatalf("Get = %+v, %v", r, ok)
	}
	dst := filepath.Join(t.TempDir(), "run")
	got, err := store.CopyOut(key, dst, result.Identity{Model: "other-model", InstanceID: "t-1"})
	if err != nil || got.Model != "other-model" {
		t.Fatalf("CopyOut = %+v, %v", got, err)
	}
	if log, _ := os.ReadFile(filepath.Join(dst, "logs", "tests.log")); string(log) != "3 passed\n" {
		t.Errorf("copied log = %q", log)
	}
	if r, err := result.Read(filepath.Join(dst, "result.json")); err != nil || r.Model != "other-model" {
		t.Errorf("copied result.json: %+v, %v", r, err)
	}
}

func TestHTTPStoreRefusesBrokenEntries(t *testing.T) {
	srv := &cacheServer{blobs: map[string][]byte{}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	store := resultstore.HTTP{URL: ts.URL}
	src, key := runFolder(t)
	if err := store.Put(key, src); err != nil {
		t.Fatal(err)
	}
	// A corrupt blob is a miss for Get and an error for CopyOut.
	for path, data := range srv.blobs {
		if strings.HasPrefix(path, "/cas/") {
			srv.blobs[path] = append(data, 'x')
		}
	}
	if _, ok := store.Get(key); ok {
		t.Error("Get accepted a corrupt result.json blob")
	}
	if _, err := store.CopyOut(key, filepath.Join(t.TempDir(), "run"), result.Identity{Model: "m", InstanceID: "t-1"}); !errors.Is(err, resultstore.ErrNotStored) || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("CopyOut of a corrupt entry: %v, want a miss naming the corrupt blob", err)
	}
	// An entry naming a path outside the run folder is refused.
	bad, _ := proto.Marshal(&repb.ActionResult{OutputFiles: []*repb.OutputFile{{Path: "../escape", Digest: &repb.Digest{Hash: strings.Repeat("0", 64)}}}})
	srv.blobs["/ac/"+key] = bad
	if _, err := store.CopyOut(key, filepath.Join(t.TempDir(), "run"), result.Identity{Model: "m", InstanceID: "t-1"}); err == nil || errors.Is(err, resultstore.ErrNotStored) || !strings.Contains(err.Error(), "leaves the run folder") {
		t.Errorf("CopyOut of ../escape: %v, want an error that is not a mere miss", err)
	}
	// A server that cannot be reached is a miss, and Put says why.
	ts.Close()
	if _, ok := store.Get(key); ok {
		t.Error("Get from a closed server found a result")
	}
	if _, err := store.CopyOut(key, filepath.Join(t.TempDir(), "run"), result.Identity{Model: "m", InstanceID: "t-1"}); !errors.Is(err, resultstore.ErrNotStored) {
		t.Errorf("CopyOut from a closed server: %v, want a miss", err)
	}
	if err := store.Put(key, src); err == nil {
		t.Error("Put to a closed server succeeded")
	}
}
