package pytestproto

import (
	"path"

	"github.com/infradev/infradev/harness/judge"
	"github.com/infradev/infradev/harness/task"
)

// Command is the harness-owned test command: no cache, no plugin autoload (set in the
// environment), the harness's report plugin, JUnit into the report pipe, exactly the expected
// ids. With root set (probes), ids are relative to it and the judge's plugin guards imports.
func Command(ids []string, root string) []string {
	// -s: output streams to the capped log instead of piling up in pytest's capture files.
	// --continue-on-collection-errors: a module that fails to import fails its own tests only;
	// the other ids still run (pytest stops the whole session otherwise).
	// -o addopts=: the repository's own command-line defaults (-x, plugins, reports) are not
	// the harness's command.
	args := []string{"python3", "-m", "pytest", "-p", "no:cacheprovider", "-p", ReportPluginName,
		"-o", "junit_family=xunit1", "-o", "addopts=", "--junitxml=/dev/fd/4", "-q", "-rN", "-s", "--continue-on-collection-errors"}
	if root != "" {
		// Probes run under the harness's own configuration (probes.ini), never the repository's.
		args = append(args, "-p", judge.LibraryModule, "-c", InDir+"/probes.ini", "--rootdir="+root, "--confcutdir="+root)
		for _, id := range ids {
			args = append(args, path.Join(root, id))
		}
		return args
	}
	return append(args, ids...)
}

// Plugins are the -p arguments loading the pytest plugins a task's tests need (autoload is off).
func Plugins(t *task.Task) []string {
	var out []string
	for _, p := range t.Tests.Plugins {
		out = append(out, "-p", p)
	}
	return out
}
