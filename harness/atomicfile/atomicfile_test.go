package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/infradev/infradev/harness/atomicfile"
)

// TestCopy: the destination gets the source's bytes with mode 0644, its directories are made,
// and a failed copy leaves neither the destination nor a temporary file behind.
func TestCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, []byte("wheel bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "a", "b", "dst")
	if err := atomicfile.Copy(src, dst); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(dst)
	if err != nil || string(data) != "wheel bytes" {
		t.Fatalf("copied %q (%v)", data, err)
	}
	if st, _ := os.Stat(dst); st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", st.Mode().Perm())
	}
	if err := atomicfile.Copy(filepath.Join(dir, "missing"), filepath.Join(dir, "out", "x")); err == nil {
		t.Fatal("copying a missing file succeeded")
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "a", "b")); len(left) != 1 {
		t.Errorf("left in the destination directory: %v", left)
	}
	if _, err := os.Stat(filepath.Join(dir, "out", "x")); err == nil {
		t.Error("a failed copy left its destination")
	}
}
