package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/image"
)

func newEnvCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "env", Short: "Build, pin, check, share and clean environment images"}
	cmd.AddCommand(newEnvBuildCmd(g), newEnvLockCmd(g), newEnvVerifyCmd(g), newEnvGCCmd(g), newEnvPlanCmd(), newEnvPushCmd(g), newEnvPullCmd(g))
	return cmd
}

func newEnvBuildCmd(g *globals) *cobra.Command {
	var asJSON, locked, writeLock bool
	var digestFile string
	cmd := &cobra.Command{
		Use:   "build ENV_DIR",
		Short: "Build an environment (environments/<name>) into the store's OCI layout",
		Long: `Build the environment defined in ENV_DIR/env.yaml into the store's OCI image layout,
naming it by the environment's name. Each layer is keyed by its parent and its step; steps whose
key is unchanged are reused. Prints one line per layer (built or cached) and the manifest digest.

A pip step installs from its lock file (written by "infradev env lock"); archives come from
the store's wheel store (wheels/sha256/<hex>/<file>) and are downloaded only when missing.

ENV_DIR/env.lock pins every layer digest and the manifest digest. It is written when missing
(or with --write-lock). With --locked the build fails, naming the layer, as soon as a layer's
step or bytes differ from the lock.

Exit codes: 0 built; 1 not as locked; 2 bad definition; 3 build failed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := envspec.Load(args[0])
			if err != nil {
				return err
			}
			lock, err := image.ReadLock(env.Dir)
			if err != nil {
				return fault.Wrap(fault.Input, err)
			}
			if locked && lock == nil {
				return fault.Inputf("--locked: %s/%s does not exist", env.Dir, image.LockFile)
			}
			log := cmd.OutOrStdout()
			if asJSON {
				log = cmd.ErrOrStderr()
			}
			opts := image.Options{Log: log}
			if locked {
				opts.Locked = lock
			}
			b, err := image.Build(cmd.Context(), env, g.imageStore(), opts)
			var unlocked *image.UnlockedError
			if errors.As(err, &unlocked) {
				return fault.Wrap(fault.Check, err) // built, but not as locked
			}
			if err != nil {
				return err // its class says whose fault: a bad definition, or the build
			}
			switch {
			case lock == nil || writeLock:
				if err := image.WriteLock(env.Dir, image.LockOf(b)); err != nil {
					return err
				}
				fmt.Fprintf(log, "%s/%s written\n", env.Dir, image.LockFile)
			case lock.Manifest != b.Manifest:
				fmt.Fprintf(log, "warning: the image differs from %s/%s (%s); --locked enforces it, --write-lock updates it\n",
					env.Dir, image.LockFile, lock.Manifest)
			}
			if digestFile != "" {
				if err := atomicfile.Write(digestFile, []byte(b.Manifest+"\n")); err != nil {
					return err
				}
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), b)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the build as JSON (layers, digests, cached or built)")
	cmd.Flags().StringVar(&digestFile, "digest-file", "", "write the image's manifest digest (sha256:...) to this file")
	cmd.Flags().BoolVar(&locked, "locked", false, "fail unless every layer and the manifest match env.lock")
	cmd.Flags().BoolVar(&writeLock, "write-lock", false, "rewrite env.lock from this build")
	return cmd
}

func newEnvLockCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "lock ENV_DIR",
		Short: "Resolve the requirements of the environment's pip steps and write their lock files",
		Long: `Resolve the requirements of every pip step ENV_DIR/env.yaml defines and write each step's
lock file beside it: pip's requirements format with hashes, one archive per package
(name==version --hash=sha256:<hex> # file), sorted, under a header naming the step, the venv
and the requirements. Resolution runs in the build sandbox with the network, with the image's
own Python and pip, over the layers below the step (built first, or found cached), so what an
earlier pip step installed into the venv is not locked again. Steps of the environments ENV_DIR
stacks on (from:) are not resolved again: their locks must exist.

The host's PIP_* variables (but PIP_FIND_LINKS and those naming host files), proxy settings
and CA bundle are passed into the sandbox; they say where packages come from, the lock says
what they are.

Exit codes: 0 locked; 2 bad definition; 3 resolution failed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := envspec.Load(args[0])
			if err != nil {
				return err
			}
			log := cmd.OutOrStdout()
			if asJSON {
				log = cmd.ErrOrStderr()
			}
			type locked struct {
				Step     string             `json:"step"`
				File     string             `json:"file"`
				Packages []image.PipPackage `json:"packages"`
			}
			var out []locked
			before := map[string][]byte{}
			for _, s := range env.Layers {
				if s.Pip != nil {
					before[s.LockPath()], _ = os.ReadFile(s.LockPath())
				}
			}
			locks, err := image.LockPip(cmd.Context(), env, g.imageStore(), image.Options{Log: log})
			var unlocked *image.UnlockedError
			if errors.As(err, &unlocked) {
				return fault.Wrap(fault.Input, err)
			}
			if err != nil {
				return err
			}
			for _, s := range env.Layers {
				for _, l := range locks {
					if s.Pip == nil || l.Step != s.Name || filepath.Clean(s.Dir) != filepath.Clean(env.Dir) {
						continue
					}
					change := "unchanged"
					if !bytes.Equal(before[s.LockPath()], l.Format()) {
						change = "written"
					}
					fmt.Fprintf(log, "%s %s: %d packages (%d source distributions)\n", s.LockPath(), change, len(l.Packages), sdists(l))
					out = append(out, locked{Step: s.Name, File: s.LockPath(), Packages: l.Packages})
				}
			}
			if len(locks) == 0 {
				fmt.Fprintf(log, "%s defines no pip step\n", filepath.Join(env.Dir, envspec.EnvFile))
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the locked packages as JSON")
	return cmd
}

func sdists(l *image.PipLock) int {
	n := 0
	for _, p := range l.Packages {
		if !p.Wheel() {
			n++
		}
	}
	return n
}

func newEnvVerifyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "verify ENV_DIR",
		Short: "Re-hash the environment's image in the layout and check it against env.lock",
		Long: `Re-hash every blob of the environment's image in the store's layout (manifest, config,
each layer compressed and uncompressed) and check the image is the one env.lock pins.

Exit codes: 0 intact; 1 a blob is corrupt or the image is not as locked; 2 bad usage.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := envspec.Load(args[0])
			if err != nil {
				return err
			}
			lock, err := image.ReadLock(env.Dir)
			if err != nil {
				return fault.Wrap(fault.Input, err)
			}
			if err := image.Verify(cmd.Context(), g.imageStore().Layout(), env.Name, lock); err != nil {
				return fault.Checkf("environment %s:\n%v", env.Name, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "environment %s: every blob intact", env.Name)
			if lock != nil {
				fmt.Fprintf(cmd.OutOrStdout(), ", as %s pins", image.LockFile)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		},
	}
}

func newEnvGCCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "Remove blobs no image in the store's layout references",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, freed, err := image.GC(g.imageStore())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d blobs, %.1f MiB\n", n, float64(freed)/(1<<20))
			return nil
		},
	}
}

func newEnvPlanCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "plan ENV_DIR",
		Short: "Print each layer's step key without building (offline)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			env, err := envspec.Load(args[0])
			if err != nil {
				return err
			}
			layers, err := image.Plan(env)
			if err != nil {
				return fault.Wrap(fault.Input, err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), layers)
			}
			for i, l := range layers {
				fmt.Fprintf(cmd.OutOrStdout(), "layer %d/%d %-14s %-6s %s\n", i+1, len(layers), l.Step, l.Kind, l.Key)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the plan as JSON")
	return cmd
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newEnvPushCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "push NAME REF",
		Short: "Push the image the store names NAME to a registry reference",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := image.Push(cmd.Context(), g.imageStore(), args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pushed %s %s\n", args[1], d)
			return nil
		},
	}
}

func newEnvPullCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pull REF NAME",
		Short: "Pull a registry reference into the store's layout as NAME",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := image.Pull(cmd.Context(), g.imageStore(), args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pulled %s %s\n", args[1], d)
			return nil
		},
	}
}
