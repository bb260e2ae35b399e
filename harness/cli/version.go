package cli

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the harness version and the key its results are stored under",
		Long: `Print the release name, the harness key (the release plus the digest of this binary: results
and cache entries are keyed by it, so two binaries that grade differently never share one) and
the Go toolchain.

Exit codes: 0 printed; 3 the binary could not be read to compute its key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, err := harnessKey()
			if err != nil {
				return err
			}
			v := struct {
				Version string `json:"version"`
				Key     string `json:"harness_key"`
				Go      string `json:"go"`
				Module  string `json:"module,omitempty"`
			}{Version: Version, Key: key, Go: runtime.Version()}
			if bi, ok := debug.ReadBuildInfo(); ok {
				v.Module = bi.Main.Path
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\nharness key %s\n%s\n", v.Version, v.Key, v.Go)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
