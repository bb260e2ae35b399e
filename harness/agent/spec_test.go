package agent_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/agent"
)

func writeSpec(t *testing.T, name, body string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestLoadSpec(t *testing.T) {
	dir := writeSpec(t, "chat", `schema: infradev.agent/v1
name: chat
chat:
  base_url: http://127.0.0.1:8000/v1
  model: m
  api_key_env: KEY
budget: {wall: 90s, steps: 30}
`)
	s, err := agent.LoadSpec(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Wall != 90*time.Second || s.Network != "none" || s.CommandTimeout != 10*time.Minute || s.Chat.OutputLimit != 16<<10 || !strings.HasPrefix(s.Digest, "sha256:") {
		t.Errorf("spec = %+v, want defaults filled in", s)
	}
}

// Every problem is named with file, line and field.
func TestLoadSpecErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"schema: infradev.agent/v1\nname: x\nbudget: {wall: 1m}\n", "agent.yaml:1: command: an agent needs a command or a chat section"},
		{"schema: infradev.agent/v1\nname: x\ncommand: [a]\nnetwork: lan\nbudget: {wall: 1m}\n", "agent.yaml:4: network: must be none or host"},
		{"schema: infradev.agent/v1\nname: x\ncommand: [a]\nenv: [API_KEY]\nbudget: {wall: 1m}\n", "agent.yaml:4: env: credentials are only useful with network: host"},
		{"schema: infradev.agent/v1\nname: x\ncommand: [a]\nbudget: {wall: soon}\n", "agent.yaml:4: budget.wall:"},
		{"schema: infradev.agent/v1\nname: x\ncommand: [a]\ninstall:\n  - name: d\n    debian: {suite: bookworm}\nbudget: {wall: 1m}\n", "agent.yaml:5: install[0]: must be one copy, run, apt or pip step"},
		{"schema: infradev.agent/v1\nname: y\ncommand: [a]\nbudget: {wall: 1m}\n", `agent.yaml:2: name: must be the directory's name "x"`},
		{"schema: infradev.agent/v1\nname: x\ncommand: [a]\nbudget: {wall: 1m}\ntimeout: 3\n", "agent.yaml:5: timeout:"},
		{"schema: infradev.agent/v1\nname: x\nchat: {base_url: u, model: m}\nbudget: {wall: 1m}\n", "budget.steps: must be positive for the built-in agent"},
	} {
		_, err := agent.LoadSpec(writeSpec(t, "x", tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadSpec(%q) = %v, want an error containing %q", tc.body, err, tc.want)
		}
	}
}

// The recipes in agents/ are valid definitions.
func TestRecipesLoad(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "..", "agents", "*", "agent.yaml"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("recipes: %v %v", dirs, err)
	}
	for _, f := range dirs {
		if _, err := agent.LoadSpec(filepath.Dir(f)); err != nil {
			t.Errorf("%v", err)
		}
	}
}
