package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/task"
)

func newBenchTasksCmd(g *globals) *cobra.Command {
	var o struct {
		tasks, envs, rebuild, dir string
	}
	cmd := &cobra.Command{
		Use:   "tasks",
		Short: "The real tasks' images: storage shared against per-task images, and the cost of one more task",
		Long: `Read the images of the upstream tasks under --tasks from the store (task-<id>, as run-task,
eval, validate and task import build them) and print the bytes they take in the shared layout
(every layer stored once: the OS, Python, torch and framework layers shared, one repository layer
per task) against per-task images (each task's environment stored on its own) and against one
store per framework (the OS, Python and torch stored once per framework). With --rebuild
ID, also time, side by side, adding that task once more both ways: as one more repository layer
over the store's cached environment, and as a whole image built into an empty store.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			layout := g.imageStore().Layout()
			dirs, err := task.Find(o.tasks)
			if err != nil {
				return err
			}
			ids := make([]string, 0, len(dirs))
			for id := range dirs {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			unique := map[string]int64{}
			byEnv := map[string]map[string]int64{} // environment -> its tasks' layers
			var flat int64
			n := 0
			perEnv := map[string]int{}
			for _, id := range ids {
				t, err := task.Load(dirs[id])
				if err != nil || !t.Upstream() {
					continue
				}
				manifest, err := image.Resolve(layout, "task-"+id)
				if err != nil {
					fmt.Fprintf(out, "%s: no image in the store yet (run-task, validate or task import builds it)\n", id)
					continue
				}
				built, err := image.Describe(layout, manifest)
				if err != nil {
					return err
				}
				var size int64
				if byEnv[t.Environment] == nil {
					byEnv[t.Environment] = map[string]int64{}
				}
				for _, l := range built.Layers {
					size += l.Size
					unique[l.Digest] = l.Size
					byEnv[t.Environment][l.Digest] = l.Size
				}
				repo := built.Layers[len(built.Layers)-1]
				fmt.Fprintf(out, "%-14s %-9s %2d layers %10s, its repository layer %9s\n", id, t.Environment, len(built.Layers), mibText(size), mibText(repo.Size))
				flat += size
				n++
				perEnv[t.Environment]++
			}
			if n == 0 {
				return fault.Checkf("no upstream task image in %s", layout)
			}
			var shared int64
			for _, s := range unique {
				shared += s
			}
			var perFramework int64
			for _, layers := range byEnv {
				for _, s := range layers {
					perFramework += s
				}
			}
			fmt.Fprintf(out, "%d task images (%v): shared layout %s, per-task images %s: %.1f%% less storage\n",
				n, perEnv, mibText(shared), mibText(flat), 100*(1-float64(shared)/float64(flat)))
			fmt.Fprintf(out, "against one store per framework (each stores its own OS, Python and torch): %s: %.1f%% less storage\n",
				mibText(perFramework), 100*(1-float64(shared)/float64(perFramework)))
			if o.rebuild == "" {
				return nil
			}
			dir, ok := dirs[o.rebuild]
			if !ok {
				return fault.Inputf("--rebuild: no task %q", o.rebuild)
			}
			t, err := task.Load(dir)
			if err != nil {
				return err
			}
			env, err := envspec.Load(filepath.Join(o.envs, t.Environment))
			if err != nil {
				return err
			}
			m, err := g.mirrorMap()
			if err != nil {
				return err
			}
			// One more task over the shared store: only its repository layer is built (a new
			// destination makes a new layer of the same work).
			repo := image.TaskRepo{Name: "bench-" + t.ID, URL: t.Repo.URL, Commit: t.Repo.BaseCommit, Dest: t.Repo.Path + "-bench"}
			start := time.Now()
			if _, err := image.BuildTask(cmd.Context(), env, repo, g.imageStore(), image.Options{Mirrors: m}); err != nil {
				return err
			}
			sharedSec := time.Since(start).Seconds()
			// The same task as an image of its own: every layer built into an empty store.
			work := o.dir
			if work == "" {
				if work, err = os.MkdirTemp("", "infradev-bench-task-"); err != nil {
					return err
				}
			}
			defer os.RemoveAll(work)
			repo.Dest = t.Repo.Path
			start = time.Now()
			if _, err := image.BuildTask(cmd.Context(), env, repo, image.Store{Dir: filepath.Join(work, "store")}, image.Options{Mirrors: m, Log: cmd.ErrOrStderr()}); err != nil {
				return err
			}
			flatSec := time.Since(start).Seconds()
			fmt.Fprintf(out, "one more task (%s): shared store %.1fs, its own image from an empty store %.1fs: %.1f%% less build time (%.1fx)\n",
				t.ID, sharedSec, flatSec, 100*(1-sharedSec/flatSec), flatSec/sharedSec)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.tasks, "tasks", "tasks", "tasks root")
	f.StringVar(&o.envs, "environments", "environments", "environments root")
	f.StringVar(&o.rebuild, "rebuild", "", "time adding this task once more, both ways")
	f.StringVar(&o.dir, "dir", "", "scratch directory for the empty store (default: a temporary one; needs the environment's size free)")
	return cmd
}
