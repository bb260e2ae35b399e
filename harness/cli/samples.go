package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/samples"
)

func newSamplesCmd(g *globals) *cobra.Command {
	var o struct {
		tasks, probes, models, out, verify string
		check                              bool
	}
	cmd := &cobra.Command{
		Use:   "samples",
		Short: "Write the prediction files a models file mixes from gold, empty and sample patches",
		Long: `Read a models file (schema infradev.models/v1), which names prediction files and picks,
for each task, the gold patch, the empty patch or one of the task's samples (samples.yaml beside
its probes), and write each file as SWE-bench-style JSON Lines, beside the models file or in --out
(where they must go when they hold upstream tasks' gold patches: those are never checked in).
With --check, write nothing and fail if a checked-in file differs from what the models file
makes. With --verify RUN_DIR, write nothing and compare the run's report.json with the figures
each model's picks imply (resolved, passed official tests, probe-rejected, failure classes,
probe categories): how an evaluation of such files is checked.

Exit codes: 0 files written, current or verified; 1 a file is stale or a figure differs;
2 a spec is invalid.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sources, err := samples.Sources(o.tasks, o.probes, g.samplePrep(cmd.Context()))
			if err != nil {
				return err
			}
			if o.verify != "" {
				m, picks, err := samples.LoadModelsVerdicts(o.models, sources)
				if err != nil {
					return err
				}
				return verifyModels(cmd, m, picks, sources, o.verify)
			}
			m, picks, err := samples.LoadModels(o.models, sources)
			if err != nil {
				return err
			}
			dir := m.Dir
			if o.out != "" {
				dir = o.out
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
				path := filepath.Join(dir, md.File)
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
	f.StringVar(&o.out, "out", "", "where to write the prediction files (default: beside the models file)")
	f.StringVar(&o.verify, "verify", "", "check a run folder's report.json against the figures the picks imply; write nothing")
	return cmd
}

// verifyModels compares each model's figures in a run's report.json with what its picks imply.
func verifyModels(cmd *cobra.Command, m *samples.Models, picks map[string][]samples.Pick, sources map[string]*samples.Source, runDir string) error {
	data, err := os.ReadFile(filepath.Join(runDir, "report.json"))
	if err != nil {
		return fault.Wrap(fault.Input, err)
	}
	var s report.Summary
	if err := json.Unmarshal(data, &s); err != nil {
		return fault.Inputf("%s: %v", filepath.Join(runDir, "report.json"), err)
	}
	probes := map[string]*probe.Set{}
	for id, src := range sources {
		probes[id] = src.Probes
	}
	bad := 0
	out := cmd.OutOrStdout()
	for _, md := range m.Models {
		want := samples.Expect(picks[md.Name], probes)
		var got *report.ModelSummary
		for i := range s.Models {
			if s.Models[i].Model == md.Name {
				got = &s.Models[i]
			}
		}
		if got == nil {
			fmt.Fprintf(out, "%s: not in the report\n", md.Name)
			bad++
			continue
		}
		have := samples.Expected{Submitted: got.SubmittedInstances, Resolved: got.ResolvedInstances,
			PassedOfficialTests: got.PassedOfficialTests, ProbeRejected: got.ProbeRejected,
			FailureClasses: got.FailureClasses, ProbeCategories: got.ProbeCategories}
		if diff := cmp.Diff(want, have, cmpopts.EquateEmpty()); diff != "" || got.ErrorInstances > 0 {
			fmt.Fprintf(out, "%s: the report differs from the picks (-picks +report), %d error(s):\n%s", md.Name, got.ErrorInstances, diff)
			bad++
			continue
		}
		fmt.Fprintf(out, "%s: as the picks imply: resolved %d/%d (%.1f%%), probes rejected %d of %d that passed the official tests (%.1f%%), classes %v, probe categories %v\n",
			md.Name, got.ResolvedInstances, got.SubmittedInstances, 100*got.ResolutionRate, got.ProbeRejected, got.PassedOfficialTests,
			100*got.ProbeRejectionRate, got.FailureClasses, got.ProbeCategories)
	}
	if bad > 0 {
		return &ExitError{Code: ExitFailed, Err: fmt.Errorf("%d model(s) differ from their picks", bad)}
	}
	return nil
}
