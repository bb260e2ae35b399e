package report

import (
	"encoding/xml"
	"fmt"
	"io"

	"github.com/infradev/infradev/harness/result"
)

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Error     *junitMessage `xml:"error,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes results as JUnit XML: one suite per attempt with a test case for the
// verdict and one per graded official test and probe, so CI systems and Bazel show them.
func WriteJUnit(w io.Writer, results []*result.Result) error {
	var out junitSuites
	for _, r := range results {
		name := r.InstanceID
		if r.Model != "" {
			name = r.Model + "/" + r.InstanceID
		}
		s := junitSuite{Name: name}
		verdict := junitCase{Name: "verdict", Classname: name, Time: "0"}
		switch {
		case r.Resolved:
		case result.IsSubmissionFailure(r.FailureClass):
			verdict.Failure = &junitMessage{Message: Verdict(r), Text: r.Reason}
			s.Failures++
		default:
			verdict.Error = &junitMessage{Message: Verdict(r), Text: r.Reason}
			s.Errors++
		}
		s.Cases = append(s.Cases, verdict)
		for _, p := range r.Phases {
			for _, t := range p.Tests {
				c := junitCase{Name: t.ID, Classname: name + "." + p.Name, Time: fmt.Sprintf("%.3f", 0.0)}
				if t.Probe != "" {
					c.Name = t.Probe + " (" + t.Category + ")"
				}
				if t.Outcome != result.StatusPassed {
					c.Failure = &junitMessage{Message: t.Outcome, Text: t.Message}
					s.Failures++
				}
				s.Cases = append(s.Cases, c)
			}
		}
		s.Tests = len(s.Cases)
		out.Suites = append(out.Suites, s)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(out); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
