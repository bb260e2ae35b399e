// Package depcheck holds the test that keeps the harness's packages in one-way order: data
// flows spec -> image -> run -> grade -> report, and a package may import only packages of a
// lower layer. A new package must be given its layer here.
package depcheck_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/testenv"
)

const module = "github.com/infradev/infradev/harness/"

// layers lists every package, lowest first. A package imports only from layers below its own.
var layers = [][]string{
	// Leaves: files, digests, failure classes, the sandbox, layers and the statistics.
	{"atomicfile", "digest", "fault", "logcap", "layer", "mirror", "sandbox", "schedule", "canary", "cheat",
		"judge", "tamper", "stats", "patchread", "unpack", "internal/fixture"},
	// Spec decoding, the result record, GPU discovery.
	{"specfile", "result", "gpu", "gpu/gputest"},
	// The specs: environments, tasks, probes, predictions; GPU leases.
	{"envspec", "task", "probe", "predictions", "lease"},
	// Images, upstream derivations, the attempt's vocabulary, the protocol with the sandbox's
	// test runs, reports of many results, samples, Bazel files and the submissions they score.
	{"image", "upstream", "attempt", "pytestproto", "report", "samples", "suite", "bazelgen", "submissions"},
	// Grading a phase's raw output.
	{"grade"},
	// Preparing tasks' images; running one attempt (here, or as a Slurm job); the results store
	// around attempts.
	{"prepare", "runner", "slurm", "resultstore"},
	// What drives attempts: validation, imports, the failure analysis.
	{"validate", "importer", "analyze", "internal/testenv"},
	// Evaluations, the catalogue, the skill; a test cluster.
	{"eval", "catalogue", "skill", "internal/slurmtest"},
	// Agents run over evaluations.
	{"agent"},
	// The command line, then its main.
	{"cli"},
	{"cmd/infradev"},
}

func TestPackagesImportOnlyLowerLayers(t *testing.T) {
	root := filepath.Join(testenv.RepoRoot(t), "harness")
	rank := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			if _, dup := rank[p]; dup {
				t.Errorf("package %s is in two layers", p)
			}
			rank[p] = i
		}
	}
	imports := map[string]map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		pkg := filepath.ToSlash(rel)
		if imports[pkg] == nil {
			imports[pkg] = map[string]bool{}
		}
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if dep, ok := strings.CutPrefix(path, module); ok {
				imports[pkg][dep] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for p := range imports {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	if len(pkgs) < 30 {
		t.Fatalf("found %d packages under %s; the walk is broken", len(pkgs), root)
	}
	for _, p := range pkgs {
		r, ok := rank[p]
		if !ok {
			t.Errorf("package %s has no layer: add it to layers", p)
			continue
		}
		for dep := range imports[p] {
			if dr, ok := rank[dep]; ok && dr >= r {
				t.Errorf("%s (layer %d) imports %s (layer %d): a package may import only from lower layers", p, r, dep, dr)
			}
		}
	}
	for p := range rank {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("layers names %s, which does not exist", p)
		}
	}
}
