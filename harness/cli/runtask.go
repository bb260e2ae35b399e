package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/atomicfile"
	"github.com/infradev/infradev/harness/cheat"
	"github.com/infradev/infradev/harness/digest"
	"github.com/infradev/infradev/harness/fault"
	"github.com/infradev/infradev/harness/probe"
	"github.com/infradev/infradev/harness/report"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/resultstore"
	"github.com/infradev/infradev/harness/runner"
	"github.com/infradev/infradev/harness/task"
	"github.com/infradev/infradev/harness/upstream"
)

func newRunTaskCmd(g *globals) *cobra.Command {
	var o struct {
		task, probes, layout, image, patch, out, instance, model, results, cheat, envs string
		asJSON                                                                         bool
		probe                                                                          runner.ProbeMode
		submission                                                                     string
	}
	cmd := &cobra.Command{
		Use:   "run-task",
		Short: "Run one submission on one task and grade it",
		Long: `Run one attempt: apply the patch inside the task's environment, put the official tests
in place, run them, run the probes, and grade. Every input is a file. The run folder (--out)
receives result.json, junit.xml, raw JUnit reports and logs; junit.xml is also written to
$XML_OUTPUT_FILE when that is set (as under bazel test). With --results (a directory, or the
URL of a Bazel HTTP remote cache), an attempt whose inputs already have a stored result is not
run again, and a new result is stored: the same store infradev eval uses.

For a probe's author: --authors keeps the probe phases' logs and their children's output and
tracebacks (a scored attempt keeps neither: the code under test could print the probes'
drivers into them); --record keeps what every probe child sent (raw/probe-record); --forge
replay|mix|nan --recorded DIR runs the probes with every child over the submission forging its
message from such a recording, as validation's forgery check does (a probe that passes the
empty patch so decides from data the child reports); --probes-only skips the official tests.

Exit codes: 0 resolved; 1 not resolved; 2 bad usage or spec, or the task itself is broken
(task_error); 3 infrastructure fault.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := task.Load(o.task)
			if err != nil {
				return err
			}
			ps, err := probe.Load(o.probes, t.ID)
			if err != nil {
				return err
			}
			patch, err := os.ReadFile(o.patch)
			if err != nil {
				return fault.Inputf("reading patch: %v", err)
			}
			// The submission as the user gave it: whatever carried the file here (a Bazel
			// repository rule) must not have changed a byte of it.
			got := digest.Bytes(patch)
			fmt.Fprintf(cmd.ErrOrStderr(), "submission %s (%d bytes)\n", got, len(patch))
			if o.submission != "" && strings.TrimSpace(o.submission) != got {
				return fault.Infraf("the patch to grade (%s, %s) is not the submission given (%s): it was changed on its way here",
					o.patch, got, strings.TrimSpace(o.submission))
			}
			if (o.probe.Forge == "") != (o.probe.Recorded == "") {
				return fault.Inputf("--forge and --recorded go together")
			}
			if f := o.probe.Forge; f != "" && f != "replay" && f != "mix" && f != "nan" {
				return fault.Inputf("--forge %q: want replay, mix or nan", f)
			}
			if o.probe.Recorded != "" {
				if o.probe.Recorded, err = filepath.Abs(o.probe.Recorded); err != nil {
					return err
				}
				if fi, err := os.Stat(o.probe.Recorded); err != nil || !fi.IsDir() {
					return fault.Inputf("--recorded %s: not a folder a --record run wrote (raw/probe-record)", o.probe.Recorded)
				}
			}
			// An upstream task's files are derived from its commits (store, else mirror); without
			// --image its image is built (environment plus the repository at the base commit).
			if o.image == "" {
				prep, err := g.preparer(o.envs, cmd.ErrOrStderr())
				if err != nil {
					return err
				}
				if o.image, err = prep.Task(cmd.Context(), t); err != nil {
					return err
				}
				o.layout = g.imageStore().Layout()
			} else {
				m, err := g.mirrorMap()
				if err != nil {
					return err
				}
				if err := upstream.Attach(cmd.Context(), g.store, t, m); err != nil {
					return err
				}
			}
			layout, err := filepath.Abs(o.layout)
			if err != nil {
				return err
			}
			r, err := g.runner()
			if err != nil {
				return err
			}
			store, err := resultstore.Open(o.results)
			if err != nil {
				return err
			}
			r = resultstore.Cached{Attempter: r, Store: store, Log: cmd.ErrOrStderr()}
			res, err := r.Run(cmd.Context(), runner.Inputs{Task: t, Probes: ps, Layout: layout, Image: o.image,
				Patch: patch, InstanceID: o.instance, Model: o.model, Cheat: o.cheat, Probe: o.probe}, o.out)
			if err != nil {
				return err
			}
			var junit bytes.Buffer
			if err := report.WriteJUnit(&junit, []*result.Result{res}); err != nil {
				return err
			}
			if err := atomicfile.Write(filepath.Join(o.out, "junit.xml"), junit.Bytes()); err != nil {
				return err
			}
			if x := os.Getenv("XML_OUTPUT_FILE"); x != "" {
				if err := atomicfile.Write(x, junit.Bytes()); err != nil {
					return err
				}
			}
			if o.asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(res); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", res.InstanceID, report.Verdict(res))
				if res.Reason != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "  %s\n", res.Reason)
				}
			}
			switch {
			case res.Resolved:
				return nil
			case result.IsSubmissionFailure(res.FailureClass):
				return &ExitError{Code: ExitFailed, Err: fmt.Errorf("")}
			case res.FailureClass == result.TaskError:
				return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s: %s", res.FailureClass, res.Reason)}
			default:
				return &ExitError{Code: ExitInfra, Err: fmt.Errorf("%s: %s", res.FailureClass, res.Reason)}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.task, "task", "", "task directory (holds task.yaml)")
	f.StringVar(&o.probes, "probes", "", "probes directory (holds probes.yaml)")
	f.StringVar(&o.layout, "layout", "", "OCI image layout holding the environment (with --image)")
	f.StringVar(&o.image, "image", "", "manifest digest of the task's image (sha256:...); without it the image is built from --environments into the store")
	f.StringVar(&o.envs, "environments", "environments", "environments root, to build the task's image when --image is not given")
	f.StringVar(&o.patch, "patch", "", "the submission: a unified diff file (may be empty)")
	f.StringVar(&o.out, "out", "", "run folder to write")
	f.StringVar(&o.instance, "instance-id", "", "instance id to record (default: the task id)")
	f.StringVar(&o.model, "model", "", "model name to record")
	f.BoolVar(&o.asJSON, "json", false, "print result.json instead of the verdict line")
	f.StringVar(&o.cheat, "cheat", "", "add an in-process cheat to the submission ("+strings.Join(cheat.Names, ", ")+"): checks that a task's canaries and probes hold")
	f.StringVar(&o.submission, "submission-digest", "", "the digest (sha256:...) of the submission as given: grading refuses a patch file whose bytes differ (exit 3)")
	f.BoolVar(&o.probe.Authors, "authors", false, "keep the probe phases' logs and their children's output (for a probe's author)")
	f.BoolVar(&o.probe.Record, "record", false, "keep what every probe child sent, under raw/probe-record")
	f.StringVar(&o.probe.Forge, "forge", "", "forge every probe child's message from --recorded: replay, mix or nan")
	f.StringVar(&o.probe.Recorded, "recorded", "", "a raw/probe-record folder a --record run wrote")
	f.BoolVar(&o.probe.Only, "probes-only", false, "skip the official tests: apply the patch and run the probes")
	f.StringVar(&o.results, "results", os.Getenv("INFRADEV_RESULTS"), "results store to reuse and fill: a directory or a Bazel HTTP cache URL (env INFRADEV_RESULTS; empty: none)")
	cmd.MarkFlagsRequiredTogether("layout", "image")
	for _, name := range []string{"task", "probes", "patch", "out"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}
