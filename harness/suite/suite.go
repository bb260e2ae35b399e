// Package suite owns checks that span a task's agent-facing and hidden files together: that
// the instruction names every interface the probes rely on, so a probe never tests something
// the agent could not know it had to provide.
package suite

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/task"
)

var (
	importRe  = regexp.MustCompile(`(?m)^\s*from\s+[\w.]+\s+import\s+\(?([\w\s,]+)\)?`)
	callRe    = regexp.MustCompile(`\.(\w+)\s*\(`)
	nameRe    = regexp.MustCompile(`\b(\w+)\s*\(`)
	goldDefRe = regexp.MustCompile(`(?m)^\+\s*(?:def|class)\s+(\w+)`)
	hunkDefRe = regexp.MustCompile(`(?m)^@@[^@]*@@\s*(?:def|class)\s+(\w+)`)
	// Attributes the gold patch sets, and keyword parameters of the functions it adds or changes.
	goldAttrRe  = regexp.MustCompile(`(?m)^\+\s*self\.(\w+)\s*(?::[^=]+)?=[^=]`)
	goldParamRe = regexp.MustCompile(`(?m)^\+\s*def\s+\w+\s*\(([^)]*)`)
	paramRe     = regexp.MustCompile(`(\w+)\s*=`)
	// Attributes the probes read and keyword arguments they pass.
	attrRe    = regexp.MustCompile(`\.([A-Za-z_]\w*)\b`)
	keywordRe = regexp.MustCompile(`[(,]\s*(\w+)\s*=[^=]`)
)

// Interfaces returns the names the probes use (imported, called as functions or methods)
// that the gold patch defines or changes: the interfaces the task asks the agent to provide.
func Interfaces(t *task.Task, ps *probe.Set) ([]string, error) {
	if t.Upstream() && t.Derived == nil {
		return nil, nil // offline: the gold patch is not at hand; checked where it is
	}
	gold, err := os.ReadFile(t.GoldFile())
	if err != nil {
		return nil, err
	}
	changed := map[string]bool{}
	for _, re := range []*regexp.Regexp{goldDefRe, hunkDefRe, goldAttrRe} {
		for _, m := range re.FindAllStringSubmatch(string(gold), -1) {
			changed[m[1]] = true
		}
	}
	for _, m := range goldParamRe.FindAllStringSubmatch(string(gold), -1) {
		for _, p := range paramRe.FindAllStringSubmatch(m[1], -1) {
			changed[p[1]] = true
		}
	}
	used := map[string]bool{}
	files := map[string]bool{}
	for _, p := range ps.Probes {
		files[strings.SplitN(p.Test, "::", 2)[0]] = true
	}
	for f := range files {
		src, err := os.ReadFile(filepath.Join(ps.Dir, f))
		if err != nil {
			return nil, err
		}
		for _, m := range importRe.FindAllStringSubmatch(string(src), -1) {
			for _, n := range strings.Split(m[1], ",") {
				// "name" or "name as alias"; a trailing comma leaves an empty part.
				if f := strings.Fields(n); len(f) > 0 {
					used[f[0]] = true
				}
			}
		}
		for _, re := range []*regexp.Regexp{callRe, nameRe, attrRe, keywordRe} {
			for _, m := range re.FindAllStringSubmatch(string(src), -1) {
				used[m[1]] = true
			}
		}
	}
	var out []string
	for n := range used {
		// Dunder methods (__init__, __call__) are Python's protocols, which a probe's own
		// classes define too; they name no interface of the task.
		if changed[n] && !(strings.HasPrefix(n, "__") && strings.HasSuffix(n, "__")) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// CheckInstruction reports the interfaces the probes use that the task's instruction does not
// name.
func CheckInstruction(t *task.Task, ps *probe.Set) error {
	names, err := Interfaces(t, ps)
	if err != nil {
		return err
	}
	text, err := os.ReadFile(t.File(t.Instruction))
	if err != nil {
		return err
	}
	if strings.Contains(string(text), task.InstructionPlaceholder) {
		return fmt.Errorf("%s: %s is not written yet (it holds %s)", t.ID, t.Instruction, task.InstructionPlaceholder)
	}
	var missing []string
	for _, n := range names {
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(n) + `\b`).Match(text) {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s: the probes use %s, which %s does not name", t.ID, strings.Join(missing, ", "), t.Instruction)
	}
	return nil
}
