package cli

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/report"
)

func newReportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "report RUN_DIR",
		Short: "Regenerate a run's reports from its stored results, running nothing",
		Long: `Read every RUN_DIR/<model>/<instance>/result.json and write RUN_DIR/report.json, report.md,
report.html, report.junit.xml and each instance's report.json; print the table.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			stored, err := report.LoadRun(args[0])
			if err != nil {
				return fault.Wrap(fault.Input, err)
			}
			if len(stored) == 0 {
				return fault.Inputf("no results under %s", args[0])
			}
			s, err := report.WriteRun(args[0], filepath.Base(filepath.Clean(args[0])), stored)
			if err != nil {
				return err
			}
			if err := report.WriteTable(cmd.OutOrStdout(), s); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\nreport: %s\n", filepath.Join(args[0], "report.html"))
			return nil
		},
	}
}
