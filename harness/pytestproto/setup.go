// Package pytestproto owns the protocol between the harness and what runs inside the sandbox
// for a test phase: the setup script that checks the repository is at its base commit,
// applies a submission all-or-nothing and puts the official tests back (its inputs and its exit
// codes, which package grade reads), the pytest command line with the harness's report plugin,
// and the sealed channel through which a phase's JUnit report leaves the sandbox. Package
// runner stages and runs it; nothing here runs a sandbox.
package pytestproto

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/infradev/infradev/harness/canary"
	"github.com/infradev/infradev/harness/cheat"
	"github.com/infradev/infradev/harness/judge"
	"github.com/infradev/infradev/harness/task"
)

// Paths inside the sandbox.
const (
	// InDir holds a phase's read-only inputs (the scripts, the patch, the ids to run).
	InDir = "/run/infradev/in"
	// OutDir is a phase's writable output folder.
	OutDir = "/run/infradev/out"
	// ProbesMount holds the task's probes, read-only, in the probe phases.
	ProbesMount = "/run/infradev/probes"
)

// Exit codes of the setup script. 30, 32 and 33 are decided before the submission is applied
// (faults of the task); 20 and 21 are the submission's.
const (
	ExitPatchDoesNotApply = 20 // git apply refused the submission
	ExitSetupOverPatch    = 21 // the official tests could not be put in place over the submission
	ExitNotAtBase         = 30 // the task repository is not at its base commit
	ExitTestsDoNotApply   = 32 // the official test patch does not apply at the base commit
	ExitGoldDoesNotApply  = 33 // the gold patch does not apply over the official tests
)

// Reference is where the setup script writes the gold tree's difference from the base commit
// (files under Reference/, relative to the repository; the removed paths, NUL-separated, in
// ReferenceDeleted), in its output folder.
const (
	Reference        = "reference"
	ReferenceDeleted = "reference.deleted"
)

// MaxChanges bounds what the static scan reads of a patch's files (a small binary delta can
// write large files); the setup script stops writing changes.tar beyond it.
const MaxChanges = 64 << 20

// ApplyCommand is the setup phase's command.
var ApplyCommand = []string{"python3", "-I", InDir + "/apply.py"}

// setupScript is the script that sets up an attempt's repository (see its doc string).
//
//go:embed setup/apply.py
var setupScript []byte

// launchScript starts a test phase as several rank processes (see its doc string).
//
//go:embed setup/launch.py
var launchScript []byte

// Launch is the command that runs args as ranks processes, each with its own report channel
// (fds 3+2r and 4+2r of the phase, see OpenReportChannel) and the variables torchrun sets;
// with one rank it is args itself.
func Launch(ranks int, args []string) []string {
	if ranks <= 1 {
		return args
	}
	return append([]string{"python3", "-I", InDir + "/launch.py", fmt.Sprint(ranks), "--"}, args...)
}

// runnerConfig are files that configure the test runner or the interpreter from inside the
// repository. Wherever they are, they are set to what the official tree has (or removed):
// a submission's versions could load plugins or hooks that rewrite outcomes.
var runnerConfig = []string{"conftest.py", "sitecustomize.py", "usercustomize.py",
	"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}

// applyConfig is apply.json, what the setup script is told.
type applyConfig struct {
	Base string `json:"base"`
	// TestRoots are directories wholly owned by the official tests: every file under them is
	// set to the official tree, whatever the submission did.
	TestRoots    []string       `json:"test_roots"`
	Official     []string       `json:"official"`
	RunnerConfig []string       `json:"runner_config"`
	Canaries     []canary.Plant `json:"canaries"`
	Cheat        *cheatConfig   `json:"cheat,omitempty"`
	MaxChanges   int            `json:"max_changes"`
	// Reference asks for the gold tree (gold.patch is staged beside the submission).
	Reference bool `json:"reference,omitempty"`
}

type cheatConfig struct {
	Module string `json:"module"`
	Source string `json:"source"`
}

// TestRoots are the directories the official tests own: for each official test file, the
// top-most directory on its path named tests or test. Files outside any such directory are
// owned one by one.
func TestRoots(files []string) []string {
	set := map[string]bool{}
	for _, f := range files {
		parts := strings.Split(f, "/")
		for i, p := range parts[:len(parts)-1] {
			if p == "tests" || p == "test" {
				set[strings.Join(parts[:i+1], "/")] = true
				break
			}
		}
	}
	out := make([]string, 0, len(set))
	for r := range set {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}

// StageApply writes the setup phase's read-only inputs; files are the official test files.
// With reference set, the setup script also writes the gold tree (see Reference).
func StageApply(dir string, t *task.Task, files []string, patch []byte, c *canary.Set, ch *cheat.Cheat, reference bool) error {
	tp, err := os.ReadFile(t.TestPatchFile())
	if err != nil {
		return fmt.Errorf("task %s: %w", t.ID, err)
	}
	cfg := applyConfig{Base: t.Repo.BaseCommit, TestRoots: TestRoots(files), Official: files,
		RunnerConfig: runnerConfig, MaxChanges: MaxChanges, Reference: reference}
	staged := map[string][]byte{}
	if reference {
		gold, err := os.ReadFile(t.GoldFile())
		if err != nil {
			return fmt.Errorf("task %s: %w", t.ID, err)
		}
		staged["gold.patch"] = gold
	}
	if c != nil {
		cfg.Canaries = c.Plants
	}
	if ch != nil {
		cfg.Cheat = &cheatConfig{Module: ch.Module, Source: ch.Source}
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	staged["apply.json"], staged["apply.py"], staged["submission.patch"], staged["tests.patch"] = js, setupScript, patch, tp
	staged[canary.PlanterModule+".py"] = canary.Planter
	return writeFiles(dir, staged)
}

// StageTests writes the official tests phase's inputs: the report plugin and the rank
// launcher. The ids to run go through the report channel (OpenReportChannel), never a file.
func StageTests(dir string) error {
	return writeFiles(dir, map[string][]byte{ReportPluginName + ".py": reportPlugin, "launch.py": launchScript})
}

// StageProbes writes the probe phases' inputs: the report plugin, the judge library and the
// harness's own pytest configuration.
func StageProbes(dir string) error {
	return writeFiles(dir, map[string][]byte{
		ReportPluginName + ".py":    reportPlugin,
		judge.LibraryModule + ".py": judge.Library,
		judge.CollectModule + ".py": judge.CollectPlugin,
		"check_probes.py":           judge.CheckScript,
		"probes.ini":                []byte("[pytest]\n"),
	})
}

func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
