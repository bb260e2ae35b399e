// Package digest owns the content digests that key images, steps and results: sha256 over
// exact bytes, and over directory trees in a canonical walk (names, kinds, execute bits,
// contents; never timestamps or owners).
package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Bytes returns "sha256:<hex>" of b.
func Bytes(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// Tree returns "sha256:<hex>" over the tree at dir, walked in lexical order. Symbolic links
// are hashed as links (their targets).
func Tree(dir string) (string, error) { return tree(dir, false, nil) }

// Files is Tree for trees of inputs that may reach their files through symbolic links (Bazel
// runfiles, for one): a link to a regular file is hashed as that file, so such a tree digests
// exactly like the files it links. Paths (slash-separated, relative to dir) for which skip
// returns true are left out, directories with all they hold; skip may be nil.
func Files(dir string, skip func(rel string) bool) (string, error) { return tree(dir, true, skip) }

func tree(dir string, follow bool, skip func(string) bool) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if skip != nil && rel != "." && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if follow && fi.Mode()&fs.ModeSymlink != 0 {
			if fi, err = os.Stat(p); err != nil {
				return err
			}
			if !fi.Mode().IsRegular() {
				return fmt.Errorf("%s: a link to something other than a file", p)
			}
		}
		switch {
		case fi.IsDir():
			fmt.Fprintf(h, "d %q\n", rel)
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "l %q %q\n", rel, t)
		case fi.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			fh := sha256.New()
			if _, err := io.Copy(fh, f); err != nil {
				return err
			}
			fmt.Fprintf(h, "f %q %t %x\n", rel, fi.Mode().Perm()&0o111 != 0, fh.Sum(nil))
		default:
			return fmt.Errorf("%s: unsupported file type %s", p, fi.Mode().Type())
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hashing %s: %w", dir, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
