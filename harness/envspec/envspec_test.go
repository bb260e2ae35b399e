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

func TestBadPipSteps(t *testing.T) {
	root := t.TempDir()
	dir := write(t, root, "bad", `schema: infradev.env/v1
name: bad
layers:
  - {name: py, pip: {venv: /opt/venv, requirements: [six], lock: six.lock}}
  - {name: base, copy: {source: ., dest: /}}
  - {name: rel, pip: {venv: opt/venv, requirements: [six], lock: a.lock}}
  - {name: none, pip: {venv: /opt/venv, requirements: [], lock: b.lock}}
  - {name: out, pip: {venv: /opt/venv, requirements: [six], lock: ../x.lock}}
  - {name: opt, pip: {venv: /opt/venv, requirements: ["--index-url=http://x"], lock: c.lock}}
  - {name: twice, pip: {venv: /opt/venv, requirements: [six], lock: c.lock}}
  - {name: nolock, pip: {venv: /opt/venv, requirements: [six]}}
`)
	_, err := envspec.Load(dir)
	for _, want := range []string{
		"env.yaml:4: layers[0].pip: a pip step needs layers below it",
		"env.yaml:6: layers[2].pip.venv: must be a clean absolute path",
		"env.yaml:7: layers[3].pip.requirements: must list at least one requirement",
		"env.yaml:8: layers[4].pip.lock: must be a file name inside",
		"env.yaml:9: layers[5].pip.requirements[0]: must be one requirement specifier",
		"env.yaml:10: layers[6].pip.lock: \"c.lock\" is the lock of another pip step",
		"env.yaml:11: layers[7].pip.lock: is required",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	good := write(t, root, "good", `schema: infradev.env/v1
name: good
from: bad2
layers:
  - {name: py, pip: {venv: /opt/venv, requirements: ["torch==2.9.0"], lock: torch.lock}}
`)
	write(t, root, "bad2", "schema: infradev.env/v1\nname: bad2\nlayers:\n  - {name: base, copy: {source: ., dest: /}}\n")
	e, err := envspec.Load(good)
	if err != nil {
		t.Fatal(err)
	}
	if s := e.Layers[1]; s.Kind() != "pip" || s.LockPath() != filepath.Join(good, "torch.lock") {
		t.Errorf("pip step %+v: kind %s, lock %s", s, s.Kind(), s.LockPath())
	}
}
