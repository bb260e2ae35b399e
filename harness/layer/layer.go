// Package layer owns canonical OCI layer tarballs: the byte-exact form that makes unchanged
// inputs give unchanged digests. A Writer normalises every header (no user or group names,
// no access or change times, no extended attributes, fixed or clamped modification times,
// names without a leading "./"), gzips at a fixed level and hashes both forms in one pass.
//
// Callers add entries in a deterministic order: AddTree walks a directory in lexical order;
// Diff and Canonicalize keep the order of a (deterministic) source tarball.
package layer

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Info describes a finished layer file.
type Info struct {
	Path   string // the gzip-compressed layer on disk
	Digest string // "sha256:<hex>" of the compressed bytes
	DiffID string // "sha256:<hex>" of the uncompressed tar
	Size   int64  // compressed size in bytes
}

// Options control normalisation. The zero value sets every modification time to the Unix epoch.
type Options struct {
	// Epoch is the modification time written for every entry (when Clamp is false) or the
	// latest time kept (when Clamp is true). Default: Unix time 0.
	Epoch time.Time
	// Clamp keeps times older than Epoch instead of overwriting them.
	Clamp bool
}

// Writer writes one canonical layer. Create it with Create; call Close exactly once.
type Writer struct {
	opts     Options
	f        *os.File
	final    string
	gz       *gzip.Writer
	tw       *tar.Writer
	diffHash hash.Hash
	compHash hash.Hash
	counter  *countWriter
	names    map[string]bool
	err      error
}

// Create starts a layer that Close will move, complete, to path. Until then it lives in a
// temporary file beside path, so a crash never leaves a partial layer under the final name.
func Create(path string, opts Options) (*Writer, error) {
	if opts.Epoch.IsZero() {
		opts.Epoch = time.Unix(0, 0)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".layer-*.tmp")
	if err != nil {
		return nil, fmt.Errorf("creating layer %s: %w", path, err)
	}
	w := &Writer{opts: opts, f: f, final: path, diffHash: sha256.New(), compHash: sha256.New(), names: map[string]bool{}}
	w.counter = &countWriter{w: io.MultiWriter(f, w.compHash)}
	w.gz, _ = gzip.NewWriterLevel(w.counter, gzip.BestSpeed)
	w.tw = tar.NewWriter(io.MultiWriter(w.gz, w.diffHash))
	return w, nil
}

// Add writes one entry. The header is normalised; r supplies the content of regular files.
// Names are relative to the image root ("usr/bin/x"); a leading "./" or "/" is removed.
func (w *Writer) Add(hdr *tar.Header, r io.Reader) error {
	if w.err != nil {
		return w.err
	}
	h := w.normalise(hdr)
	if h == nil {
		return nil
	}
	key := strings.TrimSuffix(h.Name, "/")
	if w.names[key] {
		return nil // parents added implicitly, then explicitly: first one wins
	}
	if h.Typeflag == tar.TypeLink && !w.names[h.Linkname] {
		// Docker and containerd refuse a layer whose hard link points outside it.
		w.err = fmt.Errorf("writing %s: hard link to %s, which is not earlier in this layer", h.Name, h.Linkname)
		return w.err
	}
	w.names[key] = true
	if err := w.tw.WriteHeader(h); err != nil {
		w.err = fmt.Errorf("writing %s: %w", h.Name, err)
		return w.err
	}
	if h.Typeflag == tar.TypeReg && h.Size > 0 {
		n, err := io.Copy(w.tw, io.LimitReader(r, h.Size))
		if err == nil && n != h.Size {
			err = fmt.Errorf("short content: %d of %d bytes", n, h.Size)
		}
		if err != nil {
			w.err = fmt.Errorf("writing %s: %w", h.Name, err)
			return w.err
		}
	}
	return nil
}

// Has reports whether an entry with this name was already written.
func (w *Writer) Has(name string) bool { return w.names[CleanName(name)] }

// CleanName is the canonical entry name: slash-separated, relative, no trailing slash.
func CleanName(name string) string {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	return name
}

func (w *Writer) normalise(hdr *tar.Header) *tar.Header {
	name := CleanName(hdr.Name)
	if name == "" || name == "." {
		return nil // the root itself is not an entry
	}
	mt := hdr.ModTime
	if !w.opts.Clamp || mt.IsZero() || mt.After(w.opts.Epoch) {
		mt = w.opts.Epoch
	}
	h := &tar.Header{
		Typeflag: hdr.Typeflag,
		Name:     name,
		Linkname: hdr.Linkname,
		Size:     0,
		Mode:     hdr.Mode & 07777,
		Uid:      hdr.Uid,
		Gid:      hdr.Gid,
		ModTime:  mt.UTC().Truncate(time.Second),
		Format:   tar.FormatPAX,
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeRegA:
		h.Typeflag = tar.TypeReg
		h.Size = hdr.Size
	case tar.TypeDir:
		h.Name += "/"
	case tar.TypeLink:
		h.Linkname = CleanName(hdr.Linkname)
	case tar.TypeSymlink:
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		h.Devmajor, h.Devminor = hdr.Devmajor, hdr.Devminor
	default:
		return nil
	}
	return h
}

// Close finishes the layer and moves it to its final path.
func (w *Writer) Close() (Info, error) {
	if w.err == nil {
		w.err = w.tw.Close()
	}
	if w.err == nil {
		w.err = w.gz.Close()
	}
	if w.err == nil {
		w.err = w.f.Sync()
	}
	if cerr := w.f.Close(); w.err == nil {
		w.err = cerr
	}
	if w.err == nil {
		w.err = os.Rename(w.f.Name(), w.final)
	}
	if w.err != nil {
		os.Remove(w.f.Name())
		return Info{}, fmt.Errorf("writing layer %s: %w", w.final, w.err)
	}
	return Info{
		Path:   w.final,
		Digest: "sha256:" + hex.EncodeToString(w.compHash.Sum(nil)),
		DiffID: "sha256:" + hex.EncodeToString(w.diffHash.Sum(nil)),
		Size:   w.counter.n,
	}, nil
}

// Abort removes the unfinished layer.
func (w *Writer) Abort() {
	w.f.Close()
	os.Remove(w.f.Name())
}

// AddParents writes directory entries (mode 0755, root-owned) for every parent of name that
// is not yet in the layer, so that tools which do not create parents still unpack it.
func (w *Writer) AddParents(name string) error {
	name = CleanName(name)
	var parents []string
	for d := path.Dir(name); d != "." && d != "/" && d != ""; d = path.Dir(d) {
		parents = append(parents, d)
	}
	for i := len(parents) - 1; i >= 0; i-- {
		if !w.names[parents[i]] {
			if err := w.Add(&tar.Header{Typeflag: tar.TypeDir, Name: parents[i], Mode: 0o755}, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// AddTree writes the tree at src under dest (an absolute path in the image), with parents.
// Files are root-owned; modes are reduced to 0755 (any execute bit) or 0644, directories to
// 0755; symlinks are kept as they are. exclude, if not nil, skips paths relative to src
// (and everything under a skipped directory).
func (w *Writer) AddTree(src, dest string, exclude func(rel string) bool) error {
	dest = CleanName(dest)
	if dest != "" {
		if err := w.AddParents(dest + "/x"); err != nil {
			return err
		}
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel != "." && exclude != nil && exclude(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		name := path.Join(dest, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: name}
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, target, 0o777
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size, hdr.Mode = tar.TypeReg, fi.Size(), 0o644
			if fi.Mode()&0o111 != 0 {
				hdr.Mode = 0o755
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return w.Add(hdr, f)
		default:
			return fmt.Errorf("%s: unsupported file type %s", p, fi.Mode().Type())
		}
		return w.Add(hdr, nil)
	})
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
