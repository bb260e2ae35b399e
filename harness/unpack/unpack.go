// Package unpack owns the unpack cache: each image layer unpacked once into a directory named by
// its diff id, ready to be an overlayfs lower directory. Unpacking goes through os.Root, so no
// entry can land outside its directory: absolute names, ".." and writes through symlinks are
// refused with an error naming the entry. OCI whiteouts become overlayfs whiteouts. Both
// digests of a layer are checked while it is unpacked; a corrupt blob is never used.
package unpack

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"golang.org/x/sys/unix"
)

// Cache is a directory of unpacked layers (layers/<diff id hex>) shared by every run.
type Cache struct{ Dir string }

// Stack unpacks (or finds unpacked) every layer of the image with the given manifest digest in
// the OCI layout at layoutDir, and returns the layer directories, bottom layer first, and the
// image's config.
func (c Cache) Stack(ctx context.Context, layoutDir, manifest string) ([]string, *v1.ConfigFile, error) {
	h, err := v1.NewHash(manifest)
	if err != nil {
		return nil, nil, fmt.Errorf("image digest %q: %w", manifest, err)
	}
	p, err := layout.FromPath(layoutDir)
	if err != nil {
		return nil, nil, fmt.Errorf("opening OCI layout %s: %w", layoutDir, err)
	}
	img, err := p.Image(h)
	if err != nil {
		return nil, nil, fmt.Errorf("image %s in %s: %w", manifest, layoutDir, err)
	}
	raw, err := img.RawManifest()
	if err != nil {
		return nil, nil, fmt.Errorf("image %s: %w", manifest, err)
	}
	if got := sha256.Sum256(raw); "sha256:"+hex.EncodeToString(got[:]) != manifest {
		return nil, nil, fmt.Errorf("image %s: manifest blob is corrupt (sha256:%x)", manifest, got)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	if len(cf.RootFS.DiffIDs) != len(m.Layers) {
		return nil, nil, fmt.Errorf("image %s: %d layers but %d diff ids", manifest, len(m.Layers), len(cf.RootFS.DiffIDs))
	}
	var dirs []string
	for i, desc := range m.Layers {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		blob := filepath.Join(layoutDir, "blobs", desc.Digest.Algorithm, desc.Digest.Hex)
		dir, err := c.Layer(blob, desc.Digest.String(), cf.RootFS.DiffIDs[i].String(), dirs)
		if err != nil {
			return nil, nil, fmt.Errorf("image %s, layer %d: %w", manifest, i, err)
		}
		dirs = append(dirs, dir)
	}
	return dirs, cf, nil
}

// Layer unpacks the gzip-compressed layer blob (with the given digest and diff id) unless it is
// already in the cache, and returns its directory. lowers are the unpacked layers below it,
// bottom first, used to resolve hard links to files of lower layers.
func (c Cache) Layer(blob, digest, diffID string, lowers []string) (string, error) {
	dh, err := v1.NewHash(diffID)
	if err != nil {
		return "", err
	}
	final := filepath.Join(c.Dir, "layers", dh.Hex)
	if _, err := os.Stat(final); err == nil {
		return final, nil
	}
	if err := os.MkdirAll(filepath.Join(c.Dir, "tmp"), 0o755); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(filepath.Join(c.Dir, "tmp"), "unpack-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "root")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	f, err := os.Open(blob)
	if err != nil {
		return "", fmt.Errorf("layer %s: %w", digest, err)
	}
	defer f.Close()
	comp := sha256.New()
	zr, err := gzip.NewReader(io.TeeReader(f, comp))
	if err != nil {
		return "", fmt.Errorf("layer %s: %w", digest, err)
	}
	diff := sha256.New()
	if err := Tar(io.TeeReader(zr, diff), dir, lowers); err != nil {
		return "", fmt.Errorf("layer %s: %w", digest, err)
	}
	// Drain what the tar reader left (padding) so both digests cover every byte.
	if _, err := io.Copy(diff, zr); err != nil {
		return "", fmt.Errorf("layer %s: %w", digest, err)
	}
	if _, err := io.Copy(comp, f); err != nil {
		return "", err
	}
	if err := checkDigest("blob", comp, digest); err != nil {
		return "", fmt.Errorf("layer %s: %w", digest, err)
	}
	if err := checkDigest("uncompressed content", diff, diffID); err != nil {
		return "", fmt.Errorf("layer %s: %w", digest, err)
	}
	if err := os.Rename(dir, final); err != nil {
		if _, serr := os.Stat(final); serr == nil {
			return final, nil // another process unpacked it first
		}
		return "", err
	}
	return final, nil
}

func checkDigest(what string, h hash.Hash, want string) error {
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("%s is corrupt: sha256 is %s, want %s", what, got, want)
	}
	return nil
}

// Tar unpacks an uncompressed layer tar stream into dir (which must exist). See the package doc.
func Tar(r io.Reader, dir string, lowers []string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirTimes []dirTime
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading tar: %w", err)
		}
		name, err := localName(h.Name)
		if err != nil {
			return err
		}
		if err := entry(root, tr, h, name, lowers); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
		if h.Typeflag == tar.TypeDir {
			dirTimes = append(dirTimes, dirTime{name, h.ModTime})
		}
	}
	// Directory times last: creating their children changed them.
	for i := len(dirTimes) - 1; i >= 0; i-- {
		_ = root.Chtimes(dirTimes[i].name, dirTimes[i].t, dirTimes[i].t)
	}
	return nil
}

// localName checks a tar entry name and returns it relative to the layer root.
func localName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("entry %q: absolute path refused", name)
	}
	clean := path.Clean(strings.TrimPrefix(name, "./"))
	if clean == "." {
		return ".", nil
	}
	if !filepath.IsLocal(clean) {
		return "", fmt.Errorf("entry %q: path escapes the layer root, refused", name)
	}
	return clean, nil
}

func entry(root *os.Root, r io.Reader, h *tar.Header, name string, lowers []string) error {
	dir, base := path.Dir(name), path.Base(name)
	if name != "." && dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return escapeErr(err)
		}
	}
	if base == ".wh..wh..opq" {
		return setOpaque(root, dir)
	}
	if strings.HasPrefix(base, ".wh.") {
		return whiteout(root, dir, strings.TrimPrefix(base, ".wh."))
	}
	mode := fs.FileMode(h.Mode & 0o777)
	if h.Mode&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if h.Mode&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if h.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if name == "." {
			return nil
		}
		if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
			if err := root.Remove(name); err != nil {
				return err
			}
		}
		if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return escapeErr(err)
		}
	case tar.TypeReg, tar.TypeRegA:
		_ = root.Remove(name)
		f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return escapeErr(err)
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		_ = root.Remove(name)
		if err := root.Symlink(h.Linkname, name); err != nil {
			return escapeErr(err)
		}
		return root.Lchown(name, h.Uid, h.Gid)
	case tar.TypeLink:
		target, err := localName(h.Linkname)
		if err != nil {
			return fmt.Errorf("hard link target: %w", err)
		}
		_ = root.Remove(name)
		if _, err := root.Lstat(target); err == nil {
			return escapeErr(root.Link(target, name))
		}
		// The target is in a lower layer: a copy keeps this layer self-contained.
		return copyFromLowers(root, target, name, lowers)
	default:
		return nil // devices and fifos: the runtime provides /dev
	}
	if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
		return err
	}
	if err := root.Chmod(name, mode); err != nil {
		return err
	}
	return root.Chtimes(name, h.ModTime, h.ModTime)
}

func escapeErr(err error) error {
	if err != nil && strings.Contains(err.Error(), "escapes from parent") {
		return fmt.Errorf("writes through a symlink out of the layer root, refused: %w", err)
	}
	return err
}

func copyFromLowers(root *os.Root, target, name string, lowers []string) error {
	for i := len(lowers) - 1; i >= 0; i-- {
		lr, err := os.OpenRoot(lowers[i])
		if err != nil {
			return err
		}
		src, err := lr.Open(target)
		if err != nil {
			lr.Close()
			continue
		}
		fi, err := src.Stat()
		if err == nil && fi.Mode().IsRegular() {
			var dst *os.File
			dst, err = root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
			if err == nil {
				_, err = io.Copy(dst, src)
				if cerr := dst.Close(); err == nil {
					err = cerr
				}
			}
		}
		src.Close()
		lr.Close()
		return err
	}
	return fmt.Errorf("hard link target %q is in no layer", target)
}

// whiteout hides name of dir in the layers below, as overlayfs expects: a 0/0 character device.
func whiteout(root *os.Root, dir, name string) error {
	d, err := root.Open(dir)
	if err != nil {
		return escapeErr(err)
	}
	defer d.Close()
	_ = unix.Unlinkat(int(d.Fd()), name, 0)
	if err := unix.Mknodat(int(d.Fd()), name, unix.S_IFCHR|0o000, 0); err != nil {
		return fmt.Errorf("whiteout %s/%s: %w", dir, name, err)
	}
	return nil
}

// setOpaque hides everything below dir in the layers below.
func setOpaque(root *os.Root, dir string) error {
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return escapeErr(err)
	}
	d, err := root.Open(dir)
	if err != nil {
		return escapeErr(err)
	}
	defer d.Close()
	if err := unix.Fsetxattr(int(d.Fd()), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		return fmt.Errorf("opaque directory %s: %w", dir, err)
	}
	return nil
}
