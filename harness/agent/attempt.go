package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/prepare"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/unpack"
)

// Prompt variants.
const (
	Instruction      = "instruction"
	PRDescription    = "pr_description"
	InstructionSkill = "instruction+skill"
)

// Variants are the prompt variants an agent can be given.
var Variants = []string{Instruction, PRDescription, InstructionSkill}

// RecordSchema is the schema version of an attempt's agent.json.
const RecordSchema = "infradev.agent-attempt/v1"

// Record is agent.json: what one attempt of an agent on a task did. The submission is
// patch.diff beside it.
type Record struct {
	Schema        string    `json:"schema"`
	Agent         string    `json:"agent"`
	AgentDigest   string    `json:"agent_digest"`
	InstanceID    string    `json:"instance_id"`
	PromptVariant string    `json:"prompt_variant"`
	PromptDigest  string    `json:"prompt_digest"`
	Attempt       int       `json:"attempt"`
	Image         string    `json:"image"`
	Network       string    `json:"network"`
	Outcome       Outcome   `json:"outcome"`
	PatchBytes    int       `json:"patch_bytes"`
	PatchDigest   string    `json:"patch_digest,omitempty"`
	WallSeconds   float64   `json:"wall_seconds"`
	StartedAt     time.Time `json:"started_at"`
	FinishedAt    time.Time `json:"finished_at"`
}

// Runner runs attempts of agents on tasks.
type Runner struct {
	Sandbox sandbox.Sandbox
	Cache   unpack.Cache
	// Scratch holds workspaces; it must not be on overlayfs.
	Scratch string
	// Prep prepares tasks' images and derived files; its store also holds agents' layers.
	Prep *prepare.Preparer
	// Getenv reads host variables (credentials). Default os.Getenv.
	Getenv func(string) string
	// MaxPatchBytes bounds a captured diff. Default 16 MiB (what the runner accepts).
	MaxPatchBytes int64
	// Agent makes the Agent for a spec. Default: Command or Chat by the spec's kind.
	Agent func(*Spec) Agent
}

// Attempt is one attempt to run.
type Attempt struct {
	Spec    *Spec
	Task    *task.Task
	Variant string
	// Skill is the skill folder (SKILL.md and what it refers to) for the instruction+skill
	// variant.
	Skill   string
	Attempt int
	// Out is the attempt's folder.
	Out string
}

// Finished returns the record in an attempt's folder when it holds a finished attempt (any
// outcome but an infrastructure error) with its patch, else nil.
func Finished(out string) *Record {
	data, err := os.ReadFile(filepath.Join(out, "agent.json"))
	if err != nil {
		return nil
	}
	var r Record
	if json.Unmarshal(data, &r) != nil || r.Schema != RecordSchema || r.Outcome.Status == Error {
		return nil
	}
	if _, err := os.Stat(filepath.Join(out, "patch.diff")); err != nil {
		return nil
	}
	return &r
}

// Run runs one attempt and writes agent.json, patch.diff, prompt.md and the agent's
// transcript and logs to a.Out. An attempt that ends in an infrastructure fault is recorded
// with status error (and the error returned); it is run again next time.
func (r *Runner) Run(ctx context.Context, a Attempt) (*Record, error) {
	if err := os.RemoveAll(a.Out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(a.Out, 0o755); err != nil {
		return nil, err
	}
	rec := &Record{Schema: RecordSchema, Agent: a.Spec.Name, AgentDigest: a.Spec.Digest, InstanceID: a.Task.ID,
		PromptVariant: a.Variant, Attempt: a.Attempt, Network: a.Spec.Network, StartedAt: time.Now().UTC()}
	fail := func(err error) (*Record, error) {
		rec.Outcome = Outcome{Status: Error, Reason: err.Error()}
		rec.FinishedAt = time.Now().UTC()
		rec.WallSeconds = rec.FinishedAt.Sub(rec.StartedAt).Seconds()
		if werr := atomicfile.WriteJSON(filepath.Join(a.Out, "agent.json"), rec); werr != nil {
			return nil, werr
		}
		return rec, err
	}
	lowers, cfg, manifest, err := r.layers(ctx, a)
	if err != nil {
		return fail(err)
	}
	rec.Image = manifest
	promptDir := filepath.Join(a.Out, "prompt")
	prompt, pd, err := r.writePrompt(a, promptDir)
	if err != nil {
		return fail(err)
	}
	rec.PromptDigest = pd
	t := a.Task
	ws, err := OpenWorkspace(r.Sandbox, r.Scratch, WorkspaceSpec{
		Lowers: lowers, Env: cfg, Repo: t.Repo.Path, Base: t.Repo.BaseCommit, PromptDir: promptDir,
		Limits:    sandbox.Limits{MemoryBytes: t.Resources.MemoryBytes, Pids: int64(max(t.Resources.Pids, 4096)), CPUs: t.Resources.CPUs},
		DiskBytes: t.Resources.DiskBytes,
	})
	if err != nil {
		return fail(err)
	}
	defer ws.Close()
	ag := r.agent(a.Spec)
	o, err := ag.Solve(ctx, ws, Job{TaskID: t.ID, Attempt: a.Attempt, Prompt: prompt, Out: a.Out, Wall: a.Spec.Wall, Steps: a.Spec.Budget.Steps})
	if err != nil {
		return fail(err)
	}
	if ctx.Err() != nil {
		return fail(fmt.Errorf("interrupted: %w", ctx.Err()))
	}
	limit := r.MaxPatchBytes
	if limit == 0 {
		limit = 16 << 20
	}
	patch, err := ws.Diff(ctx, limit)
	switch {
	case errors.Is(err, ErrCapture):
		// What the agent did to its repository made it unreadable: its doing, so it submits
		// nothing, and says why.
		o.Reason = join(o.Reason, err.Error())
		patch = nil
	case err != nil:
		return fail(err)
	}
	if err := atomicfile.Write(filepath.Join(a.Out, "patch.diff"), patch); err != nil {
		return nil, err
	}
	rec.Outcome = *o
	rec.PatchBytes = len(patch)
	if len(patch) > 0 {
		rec.PatchDigest = digest.Bytes(patch)
	}
	rec.FinishedAt = time.Now().UTC()
	rec.WallSeconds = rec.FinishedAt.Sub(rec.StartedAt).Seconds()
	return rec, atomicfile.WriteJSON(filepath.Join(a.Out, "agent.json"), rec)
}

func (r *Runner) agent(s *Spec) Agent {
	if r.Agent != nil {
		return r.Agent(s)
	}
	if s.Chat != nil {
		return Chat{Spec: s, Getenv: r.Getenv}
	}
	return Command{Spec: s, Getenv: r.Getenv}
}

// layers returns the workspace's layers: the task's image, then the agent's own layers, built
// over the task's environment (so they are shared by every task on it) and stacked above the
// repository, which they never touch.
func (r *Runner) layers(ctx context.Context, a Attempt) ([]string, []string, string, error) {
	manifest, err := r.Prep.Task(ctx, a.Task)
	if err != nil {
		return nil, nil, "", err
	}
	st := r.Prep.Store
	lowers, cfg, err := r.Cache.Stack(ctx, st.Layout(), manifest)
	if err != nil {
		return nil, nil, "", fmt.Errorf("the task's image: %w", err)
	}
	if len(a.Spec.Install) > 0 {
		env, err := envspec.Load(filepath.Join(r.Prep.EnvsRoot, a.Task.Environment))
		if err != nil {
			return nil, nil, "", err
		}
		e := *env
		e.Name = "agent-" + a.Spec.Name + "-" + env.Name
		e.Layers = append(append([]envspec.Step{}, env.Layers...), a.Spec.Install...)
		b, err := image.Build(ctx, &e, st, image.Options{Log: r.Prep.Log, Mirrors: r.Prep.Mirrors})
		if err != nil {
			return nil, nil, "", fmt.Errorf("the agent's layers: %w", err)
		}
		agentStack, _, err := r.Cache.Stack(ctx, st.Layout(), b.Manifest)
		if err != nil {
			return nil, nil, "", fmt.Errorf("the agent's layers: %w", err)
		}
		own := agentStack[len(agentStack)-len(a.Spec.Install):]
		lowers = append(lowers, own...)
		manifest += "+" + b.Manifest
	}
	return lowers, cfg.Config.Env, manifest, nil
}

// writePrompt writes the attempt's prompt folder (prompt.md, and skill/ for the
// instruction+skill variant) and returns the prompt's text and the folder's digest.
func (r *Runner) writePrompt(a Attempt, dir string) (string, string, error) {
	prompt, err := r.prompt(a)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "prompt.md"), []byte(prompt), 0o644); err != nil {
		return "", "", err
	}
	if a.Variant == InstructionSkill {
		if err := os.CopyFS(filepath.Join(dir, "skill"), os.DirFS(a.Skill)); err != nil {
			return "", "", fmt.Errorf("the skill %s: %w", a.Skill, err)
		}
	}
	d, err := digest.Files(dir, nil)
	return prompt, d, err
}

// PromptDigest is the digest of the prompt an attempt would be given now: a finished attempt
// made from another prompt (an edited instruction, a newer skill) is not this attempt.
func (r *Runner) PromptDigest(ctx context.Context, a Attempt) (string, error) {
	if a.Task.Upstream() {
		// The PR description of an upstream task is derived from its commits.
		if _, err := r.Prep.Task(ctx, a.Task); err != nil {
			return "", err
		}
	}
	tmp, err := os.MkdirTemp("", "infradev-prompt-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	_, d, err := r.writePrompt(a, filepath.Join(tmp, "prompt"))
	return d, err
}

// Preamble opens every prompt: where the work is and how it is collected. It is the same for
// every variant, so variants differ only in what describes the change.
const Preamble = `You are working in the git repository at %s, checked out at the commit your change starts from.
Make the change described below by editing the repository's files. When you stop, the repository's
changes (against that commit) are your submission; tests you add are part of it.

`

// prompt builds the variant's prompt text.
func (r *Runner) prompt(a Attempt) (string, error) {
	t := a.Task
	var file string
	switch a.Variant {
	case Instruction, InstructionSkill:
		file = t.File(t.Instruction)
	case PRDescription:
		file = t.PRDescriptionFile()
	default:
		return "", fmt.Errorf("prompt variant %q: must be one of %s", a.Variant, strings.Join(Variants, ", "))
	}
	body, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("task %s: the %s prompt: %w", t.ID, a.Variant, err)
	}
	p := fmt.Sprintf(Preamble, t.Repo.Path) + strings.TrimRight(string(body), "\n") + "\n"
	if a.Variant == InstructionSkill {
		skill, err := os.ReadFile(filepath.Join(a.Skill, "SKILL.md"))
		if err != nil {
			return "", fmt.Errorf("the skill: %w", err)
		}
		p += fmt.Sprintf("\n---\nA skill for this kind of change follows (also at %s/skill/SKILL.md).\n\n%s", PromptDir, skill)
	}
	return p, nil
}
