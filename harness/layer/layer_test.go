package layer_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/infradev/infradev/harness/layer"
)

func writeTar(t *testing.T, path string, files map[string]string) {
	t.Helper()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		body := files[n]
		h := &tar.Header{Name: "./" + n, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg, Uname: "someone"}
		if n[len(n)-1] == '/' {
			h.Typeflag, h.Size, h.Mode = tar.TypeDir, 0, 0o755
		}
		tw.WriteHeader(h)
		tw.Write([]byte(body))
	}
	tw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func entries(t *testing.T, gz string) []string {
	t.Helper()
	f, err := os.Open(gz)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uname != "" || h.ModTime.Unix() != 0 {
			t.Errorf("%s: header not canonical (uname %q, mtime %v)", h.Name, h.Uname, h.ModTime)
		}
		out = append(out, h.Name)
	}
}

func TestDiff(t *testing.T) {
	dir := t.TempDir()
	base, full := filepath.Join(dir, "base.tar"), filepath.Join(dir, "full.tar")
	writeTar(t, base, map[string]string{"etc/": "", "etc/a": "1", "etc/gone": "x", "usr/": "", "usr/lib/": "", "usr/lib/old/": "", "usr/lib/old/f": "y"})
	writeTar(t, full, map[string]string{"etc/": "", "etc/a": "2", "usr/": "", "usr/lib/": "", "usr/lib/new": "n"})
	w, err := layer.Create(filepath.Join(dir, "diff.tar.gz"), layer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := layer.Diff(base, full, w); err != nil {
		t.Fatal(err)
	}
	info, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"etc/", "etc/a", "usr/", "usr/lib/", "usr/lib/new", "etc/.wh.gone", "usr/lib/.wh.old"}
	if diff := cmp.Diff(want, entries(t, info.Path)); diff != "" {
		t.Errorf("diff layer entries (-want +got):\n%s", diff)
	}
}

func TestSameTreeSameDigest(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "b"), 0o755)
	os.WriteFile(filepath.Join(src, "b", "f"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(src, "run"), []byte("#!/bin/sh"), 0o700)
	build := func() layer.Info {
		w, err := layer.Create(filepath.Join(t.TempDir(), "l.tar.gz"), layer.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AddTree(src, "/opt/x", nil); err != nil {
			t.Fatal(err)
		}
		info, err := w.Close()
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	a := build()
	os.Chtimes(filepath.Join(src, "b", "f"), a1, a1)
	b := build()
	if a.Digest != b.Digest || a.DiffID != b.DiffID {
		t.Errorf("same tree, different digests: %v vs %v", a, b)
	}
	if diff := cmp.Diff([]string{"opt/", "opt/x/", "opt/x/b/", "opt/x/b/f", "opt/x/run"}, entries(t, a.Path)); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
	os.WriteFile(filepath.Join(src, "b", "f"), []byte("y"), 0o600)
	if c := build(); c.Digest == a.Digest {
		t.Errorf("changed content kept the digest %s", c.Digest)
	}
}

var a1 = time.Now().Add(time.Hour)

// writeEntries writes a tarball of the given headers (and regular files' bodies), in order.
func writeEntries(t *testing.T, path string, hs []*tar.Header, bodies map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hs {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(bodies[h.Name]))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(bodies[h.Name]))
	}
	tw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A package that adds a hard link to a file of a lower layer (perl -> perl5.36.0): the diff
// layer holds the link as a regular file with the target's content, since Docker and
// containerd refuse links that leave a layer; a link within the layer stays a link.
func TestDiffHardLinksStayInTheLayer(t *testing.T) {
	dir := t.TempDir()
	base, full := filepath.Join(dir, "base.tar"), filepath.Join(dir, "full.tar")
	reg := func(n string) *tar.Header { return &tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o755} }
	link := func(n, to string) *tar.Header {
		return &tar.Header{Name: n, Typeflag: tar.TypeLink, Linkname: to, Mode: 0o755}
	}
	bodies := map[string]string{"usr/bin/perl5.36.0": "PERL", "opt/x": "X"}
	writeEntries(t, base, []*tar.Header{reg("usr/bin/perl5.36.0")}, bodies)
	writeEntries(t, full, []*tar.Header{reg("usr/bin/perl5.36.0"), link("usr/bin/perl", "usr/bin/perl5.36.0"), reg("opt/x"), link("opt/y", "opt/x")}, bodies)
	w, err := layer.Create(filepath.Join(dir, "diff.tar.gz"), layer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := layer.Diff(base, full, w); err != nil {
		t.Fatal(err)
	}
	info, err := w.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(info.Path)
	defer f.Close()
	zr, _ := gzip.NewReader(f)
	tr := tar.NewReader(zr)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		switch h.Typeflag {
		case tar.TypeLink:
			got[h.Name] = "link to " + h.Linkname
		case tar.TypeReg:
			got[h.Name] = "file " + string(body)
		}
	}
	want := map[string]string{"usr/bin/perl": "file PERL", "opt/x": "file X", "opt/y": "link to opt/x"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("diff layer (-want +got):\n%s", diff)
	}
}

func TestWriterRefusesLinksOutOfTheLayer(t *testing.T) {
	w, err := layer.Create(filepath.Join(t.TempDir(), "l.tar.gz"), layer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if err := w.Add(&tar.Header{Name: "usr/bin/perl", Typeflag: tar.TypeLink, Linkname: "usr/bin/perl5"}, nil); err == nil {
		t.Errorf("a hard link to an entry not in the layer was written")
	}
}
