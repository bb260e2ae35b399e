// Package lease owns exclusive use of GPUs across processes. A lease holds an flock on one
// file per GPU (named by its UUID) under a runtime directory, so separate processes (concurrent
// Bazel test actions, several infradev commands) never hold the same GPU, and a holder that
// crashes releases its GPUs with its file descriptors. Among the free sets that satisfy a
// request, the best connected one is chosen (most NVLink pairs, then PCIe pairs).
package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/infradev/infradev/harness/gpu"
)

// Request is what an attempt asks for.
type Request struct {
	Count int
	// MinMemory excludes GPUs with less memory.
	MinMemory uint64
	// Connected requires every pair of the set to be linked by NVLink.
	Connected bool
	// Exclude are GPU indices not to lease (e.g. ones that just reported a fault).
	Exclude []int
}

// ErrUnsatisfiable means no set of this machine's GPUs can ever satisfy the request.
var ErrUnsatisfiable = errors.New("no set of GPUs on this machine satisfies the request")

// Lease is a set of GPUs held exclusively until Release.
type Lease struct {
	// Indices are the leased GPUs' indices, ascending.
	Indices []int
	files   []*os.File
}

// Release gives the GPUs back.
func (l *Lease) Release() {
	for _, f := range l.files {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}
	l.files = nil
}

// Acquire waits until a set of GPUs satisfying req is free and leases it, or ctx ends.
func Acquire(ctx context.Context, dir string, m *gpu.Machine, req Request) (*Lease, error) {
	sets := Candidates(m, req)
	if len(sets) == 0 {
		return nil, fmt.Errorf("%w: needs %d GPUs (min memory %d, connected %v), %d on this machine",
			ErrUnsatisfiable, req.Count, req.MinMemory, req.Connected, len(m.Devices))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	wait := time.Millisecond
	for {
		for _, set := range sets {
			if l, err := try(dir, m, set); err != nil {
				return nil, err
			} else if l != nil {
				return l, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// try locks every GPU of set without waiting; on any conflict it unlocks what it took.
func try(dir string, m *gpu.Machine, set []int) (*Lease, error) {
	l := &Lease{Indices: set}
	for _, i := range set {
		f, err := os.OpenFile(filepath.Join(dir, m.Devices[i].UUID+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			l.Release()
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			l.Release()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, nil
			}
			return nil, err
		}
		l.files = append(l.files, f)
	}
	return l, nil
}

// Candidates lists the sets of GPUs that satisfy req, best connected first.
func Candidates(m *gpu.Machine, req Request) [][]int {
	excluded := map[int]bool{}
	for _, i := range req.Exclude {
		excluded[i] = true
	}
	var eligible []int
	for _, d := range m.Devices {
		if d.MemoryBytes >= req.MinMemory && !excluded[d.Index] {
			eligible = append(eligible, d.Index)
		}
	}
	if req.Count <= 0 || req.Count > len(eligible) {
		return nil
	}
	var sets [][]int
	var pick func(start int, cur []int)
	pick = func(start int, cur []int) {
		if len(cur) == req.Count {
			set := append([]int{}, cur...)
			if !req.Connected || m.Connected(set) {
				sets = append(sets, set)
			}
			return
		}
		for i := start; i < len(eligible); i++ {
			pick(i+1, append(cur, eligible[i]))
		}
	}
	pick(0, nil)
	score := func(set []int) (int, int) {
		nv, pcie := 0, 0
		for a := range set {
			for b := a + 1; b < len(set); b++ {
				switch m.Links[set[a]][set[b]] {
				case gpu.LinkNVLink:
					nv++
				case gpu.LinkPCIe:
					pcie++
				}
			}
		}
		return nv, pcie
	}
	sort.SliceStable(sets, func(a, b int) bool {
		na, pa := score(sets[a])
		nb, pb := score(sets[b])
		if na != nb {
			return na > nb
		}
		return pa > pb
	})
	return sets
}
