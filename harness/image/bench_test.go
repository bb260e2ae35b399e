package image_test

import (
	"context"
	"testing"

	"github.com/infradev/infradev/harness/image"
)

// TestBenchStoresSharedLayersOnce checks the benchmark's byte figures (not its times, which
// are the benchmark command's business): stacked images store the base and framework layers
// once, flattened ones once per task.
func TestBenchStoresSharedLayersOnce(t *testing.T) {
	r, err := image.Bench(context.Background(), image.BenchConfig{Dir: t.TempDir(), Frameworks: 2, Tasks: 3,
		BaseBytes: 4 << 20, FrameworkBytes: 1 << 20, TaskBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if r.Images != 6 {
		t.Errorf("images = %d, want 6", r.Images)
	}
	// Shared: base + 2 frameworks + 6 tasks (+1 incremental); flattened: 6 (+1) full copies.
	if reduction := 1 - float64(r.SharedBytes)/float64(r.FlatBytes); reduction < 0.7 {
		t.Errorf("shared %d bytes vs flattened %d: reduction %.2f, want the base stored once", r.SharedBytes, r.FlatBytes, reduction)
	}
}
