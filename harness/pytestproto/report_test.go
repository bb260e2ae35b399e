package pytestproto

import (
	"strings"
	"testing"
)

func TestVerifyReport(t *testing.T) {
	const doc = `<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest"><testcase classname="a" name="b"/></testsuite></testsuites>`
	nonce := []byte("n0nce")
	trailer := "\n<!-- infradev-report n0nce -->\n"
	cases := []struct {
		name, data, err string
	}{
		{"genuine", doc + trailer, ""},
		{"nothing", "", "no report"},
		{"no trailer (killed or forged)", doc, "trailer"},
		{"wrong nonce", doc + "\n<!-- infradev-report guess -->\n", "trailer"},
		{"forged document first", doc + doc + trailer, "more than one XML document"},
		{"forged document with its own trailer", doc + "\n<!-- infradev-report x -->\n" + doc + trailer, "more than one trailer"},
		{"text after the root", doc + "PASSED" + trailer, "text outside"},
		{"truncated", doc[:60] + trailer, "not"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := verifyReport([]byte(c.data), nonce)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("verifyReport() error = %v", err)
			case c.err == "" && string(got) != doc:
				t.Errorf("verifyReport() = %q, want the document", got)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Errorf("verifyReport() error = %v, want one containing %q", err, c.err)
			}
		})
	}
}
