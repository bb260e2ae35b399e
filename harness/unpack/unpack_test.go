package unpack_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/unpack"
)

type entry struct {
	name, link string
	typ        byte
	body       string
}

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func TestRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	cases := map[string][]entry{
		"dot-dot":          {{name: "../x", typ: tar.TypeReg, body: "x"}},
		"nested dot-dot":   {{name: "a/../../x", typ: tar.TypeReg, body: "x"}},
		"absolute":         {{name: "/etc/x", typ: tar.TypeReg, body: "x"}},
		"absolute symlink": {{name: "evil", typ: tar.TypeSymlink, link: outside}, {name: "evil/x", typ: tar.TypeReg, body: "x"}},
		"relative symlink": {{name: "evil", typ: tar.TypeSymlink, link: "../../../../../../../.." + outside}, {name: "evil/x", typ: tar.TypeReg, body: "x"}},
		"symlink dir":      {{name: "d", typ: tar.TypeSymlink, link: outside}, {name: "d/sub/x", typ: tar.TypeReg, body: "x"}},
		"hard link out":    {{name: "h", typ: tar.TypeLink, link: "../../etc/passwd"}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			err := unpack.Tar(bytes.NewReader(tarOf(t, entries...)), dir, nil)
			if err == nil {
				t.Fatalf("Tar() error = nil, want a refusal")
			}
			if !strings.Contains(err.Error(), "refused") && !strings.Contains(err.Error(), "escapes") {
				t.Errorf("error %q does not say the entry was refused", err)
			}
			if !strings.Contains(err.Error(), entries[len(entries)-1].name) {
				t.Errorf("error %q does not name the entry %q", err, entries[len(entries)-1].name)
			}
			if left, _ := os.ReadDir(outside); len(left) != 0 {
				t.Errorf("something was written outside the layer: %v", left)
			}
		})
	}
}

func TestWhiteoutsBecomeOverlayWhiteouts(t *testing.T) {
	testenv.Require(t, os.Geteuid() == 0, "root (overlay whiteouts need mknod and trusted xattrs)")
	dir := t.TempDir()
	err := unpack.Tar(bytes.NewReader(tarOf(t,
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/.wh.gone", typ: tar.TypeReg},
		entry{name: "opt/.wh..wh..opq", typ: tar.TypeReg},
		entry{name: "etc/kept", typ: tar.TypeReg, body: "k"},
		entry{name: "etc/link", typ: tar.TypeLink, link: "etc/kept"},
	)), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "etc", "gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/gone is not a 0/0 character device: %v mode %o", err, st.Mode)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(dir, "opt"), "trusted.overlay.opaque", buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opt is not opaque: %v %q", err, buf[:n])
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "etc", "link")); string(data) != "k" {
		t.Errorf("hard link content = %q, want k", data)
	}
}

func gz(t *testing.T, data []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func TestCacheChecksDigestsAndNeverKeepsACorruptLayer(t *testing.T) {
	raw := tarOf(t, entry{name: "a", typ: tar.TypeReg, body: "hello"})
	blob := gz(t, raw)
	dir := t.TempDir()
	path := filepath.Join(dir, "blob")
	c := unpack.Cache{Dir: filepath.Join(dir, "cache")}

	// A blob whose bytes do not match its digest is refused and leaves nothing in the cache.
	corrupt := append([]byte{}, blob...)
	os.WriteFile(path, corrupt, 0o644)
	if _, err := c.Layer(path, sum([]byte("other")), sum(raw), nil); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("Layer(wrong digest) error = %v, want corrupt", err)
	}
	if _, err := c.Layer(path, sum(blob), sum([]byte("other")), nil); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("Layer(wrong diff id) error = %v, want corrupt", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(c.Dir, "layers")); len(entries) != 0 {
		t.Fatalf("corrupt layers were kept: %v", entries)
	}

	got, err := c.Layer(path, sum(blob), sum(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(got, "a")); string(data) != "hello" {
		t.Errorf("unpacked a = %q", data)
	}
	// Second call: served from the cache, even with the blob gone.
	os.Remove(path)
	if again, err := c.Layer(path, sum(blob), sum(raw), nil); err != nil || again != got {
		t.Errorf("cached Layer() = %q, %v; want %q", again, err, got)
	}
}
