package layer

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
)

// WhiteoutPrefix marks a deleted path in an OCI layer (".wh.<name>").
const WhiteoutPrefix = ".wh."

// Canonicalize copies the tarball at src into w, in its own order. Device nodes are dropped:
// the container runtime provides /dev.
func Canonicalize(src string, w *Writer) error {
	return eachEntry(src, func(h *tar.Header, r io.Reader) error {
		if skipped(h) {
			return nil
		}
		if h.Typeflag == tar.TypeLink && !w.Has(h.Linkname) {
			return nil // a link to a dropped device node
		}
		if err := w.AddParents(h.Name); err != nil {
			return err
		}
		return w.Add(h, r)
	})
}

// Diff writes to w the entries of the tarball full that are new or changed relative to the
// tarball base (a root filesystem and a later state of it), and a whiteout for every path of
// base that full no longer has. Unchanged entries, including unchanged parent directories,
// are left out, except that each written entry's parents are written too. A hard link whose
// target is not in this layer (an unchanged file of a layer below) is written as a regular file
// with the target's content: OCI consumers (Docker, containerd) accept hard links only to
// earlier entries of the same layer.
func Diff(base, full string, w *Writer) error {
	// The targets of hard links in full, whose content a link may have to carry.
	targets := map[string]bool{}
	if err := eachEntry(full, func(h *tar.Header, _ io.Reader) error {
		if h.Typeflag == tar.TypeLink {
			targets[CleanName(h.Linkname)] = true
		}
		return nil
	}); err != nil {
		return fmt.Errorf("reading %s: %w", full, err)
	}
	kept := map[string]*keptFile{}
	before := map[string][32]byte{}
	if err := eachEntry(base, func(h *tar.Header, r io.Reader) error {
		if !skipped(h) {
			fp, err := fingerprint(h, r)
			if err != nil {
				return err
			}
			before[CleanName(h.Name)] = fp
		}
		return nil
	}); err != nil {
		return fmt.Errorf("reading %s: %w", base, err)
	}
	seen := map[string]bool{}
	dirs := map[string]*tar.Header{}
	if err := eachEntry(full, func(h *tar.Header, r io.Reader) error {
		if skipped(h) {
			return nil
		}
		name := CleanName(h.Name)
		seen[name] = true
		if h.Typeflag == tar.TypeDir {
			dirs[name] = h
		}
		var buf bytes.Buffer
		tee := io.TeeReader(r, &buf)
		fp, err := fingerprint(h, tee)
		if err != nil {
			return err
		}
		if targets[name] && (h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeRegA) {
			kept[name] = &keptFile{hdr: *h, data: append([]byte(nil), buf.Bytes()...)}
		}
		if old, ok := before[name]; ok && old == fp {
			return nil
		}
		if err := addParentsFrom(w, name, dirs); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeLink && !w.Has(h.Linkname) {
			k := kept[CleanName(h.Linkname)]
			if k == nil {
				return fmt.Errorf("hard link to %s, which is not a regular file earlier in the tarball", h.Linkname)
			}
			reg := k.hdr
			reg.Name, reg.Linkname = h.Name, ""
			return w.Add(&reg, bytes.NewReader(k.data))
		}
		return w.Add(h, &buf)
	}); err != nil {
		return fmt.Errorf("reading %s: %w", full, err)
	}
	var gone []string
	for name := range before {
		if !seen[name] && (path.Dir(name) == "." || seen[path.Dir(name)]) {
			gone = append(gone, name) // a removed directory's children go with its whiteout
		}
	}
	sort.Strings(gone)
	for _, name := range gone {
		if err := addParentsFrom(w, name, dirs); err != nil {
			return err
		}
		wh := path.Join(path.Dir(name), WhiteoutPrefix+path.Base(name))
		if err := w.Add(&tar.Header{Typeflag: tar.TypeReg, Name: wh, Mode: 0o644}, nil); err != nil {
			return err
		}
	}
	return nil
}

// keptFile is a hard link target's header and content.
type keptFile struct {
	hdr  tar.Header
	data []byte
}

// addParentsFrom writes name's missing parents using their headers from the source tarball.
func addParentsFrom(w *Writer, name string, dirs map[string]*tar.Header) error {
	var parents []string
	for d := path.Dir(name); d != "." && d != ""; d = path.Dir(d) {
		parents = append(parents, d)
	}
	for i := len(parents) - 1; i >= 0; i-- {
		if w.Has(parents[i]) {
			continue
		}
		h := dirs[parents[i]]
		if h == nil {
			h = &tar.Header{Typeflag: tar.TypeDir, Name: parents[i], Mode: 0o755}
		}
		if err := w.Add(h, nil); err != nil {
			return err
		}
	}
	return nil
}

func skipped(h *tar.Header) bool {
	return h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock || CleanName(h.Name) == ""
}

// fingerprint hashes everything about an entry that a canonical layer keeps.
func fingerprint(h *tar.Header, r io.Reader) ([32]byte, error) {
	s := sha256.New()
	fmt.Fprintf(s, "%c\x00%o\x00%d\x00%d\x00%s\x00%d\x00%d\x00%d\x00", h.Typeflag, h.Mode&07777, h.Uid, h.Gid, h.Linkname, h.Size, h.Devmajor, h.Devminor)
	if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeRegA {
		if _, err := io.Copy(s, r); err != nil {
			return [32]byte{}, err
		}
	}
	var out [32]byte
	copy(out[:], s.Sum(nil))
	return out, nil
}

func eachEntry(file string, fn func(*tar.Header, io.Reader) error) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(h, tr); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
}
