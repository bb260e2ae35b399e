package layer

import (
	"archive/tar"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// AddUpper writes an overlayfs upper directory (what a run changed) as layer entries:
// files, directories and symlinks with their owners and modes, a 0/0 character device as an
// OCI whiteout (.wh.<name>), and an opaque directory as a .wh..wh..opq entry inside it.
func (w *Writer) AddUpper(upper string) error {
	return filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		hdr := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm())}
		if st != nil {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			hdr.Mode = int64(st.Mode & 0o7777)
		}
		switch {
		case fi.Mode()&fs.ModeCharDevice != 0 && st != nil && st.Rdev == 0:
			wh := &tar.Header{Typeflag: tar.TypeReg, Name: path.Join(path.Dir(name), WhiteoutPrefix+path.Base(name)), Mode: 0o644}
			return w.Add(wh, nil)
		case fi.IsDir():
			hdr.Typeflag = tar.TypeDir
			if err := w.Add(hdr, nil); err != nil {
				return err
			}
			buf := make([]byte, 4)
			if n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf); err == nil && string(buf[:n]) == "y" {
				return w.Add(&tar.Header{Typeflag: tar.TypeReg, Name: path.Join(name, WhiteoutPrefix+WhiteoutPrefix+"opq"), Mode: 0o644}, nil)
			}
			return nil
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
			return w.Add(hdr, nil)
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return w.Add(hdr, f)
		}
		return fmt.Errorf("%s: unsupported file type %s in the upper directory", p, fi.Mode().Type())
	})
}
