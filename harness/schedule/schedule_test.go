package schedule_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/schedule"
)

var eightGPUs = schedule.Capacity{CPUs: 64, MemoryBytes: 512 << 30, GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}

// mix is a suite of 1/2/4/8-GPU attempts with durations in seconds.
func mix(seed uint64) ([]schedule.Request, []float64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var reqs []schedule.Request
	var durs []float64
	for _, g := range []struct{ gpus, n int }{{1, 40}, {2, 20}, {4, 10}, {8, 4}} {
		for i := 0; i < g.n; i++ {
			reqs = append(reqs, schedule.Request{CPUs: float64(2 * g.gpus), MemoryBytes: int64(g.gpus) << 30, GPUs: g.gpus})
			durs = append(durs, 60+rng.Float64()*540)
		}
	}
	return reqs, durs
}

// TestMakespanNearLowerBound: on 8 GPUs, a mix of 1/2/4/8-GPU attempts finishes within 1.2x
// of the lower bound (GPU-seconds / GPUs, or the longest attempt), and no GPU is ever shared.
func TestMakespanNearLowerBound(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		reqs, durs := mix(seed)
		makespan, ivs := schedule.Simulate(eightGPUs, 0, reqs, durs)
		var gpuSeconds, longest float64
		for i, r := range reqs {
			gpuSeconds += float64(r.GPUs) * durs[i]
			longest = max(longest, durs[i])
		}
		bound := max(gpuSeconds/8, longest)
		if len(ivs) != len(reqs) {
			t.Fatalf("seed %d: %d of %d attempts ran", seed, len(ivs), len(reqs))
		}
		if ratio := makespan / bound; ratio > 1.2 {
			t.Errorf("seed %d: makespan %.0fs is %.3fx the lower bound %.0fs", seed, makespan, ratio, bound)
		}
		for a := range ivs {
			for b := a + 1; b < len(ivs); b++ {
				x, y := ivs[a], ivs[b]
				if x.Start < y.End && y.Start < x.End && overlap(x.GPUs, y.GPUs) {
					t.Fatalf("seed %d: attempts %d and %d share a GPU (%v, %v) at the same time", seed, x.Index, y.Index, x.GPUs, y.GPUs)
				}
			}
		}
	}
}

func overlap(a, b []int) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// TestRunHandsOutExclusiveGPUs runs the real executor with fake attempts and checks, while they
// run, that no GPU is held twice, that --jobs holds, and that impossible requests are rejected.
func TestRunHandsOutExclusiveGPUs(t *testing.T) {
	reqs, _ := mix(7)
	reqs = append(reqs, schedule.Request{GPUs: 16})
	var holders [8]atomic.Int32
	var running, maxRunning atomic.Int32
	var mu sync.Mutex
	ran := map[int]bool{}
	var rejected []int
	err := schedule.Run(context.Background(), eightGPUs, 6, reqs, func(_ context.Context, i int, l schedule.Lease) {
		if len(l.GPUs) != reqs[i].GPUs {
			t.Errorf("attempt %d asked for %d GPUs, got %v", i, reqs[i].GPUs, l.GPUs)
		}
		n := running.Add(1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				break
			}
		}
		for _, g := range l.GPUs {
			if holders[g].Add(1) != 1 {
				t.Errorf("GPU %d held by two attempts", g)
			}
		}
		time.Sleep(time.Millisecond)
		for _, g := range l.GPUs {
			holders[g].Add(-1)
		}
		running.Add(-1)
		mu.Lock()
		ran[i] = true
		mu.Unlock()
	}, func(i int, why error) { rejected = append(rejected, i) })
	if err != nil {
		t.Fatal(err)
	}
	if len(ran) != len(reqs)-1 || len(rejected) != 1 || rejected[0] != len(reqs)-1 {
		t.Errorf("ran %d, rejected %v; want all but the 16-GPU request", len(ran), rejected)
	}
	if maxRunning.Load() > 6 {
		t.Errorf("%d attempts ran at once with --jobs 6", maxRunning.Load())
	}
}

func TestRunStopsStartingOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	reqs := make([]schedule.Request, 20)
	for i := range reqs {
		reqs[i] = schedule.Request{CPUs: 1}
	}
	var started atomic.Int32
	err := schedule.Run(ctx, schedule.Capacity{CPUs: 2, MemoryBytes: 1}, 0, reqs, func(ctx context.Context, i int, _ schedule.Lease) {
		if started.Add(1) == 2 {
			cancel()
		}
		<-ctx.Done()
	}, func(int, error) {})
	if err == nil || started.Load() != 2 {
		t.Errorf("err %v, started %d; want cancellation after the first 2", err, started.Load())
	}
}
