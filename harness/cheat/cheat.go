// Package cheat owns the universal in-process cheats that validation adds to submissions:
// code that, once imported by the code under test, disables assertion helpers, forces every
// test report to pass, or forges the sealed report. A task whose probes and canaries let such
// a cheat through cannot be trusted; validate runs every sample with one added and requires
// the verdict to stay a rejection. The cheats build the names they reach for at run time, as
// a cheat hiding from the static scan would, so the scan does not stop them before the probes
// are tested.
package cheat

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed python/*.py
var sources embed.FS

// Cheat is one in-process cheat.
type Cheat struct {
	// Name is how validation names it: assertions, forced-pass, forged-report.
	Name string
	// Module is the module name it is installed under, beside a top-level package's code.
	Module string
	// Source is its Python source.
	Source string
}

// Names lists the cheats in the order validation rotates through them.
var Names = []string{"assertions", "forced-pass", "forged-report"}

// Get returns the named cheat.
func Get(name string) (Cheat, error) {
	data, err := sources.ReadFile("python/" + strings.ReplaceAll(name, "-", "_") + ".py")
	if err != nil {
		return Cheat{}, fmt.Errorf("no cheat %q (have %s)", name, strings.Join(Names, ", "))
	}
	return Cheat{Name: name, Module: "_speedups", Source: string(data)}, nil
}
