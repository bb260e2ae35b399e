package cli

import (
	"encoding/json"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/image"
)

func newEnvCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "env", Short: "Build and inspect environment images"}
	cmd.AddCommand(newEnvBuildCmd(g))
	return cmd
}

func newEnvBuildCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "build ENV_DIR",
		Short: "Build an environment (environments/<name>) into the store's OCI layout",
		Long: `Build the environment defined in ENV_DIR/env.yaml into the store's OCI image layout,
naming it by the environment's name. Each layer is keyed by its parent and its step; steps whose
key is unchanged are reused. Prints one line per layer (built or cached) and the manifest digest.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := envspec.Load(args[0])
			if err != nil {
				return err
			}
			opts := image.Options{Log: cmd.ErrOrStderr()}
			if !asJSON {
				opts.Log = cmd.OutOrStdout()
			}
			b, err := image.Build(cmd.Context(), env, g.imageStore(), opts)
			if err != nil {
				return exitf(ExitInfra, "%v", err)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(b)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the build as JSON (layers, digests, cached or built)")
	return cmd
}
