// Package logcap owns bounded logs: a Writer keeps the first and the last bytes of what is
// written to it and drops the middle, so no command can fill the disk through its output.
package logcap

import (
	"fmt"
	"os"
	"sync"
)

// Writer writes the first Head bytes straight to a file and keeps the last Tail bytes in memory
// until Close, which appends a note of how much was dropped and then the tail.
type Writer struct {
	mu      sync.Mutex
	f       *os.File
	head    int64
	written int64
	tail    []byte // ring buffer
	pos     int
	full    bool
}

// Create opens path for a capped log keeping head and tail bytes.
func Create(path string, head, tail int) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f, head: int64(head), tail: make([]byte, tail)}, nil
}

func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	if room := w.head - w.written; room > 0 {
		k := min(int64(len(p)), room)
		if _, err := w.f.Write(p[:k]); err != nil {
			return 0, err
		}
		w.written += k
		p = p[k:]
	}
	for len(p) > 0 && len(w.tail) > 0 {
		k := copy(w.tail[w.pos:], p)
		p = p[k:]
		w.pos += k
		w.written += int64(k)
		if w.pos == len(w.tail) {
			w.pos, w.full = 0, true
		}
	}
	w.written += int64(len(p)) // only when tail is 0
	return n, nil
}

// Close writes the kept tail and closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var tail []byte
	if w.full {
		tail = append(append([]byte{}, w.tail[w.pos:]...), w.tail[:w.pos]...)
	} else {
		tail = w.tail[:w.pos]
	}
	if dropped := w.written - w.head - int64(len(tail)); dropped > 0 {
		fmt.Fprintf(w.f, "\n[... %d bytes of output dropped ...]\n", dropped)
	}
	_, err := w.f.Write(tail)
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	return err
}
