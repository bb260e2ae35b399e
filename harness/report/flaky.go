package report

import "github.com/infradev/infradev/harness/result"

// Flaky lists the tests and probes whose outcome differed between runs of the same inputs,
// in the order they first appear.
func Flaky(runs []*result.Result) []string {
	seen := map[string]map[string]bool{}
	var order []string
	for _, r := range runs {
		for _, p := range r.Phases {
			for _, t := range p.Tests {
				if seen[t.ID] == nil {
					seen[t.ID] = map[string]bool{}
					order = append(order, t.ID)
				}
				seen[t.ID][t.Outcome] = true
			}
		}
	}
	var out []string
	for _, id := range order {
		if len(seen[id]) > 1 {
			out = append(out, id)
		}
	}
	return out
}
