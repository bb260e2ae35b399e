package samples_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/samples"
	"github.com/infradev/infradev/harness/task"
)

func TestModelsPicksAndExpectedFigures(t *testing.T) {
	dir, ps := probesDir(t, good)
	s, err := samples.Load(dir, "t-1", ps)
	if err != nil {
		t.Fatal(err)
	}
	withGold := func(body string) *task.Task {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, "gold.patch"), []byte(body), 0o644)
		return &task.Task{Dir: d, Gold: "gold.patch"}
	}
	sources := map[string]*samples.Source{
		"t-1": {Task: withGold("gold patch"), Samples: s, Probes: ps},
		"t-2": {Task: withGold("gold 2"), Probes: ps},
		"t-3": {Task: withGold("gold 3"), Samples: s, Probes: ps},
	}
	file := filepath.Join(t.TempDir(), "models.yaml")
	os.WriteFile(file, []byte(`schema: infradev.models/v1
models:
  - name: m/a
    file: a.jsonl
    picks: {t-1: both, t-2: gold, t-3: empty}
  - name: m/b
    file: b.jsonl
    picks: {t-1: leak, t-3: both}
`), 0o644)
	m, picks, err := samples.LoadModels(file, sources)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Models) != 2 || m.Dir != filepath.Dir(file) {
		t.Fatalf("models = %+v", m)
	}
	preds := samples.Predictions("m/a", picks["m/a"])
	var got []string
	for _, p := range preds {
		got = append(got, p.InstanceID+"="+p.Patch)
	}
	if diff := cmp.Diff([]string{"t-1=diff --git a/y b/y\n", "t-2=gold 2", "t-3="}, got); diff != "" {
		t.Errorf("predictions (-want +got):\n%s", diff)
	}
	e := samples.Expect(picks["m/a"], map[string]*probe.Set{"t-1": ps, "t-2": ps, "t-3": ps})
	want := samples.Expected{Submitted: 3, Resolved: 1, PassedOfficialTests: 2, ProbeRejected: 1,
		FailureClasses:  map[string]int{result.ProbesFailed: 1, result.OfficialTestsFailed: 1},
		ProbeCategories: map[string]int{"structural": 1, "memory": 1}}
	if diff := cmp.Diff(want, e); diff != "" {
		t.Errorf("Expect(m/a) (-want +got):\n%s", diff)
	}
}

func TestBadModels(t *testing.T) {
	dir, ps := probesDir(t, good)
	s, _ := samples.Load(dir, "t-1", ps)
	file := filepath.Join(t.TempDir(), "models.yaml")
	os.WriteFile(file, []byte(`schema: infradev.models/v1
models:
  - name: m/a
    file: ../a.jsonl
    picks: {t-1: nosuch, t-9: gold}
`), 0o644)
	_, _, err := samples.LoadModels(file, map[string]*samples.Source{"t-1": {Samples: s, Probes: ps}})
	for _, want := range []string{
		`models.yaml:4: models[0].file: must be a new .jsonl file`,
		`models[0].picks.t-1: "nosuch" is not gold, empty or a sample of t-1`,
		`models[0].picks.t-9: "t-9" is not a task`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestRealSliceModels: the real slice's models file loads without a mirror (verdicts only, as
// `samples --verify` reads it), every model picks for every upstream task, and every pick that
// is a sample names one whose verdict is not resolved; gold picks are the only resolved ones.
func TestRealSliceModels(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "predictions/real-slice.yaml")
	if _, err := os.Stat(file); err != nil {
		t.Skipf("no real slice here: %v", err)
	}
	sources, err := samples.Sources(filepath.Join(root, "tasks"), filepath.Join(root, "probes"), func(tk *task.Task) (samples.OnGold, error) {
		t.Fatalf("task %s: a verdicts-only load prepared patches", tk.ID)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	m, picks, err := samples.LoadModelsVerdicts(file, sources)
	if err != nil {
		t.Fatal(err)
	}
	var upstream []string
	for id, src := range sources {
		// The slice is what evaluates here: the upstream tasks whose attempts need no GPU.
		if src.Task.Upstream() && src.Task.Resources.GPUs.Count == 0 {
			upstream = append(upstream, id)
		}
	}
	if len(upstream) == 0 || len(m.Models) < 2 {
		t.Fatalf("%d upstream tasks, %d models", len(upstream), len(m.Models))
	}
	for _, md := range m.Models {
		got := map[string]samples.Pick{}
		for _, p := range picks[md.Name] {
			got[p.Task] = p
			if p.Patch != nil {
				t.Errorf("%s %s: a verdicts-only load read a patch", md.Name, p.Task)
			}
			if (p.Name == "gold") != (p.Want == "resolved") {
				t.Errorf("%s %s: pick %s wants %s", md.Name, p.Task, p.Name, p.Want)
			}
		}
		for _, id := range upstream {
			if _, ok := got[id]; !ok {
				t.Errorf("%s picks nothing for %s", md.Name, id)
			}
		}
	}
}
