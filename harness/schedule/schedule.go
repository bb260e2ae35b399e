// Package schedule owns packing task attempts onto one machine's capacity: CPUs, memory and
// GPUs. Attempts are taken largest first (GPUs, then CPUs, then memory); whenever capacity
// frees up, the first waiting attempt that fits starts, so small attempts fill the gaps around
// large ones. GPUs are handed out as exact device sets: no two running attempts share one.
// Simulate runs the same policy on a virtual clock.
package schedule

import (
	"context"
	"fmt"
	"sort"
	"sync"
)

// Capacity is what a machine offers.
type Capacity struct {
	CPUs        float64
	MemoryBytes int64
	// GPUs are the device indices that may be handed out.
	GPUs []int
}

// Request is what one attempt needs.
type Request struct {
	CPUs        float64
	MemoryBytes int64
	GPUs        int
}

// Fits reports whether r can ever run on c; if not, why.
func (c Capacity) Fits(r Request) error {
	switch {
	case r.GPUs > len(c.GPUs):
		return fmt.Errorf("needs %d GPUs, %d available", r.GPUs, len(c.GPUs))
	case r.CPUs > c.CPUs:
		return fmt.Errorf("needs %g CPUs, %g available", r.CPUs, c.CPUs)
	case r.MemoryBytes > c.MemoryBytes:
		return fmt.Errorf("needs %d bytes of memory, %d available", r.MemoryBytes, c.MemoryBytes)
	}
	return nil
}

// free is the unleased part of a capacity.
type free struct {
	cpus float64
	mem  int64
	gpus []int // sorted
	jobs int   // attempts that may still start; <0 means no cap
}

func (f *free) fits(r Request) bool {
	return f.jobs != 0 && r.CPUs <= f.cpus+1e-9 && r.MemoryBytes <= f.mem && r.GPUs <= len(f.gpus)
}

func (f *free) take(r Request) []int {
	f.cpus -= r.CPUs
	f.mem -= r.MemoryBytes
	if f.jobs > 0 {
		f.jobs--
	}
	g := append([]int{}, f.gpus[:r.GPUs]...)
	f.gpus = f.gpus[r.GPUs:]
	return g
}

func (f *free) give(r Request, gpus []int, capped bool) {
	f.cpus += r.CPUs
	f.mem += r.MemoryBytes
	if capped {
		f.jobs++
	}
	f.gpus = append(f.gpus, gpus...)
	sort.Ints(f.gpus)
}

// Order is the order attempts are considered in: largest first, ties by index.
func Order(reqs []Request) []int {
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := reqs[idx[a]], reqs[idx[b]]
		if x.GPUs != y.GPUs {
			return x.GPUs > y.GPUs
		}
		if x.CPUs != y.CPUs {
			return x.CPUs > y.CPUs
		}
		return x.MemoryBytes > y.MemoryBytes
	})
	return idx
}

// pick returns the position in pending of the first request that fits, or -1.
func pick(pending []int, reqs []Request, f *free) int {
	for pos, i := range pending {
		if f.fits(reqs[i]) {
			return pos
		}
	}
	return -1
}

// Lease is the capacity one running attempt holds.
type Lease struct {
	// GPUs are the device indices this attempt may use, exclusively.
	GPUs []int
}

// Run starts run(ctx, i, lease) for every request that fits the capacity, at most jobs at a time
// (0: no cap), packing as the package doc says, and calls reject(i, why) for requests that can
// never fit. It returns when every started attempt has returned; if ctx ends, no new attempt
// starts and ctx's error is returned.
func Run(ctx context.Context, c Capacity, jobs int, reqs []Request, run func(ctx context.Context, i int, l Lease), reject func(i int, why error)) error {
	f := &free{cpus: c.CPUs, mem: c.MemoryBytes, gpus: append([]int{}, c.GPUs...), jobs: -1}
	sort.Ints(f.gpus)
	if jobs > 0 {
		f.jobs = jobs
	}
	var pending []int
	for _, i := range Order(reqs) {
		if err := c.Fits(reqs[i]); err != nil {
			reject(i, err)
			continue
		}
		pending = append(pending, i)
	}
	var mu sync.Mutex
	released := make(chan struct{}, len(reqs)+1)
	var wg sync.WaitGroup
	for len(pending) > 0 {
		if ctx.Err() != nil {
			break
		}
		mu.Lock()
		pos := pick(pending, reqs, f)
		if pos < 0 {
			mu.Unlock()
			select {
			case <-released:
			case <-ctx.Done():
			}
			continue
		}
		i := pending[pos]
		pending = append(pending[:pos], pending[pos+1:]...)
		gpus := f.take(reqs[i])
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(ctx, i, Lease{GPUs: gpus})
			mu.Lock()
			f.give(reqs[i], gpus, jobs > 0)
			mu.Unlock()
			released <- struct{}{}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// Interval is when one simulated attempt ran and on which GPUs.
type Interval struct {
	Index      int
	Start, End float64
	GPUs       []int
}

// Simulate runs the policy of Run on a virtual clock, each request i taking durations[i], and
// returns the makespan and every attempt's interval.
func Simulate(c Capacity, jobs int, reqs []Request, durations []float64) (float64, []Interval) {
	f := &free{cpus: c.CPUs, mem: c.MemoryBytes, gpus: append([]int{}, c.GPUs...), jobs: -1}
	sort.Ints(f.gpus)
	if jobs > 0 {
		f.jobs = jobs
	}
	var pending []int
	for _, i := range Order(reqs) {
		if c.Fits(reqs[i]) == nil {
			pending = append(pending, i)
		}
	}
	var running []Interval
	var done []Interval
	now := 0.0
	for len(pending) > 0 || len(running) > 0 {
		for {
			pos := pick(pending, reqs, f)
			if pos < 0 {
				break
			}
			i := pending[pos]
			pending = append(pending[:pos], pending[pos+1:]...)
			running = append(running, Interval{Index: i, Start: now, End: now + durations[i], GPUs: f.take(reqs[i])})
		}
		if len(running) == 0 {
			break
		}
		sort.Slice(running, func(a, b int) bool { return running[a].End < running[b].End })
		next := running[0]
		running = running[1:]
		now = next.End
		f.give(reqs[next.Index], next.GPUs, jobs > 0)
		done = append(done, next)
	}
	return now, done
}
