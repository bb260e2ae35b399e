package digest_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/infradev/infradev/harness/digest"
)

// TestFilesFollowsLinks: a tree of links to files (as Bazel lays out runfiles) digests like
// the files themselves under Files, and differently under Tree, which hashes the links.
func TestFilesFollowsLinks(t *testing.T) {
	real, links := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(real, "sub"), 0o755)
	os.WriteFile(filepath.Join(real, "a.py"), []byte("a"), 0o644)
	os.WriteFile(filepath.Join(real, "sub", "b.py"), []byte("b"), 0o755)
	os.MkdirAll(filepath.Join(links, "sub"), 0o755)
	os.Symlink(filepath.Join(real, "a.py"), filepath.Join(links, "a.py"))
	os.Symlink(filepath.Join(real, "sub", "b.py"), filepath.Join(links, "sub", "b.py"))

	want, err := digest.Files(real, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := digest.Files(links, nil); err != nil || got != want {
		t.Errorf("Files(links) = %s, %v; want %s, as for the files", got, err, want)
	}
	if got, _ := digest.Tree(links); got == want {
		t.Errorf("Tree(links) = Files(real): Tree must hash links as links")
	}
	os.WriteFile(filepath.Join(real, "a.py"), []byte("changed"), 0o644)
	if got, _ := digest.Files(links, nil); got == want {
		t.Errorf("Files(links) did not change when a linked file did")
	}
	os.Symlink(filepath.Join(real, "sub"), filepath.Join(links, "dirlink"))
	if _, err := digest.Files(links, nil); err == nil {
		t.Errorf("Files accepted a link to a directory")
	}
}

func TestFilesSkips(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "probes.yaml"), []byte("p"), 0o644)
	want, _ := digest.Files(dir, nil)
	os.WriteFile(filepath.Join(dir, "BUILD.bazel"), []byte("b"), 0o644)
	os.MkdirAll(filepath.Join(dir, "samples"), 0o755)
	os.WriteFile(filepath.Join(dir, "samples", "x.patch"), []byte("x"), 0o644)
	skip := func(rel string) bool { return rel == "BUILD.bazel" || rel == "samples" }
	if got, err := digest.Files(dir, skip); err != nil || got != want {
		t.Errorf("Files with skipped files = %s, %v; want %s", got, err, want)
	}
	if got, _ := digest.Files(dir, nil); got == want {
		t.Errorf("Files without skip ignored added files")
	}
}
