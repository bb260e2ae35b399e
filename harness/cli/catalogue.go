package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/catalogue"
	"github.com/infradev/infradev/harness/fault"
)

func newCatalogueCmd() *cobra.Command {
	var o struct {
		tasks, probes, envs, write, check string
		asJSON                            bool
	}
	cmd := &cobra.Command{
		Use:   "catalogue",
		Short: "The table of tasks: upstream change, kind, probe categories, GPUs, validation status",
		Long: `Print the catalogue of tasks as a Markdown table. A task's status comes from its validation
record (validation.json beside its probes, written by infradev validate --record): cpu, gpu or
gpu-pending when the record matches the task, its probes and samples and its environment's
lock as they are, stale (naming what changed) when it does not, unvalidated when there is
none. Below the table: counts per project, GPUs here, GPUs on a pool, probe category and
status. With --write FILE, replace the table between the catalogue markers in FILE; with
--check FILE, fail if that table is not current.

Exit codes: 0 printed, written or current; 1 stale (--check); 2 bad usage or spec.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rows, err := catalogue.Rows(o.tasks, o.probes, o.envs)
			if err != nil {
				return err
			}
			if o.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			table := catalogue.Markdown(rows)
			file := o.write
			if o.check != "" {
				file = o.check
			}
			if file == "" {
				_, err := cmd.OutOrStdout().Write(table)
				return err
			}
			doc, err := os.ReadFile(file)
			if err != nil {
				return fault.Wrap(fault.Input, err)
			}
			out, err := catalogue.Splice(doc, table, file)
			if err != nil {
				return fault.Wrap(fault.Input, err)
			}
			if o.check != "" {
				if !bytes.Equal(out, doc) {
					return fault.Checkf("%s: the catalogue is not current (run infradev catalogue --write %s)", file, file)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: catalogue current (%d tasks)\n", file, len(rows))
				return nil
			}
			return atomicfile.Write(file, out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.tasks, "tasks", "tasks", "tasks root")
	f.StringVar(&o.probes, "probes", "probes", "probes root")
	f.StringVar(&o.envs, "environments", "environments", "environments root (a record for another environment lock is stale)")
	f.BoolVar(&o.asJSON, "json", false, "print the rows as JSON")
	f.StringVar(&o.write, "write", "", "replace the catalogue between the markers in this Markdown file")
	f.StringVar(&o.check, "check", "", "check the catalogue between the markers in this Markdown file is current")
	return cmd
}
