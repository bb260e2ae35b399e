// Package judge owns the judging side of probes. A probe's pass or fail is decided by a
// process (the judge) that never imports the task repository: it drives the code under test
// in child processes that run as another user, cannot read the probes, and send back plain
// data. This package holds the Python library probes use for that (infradev_probe, also a
// pytest plugin that refuses repository imports in the judge), the static check that a probe
// module imports nothing from the repository, and the collection plugin of the task check.
package judge

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Library is infradev_probe.py: the probes' API and the judge's import guard.
//
//go:embed infradev_probe.py
var Library []byte

// CheckScript is check_probes.py: the static check of probe modules.
//
//go:embed check_probes.py
var CheckScript []byte

// CollectPlugin is infradev_collect.py: what the probe collection check records.
//
//go:embed infradev_collect.py
var CollectPlugin []byte

// Module names as staged into the sandbox.
const (
	LibraryModule = "infradev_probe"
	CollectModule = "infradev_collect"
)

// Problem is a fault of a probe module, with its place.
type Problem struct {
	File string `json:"file"`
	Line int    `json:"line"`
	Msg  string `json:"msg"`
}

func (p Problem) String() string {
	if p.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg)
	}
	return p.File + ": " + p.Msg
}

// ParseCheck reads check_probes.py's output.
func ParseCheck(out []byte) ([]Problem, error) {
	var ps []Problem
	if err := json.Unmarshal(out, &ps); err != nil {
		return nil, fmt.Errorf("the probe check printed no result: %w", err)
	}
	return ps, nil
}

// Collected is what the collection plugin recorded.
type Collected struct {
	IDs    []string `json:"collected"`
	Errors []struct {
		NodeID string `json:"nodeid"`
		Text   string `json:"text"`
	} `json:"errors"`
}

// traceLine finds a traceback's place in a probe file: File "/run/.../test_x.py", line 12.
var traceLine = regexp.MustCompile(`File "([^"]+)", line (\d+)`)

// CollectionProblems compares what was collected with the probe test ids the task declares;
// root is where the probes were mounted, to name files relative to it.
func CollectionProblems(c Collected, declared []string, root string) []Problem {
	var out []Problem
	for _, e := range c.Errors {
		p := Problem{File: strings.SplitN(e.NodeID, "::", 2)[0], Msg: "does not collect: " + lastLine(e.Text)}
		for _, m := range traceLine.FindAllStringSubmatch(e.Text, -1) {
			if rel, ok := strings.CutPrefix(m[1], strings.TrimSuffix(root, "/")+"/"); ok {
				p.File = rel
				p.Line, _ = strconv.Atoi(m[2])
			}
		}
		out = append(out, p)
	}
	have := map[string]bool{}
	for _, id := range c.IDs {
		have[id] = true
	}
	var missing []string
	for _, id := range declared {
		if !have[id] {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	for _, id := range missing {
		out = append(out, Problem{File: strings.SplitN(id, "::", 2)[0], Msg: fmt.Sprintf("probe test %s does not exist (not collected)", id)})
	}
	return out
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return strings.TrimPrefix(l, "E   ")
		}
	}
	return ""
}
