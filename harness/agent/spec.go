package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/specfile"
)

// SpecSchema is the schema version of agent.yaml.
const SpecSchema = "infradev.agent/v1"

// Spec is an agent definition: agents/<name>/agent.yaml. Exactly one of Command and Chat is
// set.
type Spec struct {
	Schema      string `yaml:"schema"`
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Command is a CLI run once, non-interactively, in the workspace (the repository), with
	// the prompt's path in $INFRADEV_PROMPT.
	Command []string `yaml:"command"`
	// Chat is the built-in agent, driven from the host over an OpenAI-compatible API.
	Chat *ChatSpec `yaml:"chat"`
	// Install are layers over the task's environment holding the agent's tools (the
	// environment steps copy, run, apt and pip); built once per environment and cached.
	Install []envspec.Step `yaml:"install"`
	// Network is "none" (the default: only a loopback that is down) or "host". The built-in
	// agent never needs it: its requests leave from the host.
	Network string `yaml:"network"`
	// Env names host variables passed into the sandbox (a command agent's credentials); their
	// values are never written to the run folder.
	Env []string `yaml:"env"`
	// Budget bounds one attempt.
	Budget Budget `yaml:"budget"`

	// Dir is the directory holding agent.yaml.
	Dir string `yaml:"-"`
	// Digest covers agent.yaml and every file under Dir: a changed agent is another agent.
	Digest string `yaml:"-"`
	// Wall is Budget.Wall parsed; CommandTimeout is Chat.CommandTimeout parsed.
	Wall, CommandTimeout time.Duration `yaml:"-"`
}

// ChatSpec configures the built-in agent.
type ChatSpec struct {
	// BaseURL is the API's base (e.g. https://api.openai.com/v1); BaseURLEnv names a host
	// variable that overrides it.
	BaseURL    string `yaml:"base_url"`
	BaseURLEnv string `yaml:"base_url_env"`
	Model      string `yaml:"model"`
	// APIKeyEnv names the host variable holding the API key (it stays on the host).
	APIKeyEnv string `yaml:"api_key_env"`
	// MaxTokens bounds each reply; 0 leaves it to the server.
	MaxTokens   int     `yaml:"max_tokens"`
	Temperature float64 `yaml:"temperature"`
	// Price is US dollars per million input and output tokens, for the recorded cost.
	Price Price `yaml:"price"`
	// CommandTimeout bounds each shell command the model runs. Default 10m.
	CommandTimeoutText string `yaml:"command_timeout"`
	// OutputLimit bounds the bytes of each command's output shown to the model. Default 16KiB.
	OutputLimit int `yaml:"output_limit"`
}

// Price is what tokens cost.
type Price struct {
	InputPerMTok  float64 `yaml:"input_per_mtok" json:"input_per_mtok"`
	OutputPerMTok float64 `yaml:"output_per_mtok" json:"output_per_mtok"`
}

// Budget bounds an attempt: wall-clock time and steps (the built-in agent's model turns; a
// command agent gets the number as $INFRADEV_MAX_STEPS for its own turn limit).
type Budget struct {
	WallText string `yaml:"wall"`
	Steps    int    `yaml:"steps"`
}

var nameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
var envNameRe = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

// LoadSpec reads and checks dir/agent.yaml; every problem is reported with file, line and field.
func LoadSpec(dir string) (*Spec, error) {
	s := &Spec{}
	file := filepath.Join(dir, "agent.yaml")
	doc := specfile.ReadFile(file, s)
	if !doc.Parsed() {
		return nil, doc.Errs.Err()
	}
	s.Dir = dir
	if s.Schema != SpecSchema {
		doc.Errorf("schema", "must be %q, got %q", SpecSchema, s.Schema)
	}
	if !nameRe.MatchString(s.Name) {
		doc.Errorf("name", "must match %s, got %q", nameRe, s.Name)
	} else if base := filepath.Base(dir); base != s.Name {
		doc.Errorf("name", "must be the directory's name %q, got %q", base, s.Name)
	}
	switch {
	case len(s.Command) == 0 && s.Chat == nil:
		doc.Errorf("command", "an agent needs a command or a chat section")
	case len(s.Command) > 0 && s.Chat != nil:
		doc.Errorf("chat", "an agent has a command or a chat section, not both")
	}
	if c := s.Chat; c != nil {
		if c.Model == "" {
			doc.Errorf("chat.model", "is required")
		}
		if c.BaseURL == "" && c.BaseURLEnv == "" {
			doc.Errorf("chat.base_url", "is required (or base_url_env)")
		}
		for f, v := range map[string]string{"chat.api_key_env": c.APIKeyEnv, "chat.base_url_env": c.BaseURLEnv} {
			if v != "" && !envNameRe.MatchString(v) {
				doc.Errorf(f, "must name an environment variable, got %q", v)
			}
		}
		if c.Price.InputPerMTok < 0 || c.Price.OutputPerMTok < 0 {
			doc.Errorf("chat.price", "must not be negative")
		}
		s.CommandTimeout = 10 * time.Minute
		if c.CommandTimeoutText != "" {
			d, err := specfile.ParseDuration(c.CommandTimeoutText)
			if err != nil {
				doc.Errorf("chat.command_timeout", "%v", err)
			}
			s.CommandTimeout = d
		}
		if c.OutputLimit == 0 {
			c.OutputLimit = 16 << 10
		}
		if len(s.Install) > 0 {
			doc.Errorf("install", "the built-in agent runs from the host and installs nothing")
		}
	}
	switch s.Network {
	case "":
		s.Network = "none"
	case "none", "host":
	default:
		doc.Errorf("network", "must be none or host, got %q", s.Network)
	}
	for i, e := range s.Env {
		if !envNameRe.MatchString(e) || strings.HasPrefix(e, "INFRADEV_") {
			doc.Errorf(fmt.Sprintf("env[%d]", i), "must name a host variable (not INFRADEV_*), got %q", e)
		}
	}
	if len(s.Env) > 0 && s.Network != "host" {
		doc.Errorf("env", "credentials are only useful with network: host")
	}
	for i, st := range s.Install {
		at := fmt.Sprintf("install[%d]", i)
		switch st.Kind() {
		case "copy", "run", "apt", "pip":
		default:
			doc.Errorf(at, "must be one copy, run, apt or pip step, got %q", st.Kind())
		}
		if st.Name == "" {
			doc.Errorf(at+".name", "is required")
		}
		s.Install[i].Dir = dir
	}
	if s.Budget.WallText == "" {
		doc.Errorf("budget.wall", "is required (e.g. 30m)")
	} else if d, err := specfile.ParseDuration(s.Budget.WallText); err != nil {
		doc.Errorf("budget.wall", "%v", err)
	} else {
		s.Wall = d
	}
	if s.Budget.Steps < 0 || (s.Chat != nil && s.Budget.Steps == 0) {
		doc.Errorf("budget.steps", "must be positive for the built-in agent, got %d", s.Budget.Steps)
	}
	if err := doc.Errs.Err(); err != nil {
		return nil, err
	}
	d, err := digest.Files(dir, nil)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", dir, err)
	}
	s.Digest = d
	return s, nil
}

// Find returns the agent named name under root (root/<name>/agent.yaml), or one given by path.
func Find(root, name string) (*Spec, error) {
	dir := name
	if !strings.ContainsRune(name, '/') {
		dir = filepath.Join(root, name)
	}
	if _, err := os.Stat(filepath.Join(dir, "agent.yaml")); err != nil {
		return nil, fault.Inputf("agent %q: no %s", name, filepath.Join(dir, "agent.yaml"))
	}
	return LoadSpec(dir)
}
