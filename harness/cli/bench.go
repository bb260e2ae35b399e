package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/unpack"
)

func newBenchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Benchmarks that print figures and ratios measured side by side"}
	cmd.AddCommand(newBenchEnvCmd(g), newBenchEvalCmd(g), newBenchTasksCmd(g))
	return cmd
}

func newBenchEnvCmd(g *globals) *cobra.Command {
	var c image.BenchConfig
	var baseMiB, fwMiB, taskMiB float64
	var keep bool
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Storage and build time: shared layer stacks against flattened per-task images",
		Long: `Build frameworks x tasks task images twice, both for real: as infradev stacks them (one OCI
layout, every layer stored once, a task image costing only its own layer) and flattened (one
single-layer image per task in its own layout, as per-task container images are). Prints bytes,
seconds and ratios, the cost of adding one more task image both ways, the demo environment's
figures, and the time to start a run on the cached demo stack.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c.BaseBytes, c.FrameworkBytes, c.TaskBytes = mibBytes(baseMiB), mibBytes(fwMiB), mibBytes(taskMiB)
			if c.Dir == "" {
				d, err := os.MkdirTemp("", "infradev-bench-")
				if err != nil {
					return err
				}
				c.Dir = d
			}
			if !keep {
				defer os.RemoveAll(c.Dir)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "synthetic suite: %d frameworks x %d tasks; base %s, framework %s, task %s\n",
				c.Frameworks, c.Tasks, mibText(c.BaseBytes), mibText(c.FrameworkBytes), mibText(c.TaskBytes))
			r, err := image.Bench(cmd.Context(), c)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%-28s %12s %10s\n", "", "bytes", "seconds")
			fmt.Fprintf(out, "%-28s %12s %10.1f\n", fmt.Sprintf("shared layout (%d images)", r.Images), mibText(r.SharedBytes), r.SharedSeconds)
			fmt.Fprintf(out, "%-28s %12s %10.1f\n", fmt.Sprintf("flattened (%d images)", r.Images), mibText(r.FlatBytes), r.FlatSeconds)
			fmt.Fprintf(out, "storage reduction: %.1f%%   build speedup: %.1fx\n",
				100*(1-float64(r.SharedBytes)/float64(r.FlatBytes)), r.FlatSeconds/r.SharedSeconds)
			fmt.Fprintf(out, "one more task image: shared %.3fs, flattened %.3fs: %.1fx faster\n",
				r.IncrementalShared, r.IncrementalFlat, r.IncrementalFlat/r.IncrementalShared)
			demoFigures(cmd.Context(), out, g)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Dir, "dir", "", "working directory (default: a new temporary one)")
	f.IntVar(&c.Frameworks, "frameworks", 3, "frameworks")
	f.IntVar(&c.Tasks, "per-framework", 12, "tasks per framework")
	f.Float64Var(&baseMiB, "base-mib", 180, "base (CUDA + PyTorch) layer size in MiB")
	f.Float64Var(&fwMiB, "framework-mib", 30, "framework layer size in MiB")
	f.Float64Var(&taskMiB, "task-mib", 2, "task layer size in MiB")
	f.BoolVar(&keep, "keep", false, "keep the working directory")
	return cmd
}

// demoFigures prints the demo environment's layers and the storage of its tasks shared against
// flattened, and times starting a run on its cached stack, when the demo image is in the store.
func demoFigures(ctx context.Context, out io.Writer, g *globals) {
	layout := g.imageStore().Layout()
	manifest, err := image.Resolve(layout, "demo")
	if err != nil {
		fmt.Fprintf(out, "demo: not built in %s (run infradev env build environments/demo)\n", layout)
		return
	}
	built, err := image.Describe(layout, manifest)
	if err != nil {
		fmt.Fprintf(out, "demo: %v\n", err)
		return
	}
	var total int64
	for _, l := range built.Layers {
		total += l.Size
		fmt.Fprintf(out, "demo layer %s %s\n", l.Digest[:19], mibText(l.Size))
	}
	dirs, _ := task.Find("tasks")
	n := 0
	for _, d := range dirs {
		if t, err := task.Load(d); err == nil && t.Environment == "demo" {
			n++
		}
	}
	if n > 0 {
		fmt.Fprintf(out, "demo: %d task(s): shared %s, flattened %s (%.1f%% less)\n", n, mibText(total),
			mibText(int64(n)*total), 100*(1-1/float64(n)))
	}
	cache, _ := filepath.Abs(g.cache)
	if os.Geteuid() != 0 {
		return
	}
	uc := unpack.Cache{Dir: filepath.Join(cache, "unpacked")}
	sb := &sandbox.Runc{StateDir: filepath.Join(cache, "sandbox")}
	var times []time.Duration
	for i := 0; i < 7; i++ {
		start := time.Now()
		stack, _, err := uc.Stack(ctx, layout, manifest)
		if err != nil {
			fmt.Fprintf(out, "demo run start: %v\n", err)
			return
		}
		work, _ := os.MkdirTemp(filepath.Join(cache), "bench-")
		ov, err := sandbox.MountOverlay(stack, filepath.Join(work, "root"), 64<<20)
		if err == nil {
			_, err = sb.Run(ctx, sandbox.Spec{Root: ov.Merged, Args: []string{"/bin/true"}})
			ov.Unmount()
		}
		os.RemoveAll(work)
		if err != nil {
			fmt.Fprintf(out, "demo run start: %v\n", err)
			return
		}
		times = append(times, time.Since(start))
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	fmt.Fprintf(out, "start a run on the cached demo stack (find layers, mount overlay, runc /bin/true, unmount): median %.1f ms of %d\n",
		float64(times[len(times)/2].Microseconds())/1000, len(times))
}

func mibBytes(m float64) int64 { return int64(m * (1 << 20)) }

func mibText(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

func resolveEnv(layout, name string) (string, error) { return image.Resolve(layout, name) }
