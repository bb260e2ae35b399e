package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/bazelgen"
)

func newGenCmd() *cobra.Command {
	var o struct {
		root  string
		check bool
	}
	cmd := &cobra.Command{
		Use:   "gen",
		Short: "Write the Bazel files derived from the task specs (task test targets, probe groups, suite.bzl)",
		Long: `Write, from every tasks/<project>/<id>/task.yaml, the task's BUILD.bazel (an
infradev_task_test target), its probes' BUILD.bazel, tasks/demo/predictions/BUILD.bazel, and
tools/private/suite.bzl (the task list and the digest of the harness sources, which the
repository rules read). Run it after changing a task spec or the harness. With --check, write
nothing and fail if a checked-in file is missing or differs.

Exit codes: 0 files written or current; 1 a file is stale (--check); 2 a spec is invalid.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			files, err := bazelgen.Generate(o.root)
			if err != nil {
				return err
			}
			if o.check {
				stale := bazelgen.Stale(o.root, files)
				for _, f := range stale {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: stale (run infradev gen)\n", f.Path)
				}
				if len(stale) > 0 {
					return &ExitError{Code: ExitFailed, Err: fmt.Errorf("%d generated Bazel file(s) stale", len(stale))}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d generated Bazel files current\n", len(files))
				return nil
			}
			for _, f := range bazelgen.Stale(o.root, files) {
				path := filepath.Join(o.root, f.Path)
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					return err
				}
				if err := atomicfile.Write(path, f.Data); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", f.Path)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.root, "root", ".", "repository root")
	cmd.Flags().BoolVar(&o.check, "check", false, "check the files are current; write nothing")
	return cmd
}
