package cli_test

import (
	"context"
	"os"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/infradev/infradev/harness/cli"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"infradev": func() { os.Exit(cli.Execute(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

// TestScripts runs the CLI end to end from testdata/script/*.txtar.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{Dir: "testdata/script"})
}
