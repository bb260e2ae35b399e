package image

import (
	"context"

	"github.com/infradev/infradev/harness/envspec"
)

// TaskRepo is a task's repository: where it comes from and where it goes in the image.
type TaskRepo struct {
	// Name names the image in the layout (e.g. "task-vllm-0001").
	Name string
	// URL and Commit are the upstream repository and the task's base commit; Dest its path.
	URL, Commit, Dest string
}

// BuildTask builds a task's image: its environment (held to o.Locked, when set) with the task's
// repository at its base commit as one more layer on top, a thin per-task layer over the
// framework's shared ones. The repository comes through o.Mirrors.
func BuildTask(ctx context.Context, env *envspec.Env, repo TaskRepo, st Store, o Options) (*Built, error) {
	if _, err := Build(ctx, env, st, o); err != nil {
		return nil, err
	}
	e := *env
	e.Name = repo.Name
	e.Layers = append(append([]envspec.Step{}, env.Layers...), envspec.Step{
		Name: "repository",
		Git:  &envspec.Git{URL: repo.URL, Commit: repo.Commit, Dest: repo.Dest},
		Dir:  env.Dir,
	})
	o.Locked = nil // the environment's layers were just checked; the repository is pinned by its commit
	return Build(ctx, &e, st, o)
}
