package suite_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/suite"
	"github.com/infradev/infradev/harness/task"
)

// TestInstructionsNameProbedInterfaces: for every task of the repository that carries its gold
// patch, each interface its probes use that the gold patch provides is named in the instruction.
func TestInstructionsNameProbedInterfaces(t *testing.T) {
	root := testenv.RepoRoot(t)
	dirs, err := task.Find(filepath.Join(root, "tasks"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("tasks: %v (%d)", err, len(dirs))
	}
	for id, dir := range dirs {
		tk, err := task.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := probe.Load(task.ProbesDir(filepath.Join(root, "probes"), dir), tk.ID)
		if err != nil {
			t.Fatal(err)
		}
		if tk.Upstream() {
			// Its gold patch is derived from the upstream commits, which need a mirror: validate
			// makes this check where one is at hand.
			continue
		}
		names, err := suite.Interfaces(tk, ps)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) == 0 {
			t.Errorf("%s: the probes use nothing the gold patch provides", id)
		}
		t.Logf("%s: probes use %s", id, strings.Join(names, ", "))
		if err := suite.CheckInstruction(tk, ps); err != nil {
			t.Error(err)
		}
	}
}

// TestMissingNameIsReported: an instruction that leaves out a probed interface fails.
func TestMissingNameIsReported(t *testing.T) {
	tk, ps := withoutTrainSteps(t, nil)
	if err := suite.CheckInstruction(tk, ps); err == nil || !strings.Contains(err.Error(), "train_steps") {
		t.Errorf("CheckInstruction() = %v, want it to name train_steps", err)
	}
}

// withoutTrainSteps copies minitron-0002 and its probes, edits the probe module with edit (when
// not nil) and removes the name train_steps from the instruction.
func withoutTrainSteps(t *testing.T, edit func([]byte) []byte) (*task.Task, *probe.Set) {
	t.Helper()
	root := testenv.RepoRoot(t)
	work := t.TempDir()
	for _, d := range []string{"tasks/demo/minitron-0002", "probes/demo/minitron-0002"} {
		if err := os.CopyFS(filepath.Join(work, d), os.DirFS(filepath.Join(root, d))); err != nil {
			t.Fatal(err)
		}
	}
	if edit != nil {
		probeFile := filepath.Join(work, "probes/demo/minitron-0002/test_probes.py")
		src, _ := os.ReadFile(probeFile)
		os.WriteFile(probeFile, edit(src), 0o644)
	}
	instr := filepath.Join(work, "tasks/demo/minitron-0002/instruction.md")
	data, _ := os.ReadFile(instr)
	os.WriteFile(instr, []byte(strings.ReplaceAll(string(data), "train_steps", "the training loop")), 0o644)
	tk, err := task.Load(filepath.Join(work, "tasks/demo/minitron-0002"))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := probe.Load(filepath.Join(work, "probes/demo/minitron-0002"), tk.ID)
	if err != nil {
		t.Fatal(err)
	}
	return tk, ps
}

// TestParenthesizedImportsAreRead: a probe importing names in parentheses, one per line with a
// trailing comma and an alias, has every name read (and the check does not fail on the empty
// part after the last comma).
func TestParenthesizedImportsAreRead(t *testing.T) {
	tk, ps := withoutTrainSteps(t, func(src []byte) []byte {
		return append([]byte("from minitron.train import (\n    train_steps as _steps,\n    os,\n)\n"), src...)
	})
	if err := suite.CheckInstruction(tk, ps); err == nil || !strings.Contains(err.Error(), "train_steps") {
		t.Errorf("CheckInstruction() = %v, want it to name train_steps (imported in parentheses)", err)
	}
}
