package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/report"
)

func newReportCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
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
			return printSummary(cmd.OutOrStdout(), s, asJSON, filepath.Join(args[0], "report.json"))
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary (report.json) as JSON instead of the tables")
	return cmd
}

// printSummary prints a run's summary: the tables, or with asJSON the summary as JSON
// (report.json's content), then where the report is.
func printSummary(w io.Writer, s report.Summary, asJSON bool, where string) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	if err := report.WriteTable(w, s); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nreport: %s (.md, .html, .junit.xml beside it)\n", where)
	return err
}
