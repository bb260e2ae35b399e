package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

func newGPUsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "List this machine's GPUs and the links between them (through NVML)",
		Long: `List the GPUs NVML finds: index, UUID, name, memory, compute capability, and the link
between every pair (nvlink, pcie, none). Without a driver, say so.

Exit codes: 0 listed (or no driver); 3 NVML failed otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m := g.machine()
			out := cmd.OutOrStdout()
			if m == nil {
				fmt.Fprintf(out, "no GPUs: %v\n", g.gpuErr)
				return nil
			}
			if asJSON {
				return printJSON(out, m)
			}
			fmt.Fprintf(out, "driver %s, %d GPUs\n", m.Driver, len(m.Devices))
			for _, d := range m.Devices {
				fmt.Fprintf(out, "%d  %s  %s  %.0f GiB  compute %s\n", d.Index, d.UUID, d.Name, float64(d.MemoryBytes)/(1<<30), d.Compute)
			}
			for i := range m.Links {
				var row []string
				for j := range m.Links[i] {
					if i == j {
						row = append(row, "  -   ")
					} else {
						row = append(row, fmt.Sprintf("%-6s", m.Links[i][j]))
					}
				}
				fmt.Fprintf(out, "GPU%d  %s\n", i, strings.Join(row, " "))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
