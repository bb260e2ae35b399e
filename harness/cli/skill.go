package cli

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/infradev/infradev/harness/analyze"
	"github.com/infradev/infradev/harness/skill"
)

func newSkillCmd(g *globals) *cobra.Command {
	var o struct{ out, tasks string }
	cmd := &cobra.Command{
		Use:   "skill RUN_DIR --out DIR",
		Short: "Distil a run's failure analysis into a skill (Agent Skills layout)",
		Long: `Analyse RUN_DIR (as "infradev analyze" does) and write a skill to DIR: SKILL.md with name and
description front matter and a checklist per project, ordered by the probe categories and failure
classes seen most often, and references/<project>.md with the counts. It holds no probe ids,
probe code, failure messages or gold: giving it to an agent cannot leak a hidden check. Give it to
an agent with: infradev agent run ... --prompt-variant instruction+skill --skill DIR

Exit codes: 0 written; 2 bad usage or an empty run folder; 3 a file could not be written.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := analyze.Run(analyze.Config{RunDir: args[0], Gold: g.goldReader(cmd.Context(), o.tasks)})
			if err != nil {
				return err
			}
			s := skill.Distill(a)
			if err := s.Write(o.out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "skill %s written to %s\n", skill.Name, filepath.Join(o.out, "SKILL.md"))
			return nil
		},
	}
	cmd.Flags().StringVar(&o.out, "out", "", "the skill's folder")
	cmd.Flags().StringVar(&o.tasks, "tasks", "tasks", "tasks root")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}
