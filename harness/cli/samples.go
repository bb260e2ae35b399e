package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/samples"
)

func newSamplesCmd(g *globals) *cobra.Command {
	var o struct {
		tasks, probes, models string
		check                 bool
	}
	cmd := &cobra.Command{
		Use:   "samples",
		Short: "Write the prediction files a models file mixes from gold, empty and sample patches",
		Long: `Read a models file (schema infradev.models/v1), which names prediction files and picks,
for each task, the gold patch, the empty patch or one of the task's samples (samples.yaml beside
its probes), and write each file as SWE-bench-style JSON Lines. With --check, write nothing and
fail if a checked-in file differs from what the models file makes.

Exit codes: 0 files written or current; 1 a file is stale (--check); 2 a spec is invalid.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sources, err := samples.Sources(o.tasks, o.probes, g.samplePrep(cmd.Context()))
			if err != nil {
				return err
			}
			m, picks, err := samples.LoadModels(o.models, sources)
			if err != nil {
				return err
			}
			stale := 0
			for _, md := range m.Models {
				var b bytes.Buffer
				enc := json.NewEncoder(&b)
				enc.SetEscapeHTML(false)
				for _, p := range samples.Predictions(md.Name, picks[md.Name]) {
					if err := enc.Encode(p); err != nil {
						return err
					}
				}
				path := filepath.Join(m.Dir, md.File)
				if o.check {
					if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, b.Bytes()) {
						fmt.Fprintf(cmd.OutOrStdout(), "%s: stale (run infradev samples)\n", path)
						stale++
					}
					continue
				}
				if err := atomicfile.Write(path, b.Bytes()); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %d predictions from %s\n", path, len(picks[md.Name]), md.Name)
			}
			if stale > 0 {
				return &ExitError{Code: ExitFailed, Err: fmt.Errorf("%d prediction file(s) stale", stale)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.tasks, "tasks", "tasks", "tasks root (tasks/<project>/<id>)")
	f.StringVar(&o.probes, "probes", "probes", "probes root (probes/<project>/<id>)")
	f.StringVar(&o.models, "models", "tasks/demo/predictions/models.yaml", "models file")
	f.BoolVar(&o.check, "check", false, "check the files are current; write nothing")
	return cmd
}
