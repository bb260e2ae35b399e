package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/infradev/infradev/harness/logcap"
)

// Command is a command agent: Spec.Command run once in the workspace.
type Command struct {
	Spec *Spec
	// Getenv reads the host variables Spec.Env names. Default os.Getenv.
	Getenv func(string) string
}

// Solve implements Agent. The command's output goes to agent.log in the attempt's folder (its
// head and tail, 4 MiB each), and what it leaves in $INFRADEV_AGENT_LOGS to logs/.
func (c Command) Solve(ctx context.Context, ws *Workspace, j Job) (*Outcome, error) {
	get := c.Getenv
	if get == nil {
		get = os.Getenv
	}
	env := []string{"INFRADEV_TASK_ID=" + j.TaskID, fmt.Sprintf("INFRADEV_ATTEMPT=%d", j.Attempt), fmt.Sprintf("INFRADEV_MAX_STEPS=%d", j.Steps)}
	for _, name := range c.Spec.Env {
		if v, ok := lookup(get, name); ok {
			env = append(env, name+"="+v)
		}
	}
	log, err := logcap.Create(filepath.Join(j.Out, "agent.log"), 4<<20, 4<<20)
	if err != nil {
		return nil, err
	}
	r, err := ws.Run(ctx, Exec{Args: c.Spec.Command, Env: env, Network: c.Spec.Network == "host",
		Timeout: j.Wall, Stdout: log, Stderr: log})
	if cerr := log.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("running the agent: %w", err)
	}
	o := &Outcome{Status: Completed, ExitCode: r.ExitCode}
	switch {
	case r.TimedOut:
		o.Status, o.Reason = BudgetExceeded, fmt.Sprintf("the wall-clock budget of %s ran out", j.Wall)
	case r.OOM:
		o.Status, o.Reason = Failed, "the agent ran out of memory"
	case r.ExitCode != 0:
		o.Status, o.Reason = Failed, fmt.Sprintf("the agent exited with status %d", r.ExitCode)
	}
	if err := ws.CopyLogs(filepath.Join(j.Out, "logs")); err != nil {
		o.Reason = join(o.Reason, err.Error())
	}
	return o, nil
}

func lookup(get func(string) string, name string) (string, bool) {
	v := get(name)
	return v, v != ""
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
