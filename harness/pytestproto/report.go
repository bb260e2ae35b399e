package pytestproto

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	_ "embed"
)

// reportPlugin is the harness's pytest plugin, staged read-only into every attempt.
//
//go:embed plugin/infradev_report.py
var reportPlugin []byte

const (
	// ReportPluginName is the plugin's module name (pytest -p).
	ReportPluginName = "infradev_report"
	maxReportBytes   = 64 << 20
)

// ReportChannel is the pair of pipes through which a test phase's JUnit report leaves the
// sandbox: the nonce, and the node ids the phase runs, go in on fd 3 (read by the report plugin
// before any test module is imported, so the code under test finds no list of what runs on
// disk or in the pipe); the report comes out on fd 4.
type ReportChannel struct {
	nonce      []byte
	nonceRead  *os.File
	reportSend *os.File
	done       chan reportData
}

type reportData struct {
	data     []byte
	overflow bool
	err      error
}

// OpenReportChannel makes a phase's channel; ids are the node ids the phase runs (nil: every
// test collected).
func OpenReportChannel(ids []string) (*ReportChannel, error) {
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	c := &ReportChannel{nonce: []byte(hex.EncodeToString(raw)), done: make(chan reportData, 1)}
	nr, nw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	msg := append(append([]byte{}, c.nonce...), '\n')
	if ids != nil {
		msg = append(msg, []byte("select\n"+strings.Join(ids, "\n")+"\n")...)
	}
	// More than a pipe holds blocks until the plugin reads it: written beside the run.
	go func() {
		_, _ = nw.Write(msg)
		nw.Close()
	}()
	rr, rw, err := os.Pipe()
	if err != nil {
		nr.Close()
		return nil, err
	}
	c.nonceRead, c.reportSend = nr, rw
	go func() {
		defer rr.Close()
		data, err := io.ReadAll(io.LimitReader(rr, maxReportBytes+1))
		overflow := len(data) > maxReportBytes
		if overflow {
			_, _ = io.Copy(io.Discard, rr)
		}
		c.done <- reportData{data: data, overflow: overflow, err: err}
	}()
	return c, nil
}

// Files are the sandbox's fds 3 and 4.
func (c *ReportChannel) Files() []*os.File { return []*os.File{c.nonceRead, c.reportSend} }

// Close releases the pipes if the sandbox never took them.
func (c *ReportChannel) Close() {
	c.nonceRead.Close()
	c.reportSend.Close()
}

// Report waits for the sandbox to finish writing and returns the JUnit document, or why it is
// not to be trusted.
func (c *ReportChannel) Report() ([]byte, error) {
	d := <-c.done
	if d.err != nil {
		return nil, d.err
	}
	if d.overflow {
		return nil, fmt.Errorf("the report is over %d bytes", maxReportBytes)
	}
	return verifyReport(d.data, c.nonce)
}

// verifyReport accepts exactly one XML document followed by the plugin's trailer with nonce.
func verifyReport(data, nonce []byte) ([]byte, error) {
	if len(data) == 0 {
		return nil, errors.New("no report was sent")
	}
	trailer := []byte("\n<!-- infradev-report " + string(nonce) + " -->\n")
	if !bytes.HasSuffix(data, trailer) {
		return nil, errors.New("the report does not end with the harness's trailer")
	}
	doc := data[:len(data)-len(trailer)]
	if bytes.Contains(doc, []byte("infradev-report")) {
		return nil, errors.New("the report holds more than one trailer")
	}
	if err := singleDocument(doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// singleDocument checks that doc is one well-formed XML element with nothing after it.
func singleDocument(doc []byte) error {
	dec := xml.NewDecoder(bytes.NewReader(doc))
	depth, roots := 0, 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("the report is not well-formed XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				roots++
				if roots > 1 {
					return errors.New("the report holds more than one XML document")
				}
			}
			depth++
		case xml.EndElement:
			depth--
		case xml.CharData:
			if depth == 0 && strings.TrimSpace(string(t)) != "" {
				return errors.New("the report has text outside its root element")
			}
		case xml.ProcInst:
			if roots > 0 {
				return errors.New("the report holds more than one XML document")
			}
		}
	}
	if roots != 1 || depth != 0 {
		return errors.New("the report is not one complete XML document")
	}
	return nil
}
