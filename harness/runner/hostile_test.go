package runner_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/result"
	"github.com/infradev/infradev/harness/runner"
)

// hostileShapes are what a generated patch may do to the tree; each patch draws a few.
var hostileShapes = []func(r *rand.Rand, dir string) string{
	func(r *rand.Rand, dir string) string { // many small files
		n := 100 + r.IntN(3000)
		for i := range n {
			write(dir, fmt.Sprintf("many/%d/f%d.txt", i%37, i), []byte{byte(i)})
		}
		return fmt.Sprintf("%d small files", n)
	},
	func(r *rand.Rand, dir string) string { // long names
		name := strings.Repeat("L", 200+r.IntN(55))
		path := filepath.Join("long", name, strings.Repeat("m", 100+r.IntN(155)), name+".py")
		write(dir, path, []byte("x = 1\n"))
		return fmt.Sprintf("a path of %d bytes", len(path))
	},
	func(r *rand.Rand, dir string) string { // deep trees
		depth := 40 + r.IntN(90)
		parts := make([]string, depth)
		for i := range parts {
			parts[i] = "d" + strconv.Itoa(i)
		}
		write(dir, filepath.Join(append(parts, "deep.txt")...), []byte("deep\n"))
		return fmt.Sprintf("a tree %d deep", depth)
	},
	func(r *rand.Rand, dir string) string { // a large incompressible binary literal
		n := (1 + r.IntN(14)) << 20
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		write(dir, "blob.bin", b)
		return fmt.Sprintf("%d MiB of random bytes", n>>20)
	},
	func(r *rand.Rand, dir string) string { // a huge compressible file (a small binary delta)
		n := (40 + r.IntN(90)) << 20
		write(dir, "zeros.bin", make([]byte, n))
		return fmt.Sprintf("%d MiB of zeros", n>>20)
	},
	func(r *rand.Rand, dir string) string { // links in, out, dangling, over a directory
		targets := []string{"/etc/passwd", "../../../../run/infradev", "minitron/model.py", "nowhere", "/tmp"}
		t := targets[r.IntN(len(targets))]
		name := fmt.Sprintf("link%d", r.IntN(100))
		os.Symlink(t, filepath.Join(dir, name))
		if r.IntN(2) == 0 {
			os.RemoveAll(filepath.Join(dir, "tests"))
			os.Symlink(t, filepath.Join(dir, "tests"))
			return "tests/ replaced by a link to " + t
		}
		return "a link to " + t
	},
	func(r *rand.Rand, dir string) string { // modes
		p := filepath.Join(dir, "minitron", "model.py")
		os.Chmod(p, 0o755)
		write(dir, "run.sh", []byte("#!/bin/sh\necho hi\n"))
		os.Chmod(filepath.Join(dir, "run.sh"), 0o755)
		return "executable modes"
	},
	func(r *rand.Rand, dir string) string { // names with control characters and invalid UTF-8
		names := []string{"new\nline.py", "tab\there.py", "bell\x07.py", "del\x7f.py", "bad\xff\xfe.py", "esc\x1b[31m.py"}
		n := names[r.IntN(len(names))]
		write(dir, filepath.Join("minitron", n), []byte("import os\n"))
		return fmt.Sprintf("a name %q", n)
	},
	func(r *rand.Rand, dir string) string { // files become directories and directories files
		os.Remove(filepath.Join(dir, "minitron", "comm.py"))
		write(dir, "minitron/comm.py/__init__.py", []byte("x = 1\n"))
		os.RemoveAll(filepath.Join(dir, "tests"))
		write(dir, "tests", []byte("not a directory\n"))
		return "a module turned into a directory, tests/ into a file"
	},
	func(r *rand.Rand, dir string) string { // the official tests deleted or rewritten
		os.RemoveAll(filepath.Join(dir, "tests"))
		write(dir, "conftest.py", []byte("import pytest\n"))
		return "tests/ deleted, a root conftest.py added"
	},
}

func write(dir, rel string, data []byte) {
	p := filepath.Join(dir, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.Remove(p)
	os.WriteFile(p, data, 0o644)
}

// TestHostilePatchesStayInTheDenominator generates patches that reach for the harness's
// limits (many files, long names, deep trees, large binary literals, links, modes, names with
// control characters, files turned into directories) and runs each through the real runner:
// none may end in infra_error or task_error, whatever limit it hits; a hit limit is the
// submission's failure. INFRADEV_HOSTILE_PATCHES sets how many (default 10) and
// INFRADEV_HOSTILE_SEED the seed (default: a fresh one, logged).
func TestHostilePatchesStayInTheDenominator(t *testing.T) {
	testenv.RequireSandbox(t)
	n, _ := strconv.Atoi(os.Getenv("INFRADEV_HOSTILE_PATCHES"))
	if n <= 0 {
		n = 10
	}
	seed, err := strconv.ParseUint(os.Getenv("INFRADEV_HOSTILE_SEED"), 10, 64)
	if err != nil {
		seed = rand.Uint64()
	}
	t.Logf("%d hostile patches from seed %d (INFRADEV_HOSTILE_SEED=%d reproduces them)", n, seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	tk, ps := adversarialTask(t)
	r := testenv.Runner(t, nil)
	in := testenv.Inputs(t, tk, ps, nil)
	classes := map[string]int{}
	for i := range n {
		dir, git := demoRepo(t)
		var did []string
		for k := 1 + rng.IntN(3); k > 0; k-- {
			did = append(did, hostileShapes[rng.IntN(len(hostileShapes))](rng, dir))
		}
		git("", "add", "-A", "-f")
		patch := []byte(git("", "-c", "core.quotePath=true", "diff", "--cached", "--binary", "-M"))
		what := strings.Join(did, "; ")
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			a := in
			a.Patch = patch
			res, err := runner.Retry{Attempter: r}.Run(context.Background(), a, t.TempDir())
			if err != nil {
				t.Fatalf("%s (%d-byte patch): the harness failed: %v", what, len(patch), err)
			}
			classes[res.FailureClass]++
			switch {
			case res.FailureClass == result.InfraError || res.FailureClass == result.TaskError:
				t.Errorf("%s (%d-byte patch): %s: %s", what, len(patch), res.FailureClass, res.Reason)
			case res.Resolved:
				t.Errorf("%s: resolved, with no fix", what)
			}
			t.Logf("%s (%d bytes): %s %s", what, len(patch), res.FailureClass, firstLine(res.Reason))
		})
		os.RemoveAll(dir)
	}
	t.Logf("classes: %v", classes)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	if len(line) > 160 {
		line = line[:160]
	}
	return string(bytes.ToValidUTF8([]byte(line), []byte("?")))
}
