package runner

import (
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/infradev/infradev/harness/grade"
	"github.com/joshdk/go-junit"
)

// What the run folder keeps of a probe phase. The probes' children run the submission's code,
// which can make them say anything: print the driver's source, send it back as a value that an
// assertion message then shows. The run folder is what a submitter reads, so outside
// validation it keeps each probe's outcome and the kind of its failure, never the phase's
// log or its failure texts (the judge's own messages about a child's failure excepted: they
// name an exception and nothing the child wrote).

// judgeFailure matches the judge library's own failure messages, which may be kept whole.
var judgeFailure = regexp.MustCompile(`^infradev_probe\.(ChildFailed|ChildTimeout): `)

// exceptionName is a dotted Python name at the start of a failure message.
var exceptionName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*`)

// sanitizeJUnit rewrites a probe phase's JUnit report to its outcomes: every test case with its
// name, place and time, and for a failure only what kind it was.
func sanitizeJUnit(data []byte) ([]byte, error) {
	suites, err := junit.Ingest(data)
	if err != nil {
		return nil, err
	}
	type failure struct {
		Message string `xml:"message,attr"`
	}
	type testcase struct {
		Classname string   `xml:"classname,attr"`
		Name      string   `xml:"name,attr"`
		File      string   `xml:"file,attr,omitempty"`
		Line      string   `xml:"line,attr,omitempty"`
		Time      string   `xml:"time,attr"`
		Failure   *failure `xml:"failure"`
		Error     *failure `xml:"error"`
		Skipped   *failure `xml:"skipped"`
	}
	type suite struct {
		XMLName xml.Name   `xml:"testsuite"`
		Name    string     `xml:"name,attr"`
		Tests   int        `xml:"tests,attr"`
		Cases   []testcase `xml:"testcase"`
	}
	out := suite{Name: "probes"}
	for _, t := range grade.AllTests(suites) {
		c := testcase{Classname: t.Classname, Name: t.Name, File: t.Properties["file"], Line: t.Properties["line"],
			Time: fmt.Sprintf("%.3f", t.Duration.Seconds())}
		kind := &failure{Message: failureKind(t.Message)}
		switch t.Status {
		case junit.StatusFailed:
			c.Failure = kind
		case junit.StatusError:
			c.Error = kind
		case junit.StatusSkipped:
			c.Skipped = &failure{Message: "skipped"}
		}
		out.Cases = append(out.Cases, c)
	}
	out.Tests = len(out.Cases)
	body, err := xml.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	return append([]byte(xml.Header), append(body, '\n')...), nil
}

// failureKind is what a submitter may read of a probe's failure message.
func failureKind(msg string) string {
	first, _, _ := strings.Cut(msg, "\n")
	if judgeFailure.MatchString(first) {
		if len(first) > 300 {
			first = first[:300]
		}
		return first
	}
	if name := exceptionName.FindString(first); name != "" && len(name) <= 100 {
		return name
	}
	return "failed"
}

// keepRecording moves what a recording probe phase's judge wrote (one folder per probe test,
// one file per child) into the run folder's raw/probe-record.
func keepRecording(phaseOut, out string) error {
	src := filepath.Join(phaseOut, "probe-record")
	entries, err := os.ReadDir(src)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	dst := filepath.Join(out, "raw", "probe-record")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() || !filepath.IsLocal(e.Name()) {
			continue
		}
		if err := os.Rename(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
