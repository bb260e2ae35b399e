package image_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/image"
	"github.com/infradev/infradev/harness/internal/testenv"
	"github.com/infradev/infradev/harness/sandbox"
	"github.com/infradev/infradev/harness/unpack"
)

// frameworkImports are what each real environment must import: torch and the framework's key
// dependencies (the framework itself comes with each task's repository layer), with versions
// the CPU feasibility runs pinned.
var frameworkImports = map[string]string{
	"python-torch": `import torch, triton
assert torch.__version__.startswith("2.9.0"), torch.__version__
x = torch.arange(6.0).reshape(2, 3)
assert (x @ x.T).tolist() == [[5.0, 14.0], [14.0, 50.0]]
print("torch", torch.__version__, "triton", triton.__version__)`,
	"megatron": `import os, torch, numpy, einops, yaml, regex, six, psutil, click, requests, tqdm, pytest, pytest_mock, pytest_asyncio
assert numpy.__version__ == "2.5.5", numpy.__version__
assert os.listdir("/opt/data"), "/opt/data is empty"
print("torch", torch.__version__, "numpy", numpy.__version__, "pytest", pytest.__version__)`,
	"vllm": `import torch, torchvision, transformers, tokenizers, numpy, fastapi, pydantic, msgspec, zmq, blake3, cbor2, gguf, openai, safetensors, sentencepiece, tiktoken, xgrammar, llguidance, compressed_tensors, prometheus_client, psutil, cachetools, pytest, pytest_asyncio
assert transformers.__version__ == "4.57.1", transformers.__version__
import setuptools; assert setuptools.__version__ == "80.10.2", setuptools.__version__
import importlib.metadata as md; assert md.version("vllm").endswith("+cpu"), md.version("vllm")
from transformers import AutoConfig
for model, layers in (("Qwen/Qwen3-0.6B", 28), ("Qwen/Qwen1.5-7B", 32), ("facebook/opt-125m", 12)):
    assert AutoConfig.from_pretrained(model).num_hidden_layers == layers, model
print("torch", torch.__version__, "transformers", transformers.__version__, "torchvision", torchvision.__version__)`,
	"verl": `import torch, ray, tensordict, transformers, datasets, hydra, omegaconf, numpy, pandas, pyarrow, accelerate, peft, codetiming, torchdata, wandb, math_verify, antlr4, pytest, pytest_asyncio
assert numpy.__version__ == "2.3.5", numpy.__version__
import fsspec; assert fsspec.__version__ == "2026.6.0", fsspec.__version__
print("torch", torch.__version__, "ray", ray.__version__, "tensordict", tensordict.__version__, "numpy", numpy.__version__)`,
}

// TestFrameworkImagesImport runs, in the sandbox (no network, read-only root), each real
// environment's imports in its image as the store holds it and env.lock pins it. The images
// are large (torch alone is 4.3 GiB compressed): the test skips those not built into the
// default store (`infradev env build environments/<name>`).
func TestFrameworkImagesImport(t *testing.T) {
	testenv.RequireSandbox(t)
	root := testenv.RepoRoot(t)
	st := image.Store{Dir: testenv.Store(t)}
	for _, name := range []string{"python-torch", "megatron", "vllm", "verl"} {
		t.Run(name, func(t *testing.T) {
			lock, err := image.ReadLock(filepath.Join(root, "environments", name))
			if err != nil || lock == nil {
				t.Fatalf("environments/%s/env.lock: %v", name, err)
			}
			if got, err := image.Resolve(st.Layout(), name); err != nil || got != lock.Manifest {
				t.Skipf("%s as env.lock pins it is not in %s (have %q): infradev env build environments/%s", name, st.Dir, got, name)
			}
			ctx := context.Background()
			lowers, cfg, err := (&unpack.Cache{Dir: filepath.Join(st.Dir, "unpacked")}).Stack(ctx, st.Layout(), lock.Manifest)
			if err != nil {
				t.Fatal(err)
			}
			ov, err := sandbox.MountOverlay(lowers, filepath.Join(t.TempDir(), "run"), 64<<20)
			if err != nil {
				t.Fatal(err)
			}
			defer ov.Unmount()
			var out bytes.Buffer
			start := time.Now()
			res, err := (&sandbox.Runc{StateDir: filepath.Join(testenv.Cache(t), "sandbox")}).Run(ctx, sandbox.Spec{
				Root: ov.Merged, Env: append(cfg.Config.Env, "HOME=/tmp"), Cwd: "/tmp", Stdout: &out, Stderr: &out,
				Args: []string{"python3", "-c", frameworkImports[name]}, Timeout: 5 * time.Minute,
				Limits: sandbox.Limits{TmpSize: 1 << 30},
			})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("imports in %s: %v %+v\n%s", name, err, res, out.String())
			}
			t.Logf("%s: %s (%s)", name, strings.TrimSpace(lastOutputLine(out.String())), time.Since(start).Round(time.Millisecond))
		})
	}
}

func lastOutputLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
