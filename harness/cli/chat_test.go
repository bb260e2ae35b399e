package cli_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	openai "github.com/sashabaranov/go-openai"

	"github.com/infradev/infradev/harness/agent"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
)

// chatServer is an OpenAI-compatible chat-completions server on loopback that replays a fixed
// conversation: reply i answers the request holding i assistant turns. It checks the API key,
// that every tool call was answered, and reports usage of 100 prompt and 10 completion tokens
// per reply.
type chatServer struct {
	t       *testing.T
	key     string
	replies func(turn int, req openai.ChatCompletionRequest) openai.ChatCompletionMessage
	mu      sync.Mutex
	reqs    []openai.ChatCompletionRequest
}

func (s *chatServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer "+s.key {
		http.Error(w, "wrong path or key", http.StatusUnauthorized)
		return
	}
	var req openai.ChatCompletionRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	turn, open := 0, map[string]bool{}
	for _, m := range req.Messages {
		switch m.Role {
		case openai.ChatMessageRoleAssistant:
			turn++
			for _, c := range m.ToolCalls {
				open[c.ID] = true
			}
		case openai.ChatMessageRoleTool:
			delete(open, m.ToolCallID)
		}
	}
	if len(open) > 0 {
		http.Error(w, fmt.Sprintf("tool calls without results: %v", open), http.StatusBadRequest)
		return
	}
	_ = json.NewEncoder(w).Encode(openai.ChatCompletionResponse{
		ID: fmt.Sprintf("r%d", turn), Object: "chat.completion", Model: req.Model,
		Choices: []openai.ChatCompletionChoice{{Index: 0, Message: s.replies(turn, req), FinishReason: openai.FinishReasonToolCalls}},
		Usage:   openai.Usage{PromptTokens: 100, CompletionTokens: 10, TotalTokens: 110},
	})
}

func bash(id, command string) openai.ChatCompletionMessage {
	args, _ := json.Marshal(map[string]string{"command": command})
	return openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, ToolCalls: []openai.ToolCall{{
		ID: id, Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "bash", Arguments: string(args)}}}}
}

const chatAgent = `schema: infradev.agent/v1
name: %s
description: the built-in agent against a scripted server
chat:
  base_url: http://127.0.0.1:9/v1
  base_url_env: INFRADEV_TEST_CHAT_URL
  model: scripted
  api_key_env: INFRADEV_TEST_CHAT_KEY
  price: {input_per_mtok: 2.5, output_per_mtok: 10}
  command_timeout: 1m
budget: {wall: 5m, steps: %d}
`

// TestBuiltinAgentCompletesADemoTask drives the built-in agent with a scripted server that
// replays a conversation solving minitron-0001 (look, apply the fix, try the network, submit):
// the attempt is resolved, its transcript holds every request, reply and command, its tokens
// and cost come from the usage fields, the key never reaches the run folder, and the
// sandbox's network is absent (the command that dials the server fails). A second agent whose
// model never stops runs out of its step budget.
func TestBuiltinAgentCompletesADemoTask(t *testing.T) {
	requireSandbox(t)
	root := repoRoot(t)
	gold, err := os.ReadFile(filepath.Join(root, "tasks", "demo", "minitron-0001", "gold.patch"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &chatServer{t: t, key: "sk-test-4f1c9a"}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	dial := fmt.Sprintf(`python3 -c "import socket; socket.create_connection(('127.0.0.1', %s), timeout=3)"`, hs.Listener.Addr().(interface{ String() string }).String()[len("127.0.0.1:"):])
	srv.replies = func(turn int, req openai.ChatCompletionRequest) openai.ChatCompletionMessage {
		if req.Model == "scripted" && len(req.Messages) > 0 && strings.Contains(req.Messages[1].Content, "never-stops") {
			return bash(fmt.Sprintf("c%d", turn), "echo again")
		}
		switch turn {
		case 0:
			return bash("c0", "git status --short && ls")
		case 1:
			return bash("c1", "cat > /tmp/fix.patch <<'EOF'\n"+string(gold)+"EOF\ngit apply /tmp/fix.patch && git diff --stat")
		case 2:
			return bash("c2", dial)
		default:
			return openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, ToolCalls: []openai.ToolCall{{
				ID: "c3", Type: openai.ToolTypeFunction, Function: openai.FunctionCall{Name: "submit", Arguments: "{}"}}}}
		}
	}
	t.Setenv("INFRADEV_TEST_CHAT_URL", hs.URL+"/v1")
	t.Setenv("INFRADEV_TEST_CHAT_KEY", srv.key)
	agents, out := t.TempDir(), t.TempDir()
	for name, steps := range map[string]int{"builtin": 10, "never-stops": 2} {
		if err := os.MkdirAll(filepath.Join(agents, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(agents, name, "agent.yaml"), []byte(fmt.Sprintf(chatAgent, name, steps)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The looping agent's prompt is told apart by the server through the skill variant's text.
	skill := filepath.Join(t.TempDir(), "skill")
	if err := os.MkdirAll(skill, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(skill, "SKILL.md"), []byte("---\nname: never-stops\ndescription: x\n---\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	agentRun := func(name, variant string) string {
		args := append(storeFlags(t), "agent", "run", "--agent", filepath.Join(agents, name), "--run-id", "chat",
			"--out", out, "--results", "", "--tasks", "minitron-0001", "--prompt-variant", variant, "--skill", skill,
			"--tasks-root", filepath.Join(root, "tasks"), "--probes", filepath.Join(root, "probes"),
			"--environments", filepath.Join(root, "environments"))
		code, stdout, stderr := infradev(t, args...)
		if code != 0 {
			t.Fatalf("agent run %s: exit %d\n%s\n%s", name, code, stdout, stderr)
		}
		return stderr
	}
	agentRun("builtin", "instruction")
	agentRun("never-stops", "instruction+skill")
	// The same skill again: the attempt is finished. Another skill: it is another prompt, so the
	// attempt runs again.
	if stderr := agentRun("never-stops", "instruction+skill"); !strings.Contains(stderr, "(resumed)") {
		t.Errorf("rerun with the same skill: want the attempt resumed\n%s", stderr)
	}
	if err := os.WriteFile(filepath.Join(skill, "SKILL.md"), []byte("---\nname: never-stops\ndescription: y\n---\nmore\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if stderr := agentRun("never-stops", "instruction+skill"); !strings.Contains(stderr, "(ran)") {
		t.Errorf("rerun with another skill: want the attempt run again\n%s", stderr)
	}
	runDir := filepath.Join(out, "chat")
	stored, err := report.LoadRun(runDir)
	if err != nil || len(stored) != 2 {
		t.Fatalf("results: %d, %v", len(stored), err)
	}
	for _, s := range stored {
		r := s.Result
		switch r.Model {
		case "builtin":
			if !r.Resolved {
				t.Errorf("builtin: not resolved: %s %s", r.FailureClass, r.Reason)
			}
		case "never-stops":
			if r.FailureClass != result.OfficialTestsFailed || r.PromptVariant != "instruction+skill" {
				t.Errorf("never-stops: %s (%s), want official_tests_failed under instruction+skill", r.FailureClass, r.PromptVariant)
			}
		}
	}
	dir := filepath.Join(runDir, "agent", "builtin@instruction@1", "minitron-0001")
	var rec agent.Record
	data, err := os.ReadFile(filepath.Join(dir, "agent.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	o := rec.Outcome
	if o.Status != agent.Completed || o.Steps != 4 || o.Usage.PromptTokens != 400 || o.Usage.CompletionTokens != 40 || o.Usage.Requests != 4 {
		t.Errorf("builtin outcome = %+v, want completed after 4 turns with 400+40 tokens", o)
	}
	if want := (400*2.5 + 40*10) / 1e6; o.CostUSD != want {
		t.Errorf("cost = %v, want %v", o.CostUSD, want)
	}
	// The transcript: the opening request, then per turn a reply and its command's result.
	var kinds []string
	var dialExit *int
	dialOutput := ""
	f, err := os.Open(filepath.Join(dir, "transcript.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var ev struct {
			Kind    string `json:"kind"`
			Command string `json:"command"`
			Exit    *int   `json:"exit_code"`
			Output  string `json:"output"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, ev.Kind)
		if ev.Command == dial {
			dialExit, dialOutput = ev.Exit, ev.Output
		}
	}
	if got := strings.Join(kinds, ","); got != "request,reply,tool,reply,tool,reply,tool,reply" {
		t.Errorf("transcript events = %s", got)
	}
	// The sandbox's own loopback has no listener and no route out: the host's server is not there.
	if dialExit == nil || *dialExit == 0 || !(strings.Contains(dialOutput, "Connection refused") || strings.Contains(dialOutput, "Network is unreachable")) {
		t.Errorf("dialling the server from the sandbox: output %q, want a failure: no network", dialOutput)
	}
	var loop agent.Record
	data, err = os.ReadFile(filepath.Join(runDir, "agent", "never-stops@instruction%2Bskill@1", "minitron-0001", "agent.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &loop); err != nil {
		t.Fatal(err)
	}
	if loop.Outcome.Status != agent.BudgetExceeded || loop.Outcome.Steps != 2 {
		t.Errorf("never-stops: %+v, want budget_exceeded after 2 turns", loop.Outcome)
	}
	// The key was sent to the server from the host, and written nowhere.
	_ = filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(srv.key)) {
				t.Errorf("%s holds the API key", p)
			}
		}
		return nil
	})
}
