package importer_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/infradev/infradev/harness/importer"
)

func TestClassify(t *testing.T) {
	base := []map[string]string{
		{"t::new": "failed", "t::kept": "passed", "t::flaky_base": "passed", "t::broken": "failed", "t::flaky_merge": "failed"},
		{"t::new": "error", "t::kept": "passed", "t::flaky_base": "failed", "t::broken": "failed", "t::flaky_merge": "failed"},
	}
	merge := []map[string]string{
		{"t::new": "passed", "t::kept": "passed", "t::flaky_base": "passed", "t::broken": "failed", "t::flaky_merge": "passed", "t::collected_at_merge_only": "passed"},
		{"t::new": "passed", "t::kept": "passed", "t::flaky_base": "passed", "t::broken": "failed", "t::flaky_merge": "skipped", "t::collected_at_merge_only": "passed"},
	}
	f2p, p2p, dropped := importer.Classify(base, merge)
	if diff := cmp.Diff([]string{"t::collected_at_merge_only", "t::new"}, f2p); diff != "" {
		t.Errorf("fail-to-pass (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"t::kept"}, p2p); diff != "" {
		t.Errorf("pass-to-pass (-want +got):\n%s", diff)
	}
	for id, want := range map[string]string{
		"t::flaky_base":  "flaky at the base: passed 1 of 2 runs",
		"t::flaky_merge": "flaky at the merge commit: passed 1 of 2 runs",
		"t::broken":      "does not pass at the merge commit: failed",
	} {
		if !strings.Contains(dropped[id], want) {
			t.Errorf("%s dropped as %q, want %q", id, dropped[id], want)
		}
	}
	if len(dropped) != 3 {
		t.Errorf("dropped %v", dropped)
	}
}
