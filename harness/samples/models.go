package samples

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/infradev/infradev/harness/predictions"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/specfile"
	"github.com/infradev/infradev/harness/task"
)

// ModelsSchema is the schema version of a models file.
const ModelsSchema = "infradev.models/v1"

// Models is a models file: named prediction files, each picking one submission per task from
// the tasks' gold patch, the empty patch and their samples, so reports have something to compare
// whose right answers are known.
type Models struct {
	Schema string  `yaml:"schema"`
	Models []Model `yaml:"models"`

	// Dir is the directory the prediction files are written to.
	Dir string `yaml:"-"`
}

// Model is one prediction file.
type Model struct {
	// Name is the predictions' model_name_or_path.
	Name string `yaml:"name"`
	// File is the JSON Lines file, relative to the models file.
	File string `yaml:"file"`
	// Picks maps a task id to "gold", "empty" or one of the task's sample names.
	Picks map[string]string `yaml:"picks"`
}

// Source is what a model may pick from for one task.
type Source struct {
	Task    *task.Task
	Samples *Set
	Probes  *probe.Set
	// prep attaches an upstream task's derived files and returns how its samples written on
	// gold are composed; it runs only for tasks a models file picks from.
	prep     func(*task.Task) (OnGold, error)
	prepared bool
	onGold   OnGold
}

// ready prepares the task once: its derived files and its samples' composer.
func (s *Source) ready() error {
	if s.prepared || s.prep == nil {
		return nil
	}
	var err error
	s.onGold, err = s.prep(s.Task)
	s.prepared = err == nil
	return err
}

// Gold is the task's gold patch.
func (s *Source) Gold() ([]byte, error) {
	if err := s.ready(); err != nil {
		return nil, err
	}
	return os.ReadFile(s.Task.GoldFile())
}

// Sources loads every task's probes and samples under the two roots, by task id. prep, when
// set, is called on a task the first time a pick needs its patches: it attaches an upstream
// task's derived files and returns how its samples written on gold are composed (so tasks no
// models file picks from need no mirror).
func Sources(tasksRoot, probesRoot string, prep func(*task.Task) (OnGold, error)) (map[string]*Source, error) {
	dirs, err := task.Find(tasksRoot)
	if err != nil {
		return nil, err
	}
	out := map[string]*Source{}
	for id, dir := range dirs {
		t, err := task.Load(dir)
		if err != nil {
			return nil, err
		}
		ps, err := probe.Load(task.ProbesDir(probesRoot, dir), id)
		if err != nil {
			return nil, err
		}
		ss, err := Load(ps.Dir, id, ps)
		if err != nil {
			return nil, err
		}
		out[id] = &Source{Task: t, Samples: ss, Probes: ps, prep: prep}
	}
	return out, nil
}

// Pick is one resolved choice: the patch and the verdict it was built to get.
type Pick struct {
	Task, Name, Want string
	Patch            []byte
	FailingProbes    []string
}

// LoadModels reads a models file and resolves every pick against sources (task id -> Source),
// with its patch.
func LoadModels(file string, sources map[string]*Source) (*Models, map[string][]Pick, error) {
	return loadModels(file, sources, true)
}

// LoadModelsVerdicts is LoadModels without the patches: each pick's name and the verdict it was
// built to get, all that checking a report needs. It reads no patch, so upstream tasks need
// neither a mirror nor their derived files.
func LoadModelsVerdicts(file string, sources map[string]*Source) (*Models, map[string][]Pick, error) {
	return loadModels(file, sources, false)
}

func loadModels(file string, sources map[string]*Source, patches bool) (*Models, map[string][]Pick, error) {
	m := &Models{}
	doc := specfile.ReadFile(file, m)
	if !doc.Parsed() {
		return nil, nil, doc.Errs.Err()
	}
	m.Dir = filepath.Dir(file)
	if m.Schema != ModelsSchema {
		doc.Errorf("schema", "must be %q, got %q", ModelsSchema, m.Schema)
	}
	picks := map[string][]Pick{}
	files := map[string]bool{}
	for i, md := range m.Models {
		at := func(f string) string { return fmt.Sprintf("models[%d].%s", i, f) }
		if md.Name == "" {
			doc.Errorf(at("name"), "is required")
		}
		if !filepath.IsLocal(md.File) || filepath.Ext(md.File) != ".jsonl" || files[md.File] {
			doc.Errorf(at("file"), "must be a new .jsonl file beside the models file, got %q", md.File)
		}
		files[md.File] = true
		tasks := make([]string, 0, len(md.Picks))
		for id := range md.Picks {
			tasks = append(tasks, id)
		}
		sort.Strings(tasks)
		for _, id := range tasks {
			name := md.Picks[id]
			src, ok := sources[id]
			if !ok {
				doc.Errorf(at("picks."+id), "%q is not a task", id)
				continue
			}
			p, err := resolve(id, name, src, patches)
			if err != nil {
				doc.Errorf(at("picks."+id), "%v", err)
				continue
			}
			picks[md.Name] = append(picks[md.Name], p)
		}
	}
	if err := doc.Errs.Err(); err != nil {
		return nil, nil, err
	}
	return m, picks, nil
}

func resolve(id, name string, src *Source, patches bool) (Pick, error) {
	switch name {
	case "gold":
		if !patches {
			return Pick{Task: id, Name: name, Want: "resolved"}, nil
		}
		gold, err := src.Gold()
		if err != nil {
			return Pick{}, fmt.Errorf("task %s: %w", id, err)
		}
		return Pick{Task: id, Name: name, Want: "resolved", Patch: gold}, nil
	case "empty":
		return Pick{Task: id, Name: name, Want: result.OfficialTestsFailed}, nil
	}
	if src.Samples != nil {
		for _, sm := range src.Samples.Samples {
			if sm.Name == name {
				if !patches {
					return Pick{Task: id, Name: name, Want: sm.Want, FailingProbes: sm.FailingProbes}, nil
				}
				if err := src.ready(); err != nil {
					return Pick{}, fmt.Errorf("task %s: %w", id, err)
				}
				patch, err := src.Samples.Read(sm, src.onGold)
				return Pick{Task: id, Name: name, Want: sm.Want, Patch: patch, FailingProbes: sm.FailingProbes}, err
			}
		}
	}
	return Pick{}, fmt.Errorf("%q is not gold, empty or a sample of %s", name, id)
}

// Predictions returns a model's picks as predictions, in task order.
func Predictions(model string, picks []Pick) []predictions.Prediction {
	out := make([]predictions.Prediction, 0, len(picks))
	for _, p := range picks {
		out = append(out, predictions.Prediction{InstanceID: p.Task, Model: model, Patch: string(p.Patch)})
	}
	return out
}

// Expected is what a report must show for a model whose picks get the verdicts they were built
// to get: the figures the prediction file was made to contain.
type Expected struct {
	Submitted, Resolved, PassedOfficialTests, ProbeRejected int
	FailureClasses, ProbeCategories                         map[string]int
}

// Expect derives a model's expected report figures from its picks; probes gives each task's
// probes (for categories).
func Expect(picks []Pick, probes map[string]*probe.Set) Expected {
	e := Expected{FailureClasses: map[string]int{}, ProbeCategories: map[string]int{}}
	for _, p := range picks {
		e.Submitted++
		switch p.Want {
		case "resolved":
			e.Resolved++
			e.PassedOfficialTests++
			continue
		case result.ProbesFailed:
			e.PassedOfficialTests++
			e.ProbeRejected++
			var cats []string
			for _, id := range p.FailingProbes {
				for _, pr := range probes[p.Task].Probes {
					if pr.ID == id && !slices.Contains(cats, pr.Category) {
						cats = append(cats, pr.Category)
					}
				}
			}
			for _, c := range cats {
				e.ProbeCategories[c]++
			}
		}
		e.FailureClasses[p.Want]++
	}
	return e
}
