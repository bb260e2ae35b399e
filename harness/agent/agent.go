// Package agent owns running a coding agent on one task: a sandbox over the task's image (and
// the agent's own layers) with the repository at its base commit and writable, the prompt in a
// read-only file, the probes and official tests absent, wall-clock and step budgets, and no
// network unless the agent's definition asks for it. When the agent stops, the workspace's
// diff is captured (binary-safe, .git and ignored files left out) as its submission, and the
// transcript, logs and token counts are kept in the attempt's folder. Grading is not its
// business: the submission goes to package eval like any other.
//
// Two kinds of agent: a command agent (any CLI installed into the agent's layers, run once,
// non-interactively) and the built-in agent (package agent's Chat), which talks to an
// OpenAI-compatible API from the host and runs the model's shell commands in the sandbox, so
// credentials and the network never enter it.
package agent

import (
	"context"
	"time"
)

// Agent works on a task in a workspace until it is done or out of budget. An error is an
// infrastructure fault (the sandbox failed, the model service could not be reached): the
// attempt is not graded and runs again on resume. Whatever the agent itself does, including
// failing, is an Outcome.
type Agent interface {
	Solve(ctx context.Context, ws *Workspace, j Job) (*Outcome, error)
}

// Job is one attempt's brief.
type Job struct {
	// TaskID names the task and Attempt the attempt (given to command agents as
	// $INFRADEV_TASK_ID and $INFRADEV_ATTEMPT).
	TaskID  string
	Attempt int
	// Prompt is the prompt's text (the same as the file at PromptDir/prompt.md).
	Prompt string
	// Out is the attempt's folder on the host: transcript and logs go there.
	Out string
	// Wall and Steps are the budgets (0 steps: no step limit).
	Wall  time.Duration
	Steps int
}

// Outcome statuses.
const (
	// Completed: the agent said it was done (exit 0, or the built-in agent's submit).
	Completed = "completed"
	// BudgetExceeded: the wall-clock or step budget ran out; what the workspace holds by then
	// is still the submission.
	BudgetExceeded = "budget_exceeded"
	// Failed: the agent itself failed (non-zero exit, out of memory); its workspace is still
	// the submission.
	Failed = "failed"
	// Error: an infrastructure fault; nothing is graded.
	Error = "error"
)

// Outcome is what an agent's run did.
type Outcome struct {
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	ExitCode int    `json:"exit_code"`
	// Steps are the built-in agent's model turns (a command agent's are its own business).
	Steps int   `json:"steps"`
	Usage Usage `json:"usage"`
	// CostUSD is the tokens' price under the agent's configured prices.
	CostUSD float64 `json:"cost_usd"`
}

// Usage is tokens as the API reported them in its usage fields.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	Requests         int `json:"requests"`
}
