package lease_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/gpu/gputest"
	"github.com/infradev/infradev/harness/lease"
)

// TestMain doubles as the lease-holding helper process of TestProcessesNeverShareAGPU.
func TestMain(m *testing.M) {
	if os.Getenv("LEASE_HELPER_DIR") != "" {
		os.Exit(helper())
	}
	os.Exit(m.Run())
}

func islands(t testing.TB) *gpu.Machine {
	m, err := gpu.Discover(gputest.Islands())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// helper leases GPUs as its environment asks, holds them briefly, and logs when and which.
func helper() int {
	m, err := gpu.Discover(gputest.Islands())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	n, _ := strconv.Atoi(os.Getenv("LEASE_HELPER_COUNT"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := lease.Acquire(ctx, os.Getenv("LEASE_HELPER_DIR"), m, lease.Request{Count: n, Connected: n > 1 && n <= 4})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if held := os.Getenv("LEASE_HELPER_HELD"); held != "" {
		os.WriteFile(held, nil, 0o644)
		select {} // hold until killed
	}
	start := time.Now().UnixNano()
	time.Sleep(15 * time.Millisecond)
	end := time.Now().UnixNano()
	idx := make([]string, len(l.Indices))
	for i, x := range l.Indices {
		idx[i] = strconv.Itoa(x)
	}
	l.Release()
	f, err := os.OpenFile(os.Getenv("LEASE_HELPER_LOG"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return 1
	}
	fmt.Fprintf(f, "%d %d %d %s\n", n, start, end, strings.Join(idx, ","))
	f.Close()
	return 0
}

// TestProcessesNeverShareAGPU: 64 separate processes ask concurrently for 1, 2, 4 or 8 GPUs of
// a mocked 8-GPU machine with two NVLink islands. No GPU is ever held by two of them at once,
// and every 2- and 4-GPU lease is an NVLink-connected set.
func TestProcessesNeverShareAGPU(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	counts := []int{1, 2, 4, 1, 2, 1, 8, 4}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for p := 0; p < 64; p++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "LEASE_HELPER_DIR="+filepath.Join(dir, "locks"), "LEASE_HELPER_LOG="+log,
			"LEASE_HELPER_COUNT="+strconv.Itoa(counts[p%len(counts)]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("helper: %v: %s", err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	type hold struct {
		n          int
		start, end int64
		gpus       []int
	}
	var holds []hold
	m := islands(t)
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var h hold
		var set string
		fmt.Sscanf(line, "%d %d %d %s", &h.n, &h.start, &h.end, &set)
		for _, s := range strings.Split(set, ",") {
			i, _ := strconv.Atoi(s)
			h.gpus = append(h.gpus, i)
		}
		if len(h.gpus) != h.n {
			t.Errorf("asked for %d GPUs, got %v", h.n, h.gpus)
		}
		if h.n > 1 && h.n <= 4 && !m.Connected(h.gpus) {
			t.Errorf("%d-GPU lease %v is not NVLink-connected though connected sets exist", h.n, h.gpus)
		}
		holds = append(holds, h)
	}
	if len(holds) != 64 {
		t.Fatalf("%d leases logged, want 64", len(holds))
	}
	for a := range holds {
		for b := a + 1; b < len(holds); b++ {
			x, y := holds[a], holds[b]
			if x.start < y.end && y.start < x.end {
				for _, g := range x.gpus {
					for _, h := range y.gpus {
						if g == h {
							t.Fatalf("GPU %d held by two processes at once (%v and %v)", g, x.gpus, y.gpus)
						}
					}
				}
			}
		}
	}
}

func TestCrashedHolderReleasesItsGPUs(t *testing.T) {
	dir := t.TempDir()
	m := islands(t)
	// A child process takes every GPU and is killed while holding them.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	held := filepath.Join(t.TempDir(), "held")
	cmd.Env = append(os.Environ(), "LEASE_HELPER_DIR="+dir, "LEASE_HELPER_LOG="+filepath.Join(dir, "log"),
		"LEASE_HELPER_COUNT=8", "LEASE_HELPER_HELD="+held)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(held); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child never took the GPUs")
		}
	}
	busy, cancelBusy := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if l, err := lease.Acquire(busy, dir, m, lease.Request{Count: 1}); err == nil {
		l.Release()
		t.Fatal("a GPU was leased while another process held all eight")
	}
	cancelBusy()
	cmd.Process.Kill()
	cmd.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := lease.Acquire(ctx, dir, m, lease.Request{Count: 8})
	if err != nil {
		t.Fatalf("GPUs of a killed holder were not released: %v", err)
	}
	l.Release()
}

func TestCandidatesPreferNVLinkAndRefuseTheImpossible(t *testing.T) {
	m := islands(t)
	sets := lease.Candidates(m, lease.Request{Count: 2})
	if !m.Connected(sets[0]) {
		t.Errorf("best 2-GPU set %v is not NVLink-connected", sets[0])
	}
	if got := lease.Candidates(m, lease.Request{Count: 5, Connected: true}); len(got) != 0 {
		t.Errorf("5 connected GPUs cannot exist on two islands of 4; got %v", got[0])
	}
	_, err := lease.Acquire(context.Background(), t.TempDir(), m, lease.Request{Count: 9})
	if err == nil || !strings.Contains(err.Error(), "needs 9 GPUs") {
		t.Errorf("Acquire(9) error = %v", err)
	}
	a, _ := lease.Acquire(context.Background(), filepath.Join(t.TempDir()), m, lease.Request{Count: 4, Connected: true})
	defer a.Release()
	if !m.Connected(a.Indices) {
		t.Errorf("4-GPU connected lease %v", a.Indices)
	}
}
