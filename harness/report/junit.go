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
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Properties []junitProperty `xml:"properties>property,omitempty"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
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
// verdict and one per graded official test and probe, so CI systems and Bazel show them. With
// results of more than one attempt, a suite per model comes first, whose properties carry the
// model's figures (resolved, resolution rate, probe-rejected, tampered, errors).
func WriteJUnit(w io.Writer, results []*result.Result) error {
	var out junitSuites
	if len(results) > 1 {
		for _, m := range Summarize("", results).Models {
			out.Suites = append(out.Suites, junitSuite{Name: "model " + m.Label, Properties: []junitProperty{
				{"submitted", fmt.Sprint(m.SubmittedInstances)},
				{"resolved", fmt.Sprint(m.ResolvedInstances)},
				{"resolution_rate", fmt.Sprintf("%.4f", m.ResolutionRate)},
				{"passed_official_tests", fmt.Sprint(m.PassedOfficialTests)},
				{"probe_rejected", fmt.Sprint(m.ProbeRejected)},
				{"tampered", fmt.Sprint(m.TamperedInstances)},
				{"errors", fmt.Sprint(m.ErrorInstances)},
			}})
		}
	}
	for _, r := range results {
		name := r.InstanceID
		if r.Model != "" {
			name = r.Model + "/" + r.InstanceID
		}
		if r.Attempt > 0 {
			name += fmt.Sprintf(" [%s #%d]", r.PromptVariant, r.Attempt)
		}
		// The digests of what was graded: a Bazel test's log and report say which submission
		// (byte for byte) its verdict is for.
		s := junitSuite{Name: name, Properties: []junitProperty{
			{"patch_digest", r.Inputs.Patch}, {"task_digest", r.Inputs.Task}, {"probes_digest", r.Inputs.Probes},
			{"environment", r.Inputs.Environment}, {"harness", r.Inputs.Harness},
		}}
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
