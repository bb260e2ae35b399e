package image

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/infradev/infradev/harness/envspec"
	"github.com/infradev/infradev/harness/layer"
)

// BenchConfig sizes the environment benchmark. The defaults are the sizes of real images
// (a CUDA + PyTorch base, a framework install, a task's repository) scaled down by about 50.
type BenchConfig struct {
	// Dir holds the generated content and both stores. Required.
	Dir                                  string
	Frameworks, Tasks                    int   // default 3 and 12 (tasks per framework)
	BaseBytes, FrameworkBytes, TaskBytes int64 // default 180MiB, 30MiB, 2MiB
}

// BenchResult is what the benchmark measured, side by side in one run.
type BenchResult struct {
	Images                             int
	SharedBytes, FlatBytes             int64
	SharedSeconds, FlatSeconds         float64
	IncrementalShared, IncrementalFlat float64 // seconds to add one more task image
}

func (c *BenchConfig) defaults() {
	if c.Frameworks == 0 {
		c.Frameworks = 3
	}
	if c.Tasks == 0 {
		c.Tasks = 12
	}
	if c.BaseBytes == 0 {
		c.BaseBytes = 180 << 20
	}
	if c.FrameworkBytes == 0 {
		c.FrameworkBytes = 30 << 20
	}
	if c.TaskBytes == 0 {
		c.TaskBytes = 2 << 20
	}
}

// Bench builds Frameworks x Tasks task images twice: (a) as InfraDev does, environments stacked
// with from: into one layout where every layer is stored once, and (b) flattened, one layer per
// task image in its own layout, as per-task container images are. Both are real builds.
func Bench(ctx context.Context, c BenchConfig) (*BenchResult, error) {
	c.defaults()
	envs := filepath.Join(c.Dir, "environments")
	// Each environment's content sits in its own directory, as a copy step's source must.
	content := func(name string) string { return filepath.Join(envs, name, "content") }
	seed := uint64(1)
	gen := func(name string, size int64) error {
		seed++
		return generate(content(name), size, seed)
	}
	if err := gen("base", c.BaseBytes); err != nil {
		return nil, err
	}
	if err := writeEnv(envs, "base", "", "/opt/base"); err != nil {
		return nil, err
	}
	type task struct{ fw, name string }
	var tasks []task
	for f := 0; f < c.Frameworks; f++ {
		fw := fmt.Sprintf("fw%d", f)
		if err := gen(fw, c.FrameworkBytes); err != nil {
			return nil, err
		}
		if err := writeEnv(envs, fw, "base", "/opt/"+fw); err != nil {
			return nil, err
		}
		for t := 0; t <= c.Tasks; t++ { // one extra per framework for the incremental figure
			name := fmt.Sprintf("%s-task%02d", fw, t)
			if err := gen(name, c.TaskBytes); err != nil {
				return nil, err
			}
			if err := writeEnv(envs, name, fw, "/workspace/"+name); err != nil {
				return nil, err
			}
			tasks = append(tasks, task{fw, name})
		}
	}
	var main, extra []task
	for _, t := range tasks {
		if t.name[len(t.name)-2:] == fmt.Sprintf("%02d", c.Tasks) {
			extra = append(extra, t)
		} else {
			main = append(main, t)
		}
	}

	res := &BenchResult{Images: len(main)}
	shared := Store{Dir: filepath.Join(c.Dir, "shared")}
	buildShared := func(t task) error {
		env, err := envspec.Load(filepath.Join(envs, t.name))
		if err != nil {
			return err
		}
		_, err = Build(ctx, env, shared, Options{})
		return err
	}
	start := time.Now()
	for _, t := range main {
		if err := buildShared(t); err != nil {
			return nil, err
		}
	}
	res.SharedSeconds = time.Since(start).Seconds()
	res.SharedBytes = duBytes(shared.Layout())

	flatRoot := filepath.Join(c.Dir, "flat")
	buildFlat := func(t task) error {
		return flatImage(filepath.Join(flatRoot, t.name), []srcDest{
			{content("base"), "/opt/base"},
			{content(t.fw), "/opt/" + t.fw},
			{content(t.name), "/workspace/" + t.name},
		})
	}
	start = time.Now()
	for _, t := range main {
		if err := buildFlat(t); err != nil {
			return nil, err
		}
	}
	res.FlatSeconds = time.Since(start).Seconds()
	res.FlatBytes = duBytes(flatRoot)

	start = time.Now()
	if err := buildShared(extra[0]); err != nil {
		return nil, err
	}
	res.IncrementalShared = time.Since(start).Seconds()
	start = time.Now()
	if err := buildFlat(extra[0]); err != nil {
		return nil, err
	}
	res.IncrementalFlat = time.Since(start).Seconds()
	return res, nil
}

type srcDest struct{ src, dest string }

// flatImage writes one image with a single layer holding every tree, in a layout of its own.
func flatImage(dir string, trees []srcDest) error {
	layoutDir := filepath.Join(dir, "oci")
	if err := initLayout(layoutDir); err != nil {
		return err
	}
	w, err := layer.Create(filepath.Join(dir, "layer.tar.gz"), layer.Options{})
	if err != nil {
		return err
	}
	for _, t := range trees {
		if err := w.AddTree(t.src, t.dest, nil); err != nil {
			w.Abort()
			return err
		}
	}
	info, err := w.Close()
	if err != nil {
		return err
	}
	if err := os.Rename(info.Path, blobPath(layoutDir, info.Digest)); err != nil {
		return err
	}
	b := &builder{st: Store{Dir: dir}}
	l, err := b.blobLayerIn(layoutDir, stepRecord{Digest: info.Digest, DiffID: info.DiffID, Size: info.Size})
	if err != nil {
		return err
	}
	img, err := assemble(&envspec.Env{Name: "flat", Layers: []envspec.Step{{Name: "flat", Copy: &envspec.Copy{}}}}, []v1.Layer{l})
	if err != nil {
		return err
	}
	_, err = putImage(layoutDir, img, "flat")
	return err
}

func writeEnv(root, name, from, dest string) error {
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fromLine := ""
	if from != "" {
		fromLine = "from: " + from + "\n"
	}
	yaml := fmt.Sprintf("schema: infradev.env/v1\nname: %s\n%slayers:\n  - name: %s\n    copy: {source: content, dest: %s}\n", name, fromLine, name, dest)
	return os.WriteFile(filepath.Join(dir, "env.yaml"), []byte(yaml), 0o644)
}

// generate writes size bytes of files of 1MiB: half random, half repetitive text, so the data
// compresses about as well as binaries and libraries do.
func generate(dir string, size int64, seed uint64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	const chunk = 1 << 20
	buf := make([]byte, chunk)
	for i := 0; int64(i)*chunk < size; i++ {
		n := min(int64(chunk), size-int64(i)*chunk)
		for j := 0; j < int(n)/2; j += 8 {
			v := rng.Uint64()
			for k := 0; k < 8 && j+k < int(n)/2; k++ {
				buf[j+k] = byte(v >> (8 * k))
			}
		}
		for j := int(n) / 2; j < int(n); j++ {
			buf[j] = "infradev layer data "[j%20]
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d.bin", i)), buf[:n], 0o644); err != nil {
			return err
		}
	}
	return nil
}

func duBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
