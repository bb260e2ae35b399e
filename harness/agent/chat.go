package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"
)

// Chat is the built-in agent: a loop over an OpenAI-compatible chat-completions API, run from
// the host. The model has two tools, bash (one command, run in the workspace without the
// network) and submit. Every request and reply goes to transcript.jsonl, and tokens are
// counted from the replies' usage fields.
type Chat struct {
	Spec *Spec
	// Getenv reads the API key and base URL variables. Default os.Getenv.
	Getenv func(string) string
	// HTTP is the client for the API. Default http.DefaultClient.
	HTTP *http.Client
	// Retries is how often a failed request is tried again (5xx, 429, transport errors), with
	// 1s, 2s, 4s... between. Default 3.
	Retries int
	// Sleep waits between retries. Default time.Sleep honouring ctx.
	Sleep func(context.Context, time.Duration)
}

// SystemPrompt tells the model how to work. It is the same for every prompt variant.
const SystemPrompt = `You are a software engineer working in a git repository inside a sandbox without network access.
Use the bash tool to inspect files, edit them and run commands; each call runs in a fresh shell whose
working directory is the repository, and files you change persist between calls. When the change is
complete, call the submit tool. Your work is collected as the diff of the repository's files.`

var tools = []openai.Tool{
	{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
		Name:        "bash",
		Description: "Run one bash command in the repository and return its exit status and output.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"command":{"type":"string","description":"the command"}},"required":["command"]}`),
	}},
	{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
		Name:        "submit",
		Description: "Finish: the repository's current state is the submission.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{}}`),
	}},
}

// event is one line of transcript.jsonl.
type event struct {
	Step    int                            `json:"step"`
	Time    time.Time                      `json:"time"`
	Kind    string                         `json:"kind"` // request, reply, tool, error
	Message *openai.ChatCompletionMessage  `json:"message,omitempty"`
	Usage   *openai.Usage                  `json:"usage,omitempty"`
	Command string                         `json:"command,omitempty"`
	Exit    *int                           `json:"exit_code,omitempty"`
	Timeout bool                           `json:"timed_out,omitempty"`
	Wall    float64                        `json:"wall_seconds,omitempty"`
	Output  string                         `json:"output,omitempty"`
	Error   string                         `json:"error,omitempty"`
	Request []openai.ChatCompletionMessage `json:"messages,omitempty"`
}

// Solve implements Agent.
func (c Chat) Solve(ctx context.Context, ws *Workspace, j Job) (*Outcome, error) {
	get := c.Getenv
	if get == nil {
		get = os.Getenv
	}
	cs := c.Spec.Chat
	base := cs.BaseURL
	if cs.BaseURLEnv != "" && get(cs.BaseURLEnv) != "" {
		base = get(cs.BaseURLEnv)
	}
	key := ""
	if cs.APIKeyEnv != "" {
		if key = get(cs.APIKeyEnv); key == "" {
			return nil, fmt.Errorf("the agent's API key: $%s is not set", cs.APIKeyEnv)
		}
	}
	cfg := openai.DefaultConfig(key)
	cfg.BaseURL = strings.TrimSuffix(base, "/")
	if c.HTTP != nil {
		cfg.HTTPClient = c.HTTP
	}
	client := openai.NewClientWithConfig(cfg)

	tr, err := os.Create(filepath.Join(j.Out, "transcript.jsonl"))
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	enc := json.NewEncoder(tr)
	record := func(e event) error {
		e.Time = time.Now().UTC()
		return enc.Encode(e)
	}

	ctx, cancel := context.WithTimeout(ctx, j.Wall)
	defer cancel()
	msgs := []openai.ChatCompletionMessage{
		{Role: openai.ChatMessageRoleSystem, Content: SystemPrompt},
		{Role: openai.ChatMessageRoleUser, Content: j.Prompt},
	}
	if err := record(event{Kind: "request", Request: msgs}); err != nil {
		return nil, err
	}
	o := &Outcome{}
	budgetOut := func() (*Outcome, error) {
		o.Status, o.Reason = BudgetExceeded, fmt.Sprintf("the wall-clock budget of %s ran out", j.Wall)
		return o, nil
	}
	for {
		if j.Steps > 0 && o.Steps >= j.Steps {
			o.Status, o.Reason = BudgetExceeded, fmt.Sprintf("the step budget of %d model turns ran out", j.Steps)
			return o, nil
		}
		o.Steps++
		resp, err := c.complete(ctx, client, openai.ChatCompletionRequest{
			Model: cs.Model, Messages: msgs, Tools: tools, MaxTokens: cs.MaxTokens, Temperature: float32(cs.Temperature),
		})
		if err != nil {
			if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return budgetOut()
			}
			_ = record(event{Step: o.Steps, Kind: "error", Error: err.Error()})
			return nil, fmt.Errorf("the model service (%s): %w", cfg.BaseURL, err)
		}
		o.Usage.Requests++
		o.Usage.PromptTokens += resp.Usage.PromptTokens
		o.Usage.CompletionTokens += resp.Usage.CompletionTokens
		o.Usage.TotalTokens += resp.Usage.TotalTokens
		o.CostUSD = (float64(o.Usage.PromptTokens)*cs.Price.InputPerMTok + float64(o.Usage.CompletionTokens)*cs.Price.OutputPerMTok) / 1e6
		if len(resp.Choices) == 0 {
			return nil, fmt.Errorf("the model service (%s) replied with no choices", cfg.BaseURL)
		}
		msg := resp.Choices[0].Message
		usage := resp.Usage
		if err := record(event{Step: o.Steps, Kind: "reply", Message: &msg, Usage: &usage}); err != nil {
			return nil, err
		}
		msgs = append(msgs, msg)
		if len(msg.ToolCalls) == 0 {
			o.Status, o.Reason = Completed, "the model replied without a tool call"
			return o, nil
		}
		for _, call := range msg.ToolCalls {
			if call.Function.Name == "submit" {
				o.Status = Completed
				return o, nil
			}
			out, ev, err := c.tool(ctx, ws, call)
			if err != nil {
				if ctx.Err() != nil {
					return budgetOut()
				}
				return nil, err
			}
			ev.Step = o.Steps
			if err := record(ev); err != nil {
				return nil, err
			}
			msgs = append(msgs, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleTool, ToolCallID: call.ID, Content: out})
		}
		if ctx.Err() != nil {
			return budgetOut()
		}
	}
}

// tool runs one tool call and returns what the model is shown.
func (c Chat) tool(ctx context.Context, ws *Workspace, call openai.ToolCall) (string, event, error) {
	if call.Function.Name != "bash" {
		msg := fmt.Sprintf("unknown tool %q: the tools are bash and submit", call.Function.Name)
		return msg, event{Kind: "tool", Error: msg}, nil
	}
	var args struct {
		Command string `json:"command"`
	}
	if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil || args.Command == "" {
		msg := "the bash tool takes {\"command\": \"...\"}"
		return msg, event{Kind: "tool", Error: msg}, nil
	}
	limit := c.Spec.Chat.OutputLimit
	var out headTail
	out.limit = limit
	r, err := ws.Run(ctx, Exec{Args: []string{"/bin/bash", "-c", args.Command}, Timeout: c.Spec.CommandTimeout, Stdout: &out, Stderr: &out})
	if err != nil {
		return "", event{}, fmt.Errorf("running a command: %w", err)
	}
	text := out.String()
	exit := r.ExitCode
	ev := event{Kind: "tool", Command: args.Command, Exit: &exit, Timeout: r.TimedOut, Wall: r.Wall.Seconds(), Output: text}
	status := fmt.Sprintf("exit status %d", r.ExitCode)
	if r.TimedOut {
		status = fmt.Sprintf("timed out after %s", c.Spec.CommandTimeout)
	}
	return status + "\n" + text, ev, nil
}

// complete sends one request, retrying what a service says is worth retrying.
func (c Chat) complete(ctx context.Context, client *openai.Client, req openai.ChatCompletionRequest) (openai.ChatCompletionResponse, error) {
	retries := c.Retries
	if retries == 0 {
		retries = 3
	}
	sleep := c.Sleep
	if sleep == nil {
		sleep = func(ctx context.Context, d time.Duration) {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
	}
	var err error
	for i := 0; ; i++ {
		var resp openai.ChatCompletionResponse
		resp, err = client.CreateChatCompletion(ctx, req)
		if err == nil || i >= retries || !retryable(err) || ctx.Err() != nil {
			return resp, err
		}
		sleep(ctx, time.Duration(1<<i)*time.Second)
	}
}

func retryable(err error) bool {
	var api *openai.APIError
	if errors.As(err, &api) {
		return api.HTTPStatusCode == 429 || api.HTTPStatusCode >= 500
	}
	var re *openai.RequestError
	if errors.As(err, &re) {
		return re.HTTPStatusCode == 429 || re.HTTPStatusCode >= 500 || re.HTTPStatusCode == 0
	}
	return true // transport errors
}

// headTail keeps the first and last limit/2 bytes of what is written.
type headTail struct {
	limit      int
	head, tail []byte
	dropped    int
}

func (h *headTail) Write(p []byte) (int, error) {
	half := h.limit / 2
	n := len(p)
	if room := half - len(h.head); room > 0 {
		k := min(room, len(p))
		h.head = append(h.head, p[:k]...)
		p = p[k:]
	}
	h.tail = append(h.tail, p...)
	if over := len(h.tail) - (h.limit - half); over > 0 {
		h.dropped += over
		h.tail = append(h.tail[:0], h.tail[over:]...)
	}
	return n, nil
}

func (h *headTail) String() string {
	if h.dropped == 0 {
		return string(h.head) + string(h.tail)
	}
	return fmt.Sprintf("%s\n[... %d bytes left out ...]\n%s", h.head, h.dropped, h.tail)
}
