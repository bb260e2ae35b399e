package logcap_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/logcap"
)

func TestKeepsHeadAndTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	w, err := logcap.Create(p, 10, 8)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("0123456789"))             // the head
	w.Write(bytes.Repeat([]byte("m"), 1<<20)) // dropped
	w.Write([]byte("abc"))                    // part of the tail
	w.Write([]byte("TAIL-END"))               // the tail
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(p)
	got := string(data)
	if !strings.HasPrefix(got, "0123456789") || !strings.HasSuffix(got, "TAIL-END") {
		t.Errorf("log = %q", got)
	}
	if !strings.Contains(got, "[... 1048579 bytes of output dropped ...]") {
		t.Errorf("log does not say how much was dropped: %q", got)
	}
	if len(data) > 100 {
		t.Errorf("log is %d bytes, want it capped", len(data))
	}
}

func TestShortOutputIsKeptWhole(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	w, _ := logcap.Create(p, 10, 8)
	w.Write([]byte("hello world!"))
	w.Close()
	if data, _ := os.ReadFile(p); string(data) != "hello world!" {
		t.Errorf("log = %q", data)
	}
}
