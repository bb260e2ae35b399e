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
	root := testenv.RepoRoot(t)
	work := t.TempDir()
	for _, d := range []string{"tasks/demo/minitron-0002", "probes/demo/minitron-0002"} {
		if err := os.CopyFS(filepath.Join(work, d), os.DirFS(filepath.Join(root, d))); err != nil {
			t.Fatal(err)
		}
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
	if err := suite.CheckInstruction(tk, ps); err == nil || !strings.Contains(err.Error(), "train_steps") {
		t.Errorf("CheckInstruction() = %v, want it to name train_steps", err)
	}
}
