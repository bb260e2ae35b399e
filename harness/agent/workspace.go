package agent

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/infradev/infradev/harness/sandbox"
)

// Paths inside the sandbox.
const (
	// PromptDir holds prompt.md (and skill/, for the instruction+skill variant), read-only.
	PromptDir = "/run/infradev/prompt"
	// LogsDir is where a command agent may leave its own transcript and logs: copied to the
	// run folder afterwards, within a size limit.
	LogsDir = "/run/infradev/agent-logs"
	// HomeDir is the agent's home: writable, and kept between the built-in agent's commands.
	HomeDir = "/run/infradev/home"
	inDir   = "/run/infradev/in"
	outDir  = "/run/infradev/out"
)

// maxLogs bounds what is copied of a command agent's own logs.
const maxLogs = 64 << 20

// Workspace is one attempt's sandbox: an overlay over the task's image (and the agent's
// layers) whose repository is writable and persists between commands.
type Workspace struct {
	sb    sandbox.Sandbox
	ov    *sandbox.Overlay
	dir   string // scratch folder of this workspace
	repo  string // the repository's path inside the sandbox
	base  string // the base commit
	env   []string
	lim   sandbox.Limits
	mount []sandbox.Mount
}

// WorkspaceSpec is what a workspace is made of.
type WorkspaceSpec struct {
	// Lowers are the layer directories, bottom first.
	Lowers []string
	// Env is the image's environment; the workspace adds its own variables.
	Env []string
	// Repo and Base are the repository's path and its base commit.
	Repo, Base string
	// PromptDir is the host folder mounted read-only at PromptDir.
	PromptDir string
	Limits    sandbox.Limits
	// DiskBytes bounds the scratch layer (0: the scratch folder's disk).
	DiskBytes int64
}

// OpenWorkspace mounts a workspace under scratch (a new folder there).
func OpenWorkspace(sb sandbox.Sandbox, scratch string, s WorkspaceSpec) (*Workspace, error) {
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(scratch, "agent-")
	if err != nil {
		return nil, err
	}
	if err := sandbox.WriteOwner(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ov, err := sandbox.MountOverlay(s.Lowers, filepath.Join(dir, "root"), s.DiskBytes)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	w := &Workspace{sb: sb, ov: ov, dir: dir, repo: s.Repo, base: s.Base, lim: s.Limits}
	// The writable places other than the repository live in the scratch layer, so what an
	// agent writes there is bounded as the repository is.
	for _, p := range []string{LogsDir, HomeDir} {
		if err := os.MkdirAll(filepath.Join(ov.Merged, p), 0o777); err != nil {
			w.Close()
			return nil, err
		}
	}
	w.env = sandbox.MergeEnv(s.Env, "HOME="+HomeDir, "INFRADEV_PROMPT="+PromptDir+"/prompt.md", "INFRADEV_AGENT_LOGS="+LogsDir,
		"INFRADEV_REPO="+s.Repo, "LC_ALL=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1", "GIT_TERMINAL_PROMPT=0")
	if s.PromptDir != "" {
		w.mount = append(w.mount, sandbox.Mount{Source: s.PromptDir, Dest: PromptDir, ReadOnly: true})
	}
	return w, nil
}

// Exec is one command in the workspace.
type Exec struct {
	Args    []string
	Env     []string // added to the workspace's
	Network bool
	Timeout time.Duration
	Stdout  io.Writer
	Stderr  io.Writer
}

// Run runs a command in the workspace, in the repository. An error is a fault of the sandbox.
func (w *Workspace) Run(ctx context.Context, e Exec) (*sandbox.Result, error) {
	return w.sb.Run(ctx, sandbox.Spec{
		Root:     w.ov.Merged,
		Writable: []string{w.repo, LogsDir, HomeDir},
		Mounts:   w.mount,
		Args:     e.Args,
		Env:      sandbox.MergeEnv(w.env, e.Env...),
		Cwd:      w.repo,
		Network:  e.Network,
		Limits:   w.lim,
		Timeout:  e.Timeout,
		Stdout:   e.Stdout,
		Stderr:   e.Stderr,
	})
}

//go:embed capture.sh
var captureScript []byte

// ErrCapture is a workspace whose changes could not be read back: the agent left the
// repository in a state git cannot diff (its doing, so its submission is empty).
var ErrCapture = errors.New("the workspace's changes could not be captured")

// Diff captures the workspace's changes against the base commit as a binary-safe git diff:
// every file in the work tree that git would track (ignored files and .git left out), read
// with a scratch git directory that borrows the repository's objects, so no configuration,
// hook or filter the agent left in .git takes part. It runs without the network, after the
// agent, with a limit of maxBytes on the diff.
func (w *Workspace) Diff(ctx context.Context, maxBytes int64) ([]byte, error) {
	in := filepath.Join(w.dir, "capture-in")
	out := filepath.Join(w.dir, "capture-out")
	for _, d := range []string{in, out} {
		if err := os.RemoveAll(d); err != nil {
			return nil, err
		}
		if err := os.Mkdir(d, 0o777); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(in, "capture.sh"), captureScript, 0o555); err != nil {
		return nil, err
	}
	var log bytes.Buffer
	r, err := w.sb.Run(ctx, sandbox.Spec{
		Root:     w.ov.Merged,
		Writable: []string{w.repo},
		Mounts:   []sandbox.Mount{{Source: in, Dest: inDir, ReadOnly: true}, {Source: out, Dest: outDir}},
		Args:     []string{"/bin/sh", inDir + "/capture.sh", w.repo, w.base, outDir + "/patch.diff", fmt.Sprint(maxBytes)},
		Env:      []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp", "LC_ALL=C"},
		Cwd:      "/",
		Limits:   w.lim, Timeout: 10 * time.Minute,
		Stdout: &capped{w: &log, n: 64 << 10}, Stderr: &capped{w: &log, n: 64 << 10},
	})
	if err != nil {
		return nil, fmt.Errorf("capturing the workspace: %w", err)
	}
	if r.TimedOut || r.ExitCode != 0 {
		return nil, fmt.Errorf("%w: exit %d%s: %s", ErrCapture, r.ExitCode, map[bool]string{true: " (timed out)"}[r.TimedOut], strings.TrimSpace(log.String()))
	}
	f, err := os.Open(filepath.Join(out, "patch.diff"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCapture, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > maxBytes {
		return nil, fmt.Errorf("%w: the diff is over %d bytes", ErrCapture, maxBytes)
	}
	return data, nil
}

// CopyLogs copies what a command agent left in LogsDir to dst, at most maxLogs bytes in all;
// links and special files are left out.
func (w *Workspace) CopyLogs(dst string) error {
	src := filepath.Join(w.ov.Merged, LogsDir)
	var total int64
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case !d.Type().IsRegular():
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if total+info.Size() > maxLogs {
			return fmt.Errorf("the agent's logs are over %d MiB; %s and what follows are left out", maxLogs>>20, rel)
		}
		total += info.Size()
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		o, err := os.Create(target)
		if err != nil {
			return err
		}
		if _, err := io.Copy(o, io.LimitReader(in, info.Size())); err != nil {
			o.Close()
			return err
		}
		return o.Close()
	})
}

// Close unmounts the workspace and removes its scratch.
func (w *Workspace) Close() {
	if w.ov != nil {
		w.ov.Unmount()
	}
	os.RemoveAll(w.dir)
}

// capped writes at most n bytes to w and drops the rest.
type capped struct {
	w io.Writer
	n int
}

func (c *capped) Write(p []byte) (int, error) {
	k := min(len(p), c.n)
	if k > 0 {
		if _, err := c.w.Write(p[:k]); err != nil {
			return 0, err
		}
		c.n -= k
	}
	return len(p), nil
}
