package envspec_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/infradev/infradev/harness/envspec"
)

func write(t *testing.T, root, name, yaml string) string {
	dir := filepath.Join(root, name)
	os.MkdirAll(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, "env.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

const digest = "sha256:cf9197f9321ac3f49276633b4e78c79aa55f22578de3b650b3158ce6e3481f61"

func TestFromStacksEnvironments(t *testing.T) {
	root := t.TempDir()
	write(t, root, "base", `schema: infradev.env/v1
name: base
layers:
  - {name: torch, image: {ref: "docker.io/pytorch/pytorch@`+digest+`"}}
config: {env: {A: "1", B: "1"}, workdir: /w}
`)
	dir := write(t, root, "proj", `schema: infradev.env/v1
name: proj
from: base
layers:
  - {name: src, git: {url: "https://github.com/example/proj", commit: "0123456789abcdef0123456789abcdef01234567", dest: /w/proj}}
  - {name: install, run: {command: [pip, install, -e, /w/proj]}}
config: {env: {B: "2"}}
`)
	e, err := envspec.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range e.Layers {
		names = append(names, s.Name+":"+s.Kind())
	}
	if got := strings.Join(names, ","); got != "torch:image,src:git,install:run" {
		t.Errorf("layers = %s", got)
	}
	if e.Config.Env["A"] != "1" || e.Config.Env["B"] != "2" || e.Config.WorkingDir != "/w" {
		t.Errorf("config = %+v, want the child's values over the parent's", e.Config)
	}
}

func TestBadSteps(t *testing.T) {
	root := t.TempDir()
	dir := write(t, root, "bad", `schema: infradev.env/v1
name: bad
layers:
  - {name: base, image: {ref: "pytorch/pytorch:latest"}}
  - {name: src, git: {url: "https://github.com/x/y", commit: "main", dest: /w}}
  - {name: both, run: {command: []}, copy: {source: x, dest: /}}
  - {name: cmd, run: {command: []}}
`)
	_, err := envspec.Load(dir)
	for _, want := range []string{
		"env.yaml:4: layers[0].image.ref: must pin a digest",
		"env.yaml:5: layers[1].git.commit: must be a full 40-hex commit id",
		"env.yaml:6: layers[2]: must have exactly one of",
		"env.yaml:7: layers[3].run.command: must be a non-empty argument list",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	cyc := write(t, root, "a", "schema: infradev.env/v1\nname: a\nfrom: b\n")
	write(t, root, "b", "schema: infradev.env/v1\nname: b\nfrom: a\n")
	if _, err := envspec.Load(cyc); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("cyclic from: error = %v", err)
	}
}
