// Package gpu owns what the harness knows of a machine's NVIDIA GPUs, through go-nvml's
// nvml.Interface: discovery (index, UUID, name, memory, compute capability, NVLink/P2P links
// between pairs), health (ECC errors, retired pages, Xid events), and sampling a GPU's memory
// use during a run. Tests use go-nvml's mocks; without a driver Discover says so and nothing
// else is called (after a failed Init, any other NVML call kills the process).
package gpu

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoDriver is returned by Discover when NVML cannot be initialised (no driver here).
var ErrNoDriver = errors.New("no NVIDIA driver (NVML did not initialise)")

// Link is how two GPUs reach each other.
type Link int

const (
	LinkNone   Link = iota // no peer-to-peer path
	LinkPCIe               // peer-to-peer over PCIe
	LinkNVLink             // NVLink (directly or through NVSwitch)
)

func (l Link) String() string {
	return [...]string{"none", "pcie", "nvlink"}[l]
}

// Device is one GPU.
type Device struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memory_bytes"`
	// Compute is the CUDA compute capability, e.g. "9.0".
	Compute string `json:"compute_capability"`
	// Minor is the device node's minor number (/dev/nvidia<minor>).
	Minor int `json:"minor"`
}

// Machine is the GPUs of one machine and the links between every pair.
type Machine struct {
	Driver  string   `json:"driver"`
	Devices []Device `json:"devices"`
	// Links[i][j] is how device i reaches device j.
	Links [][]Link `json:"links"`
}

// Connected reports whether every pair of the given device indices is linked by NVLink.
func (m *Machine) Connected(idx []int) bool {
	for a := range idx {
		for b := a + 1; b < len(idx); b++ {
			if m.Links[idx[a]][idx[b]] != LinkNVLink {
				return false
			}
		}
	}
	return true
}

// Discover initialises NVML and reads every GPU. The caller shuts NVML down with lib.Shutdown
// when done (not after ErrNoDriver).
func Discover(lib nvml.Interface) (*Machine, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: %s", ErrNoDriver, errorString(lib, ret))
	}
	m := &Machine{}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		m.Driver = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %s", errorString(lib, ret))
	}
	handles := make([]nvml.Device, n)
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d: %s", i, errorString(lib, ret))
		}
		handles[i] = d
		dev := Device{Index: i}
		if dev.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GPU %d UUID: %s", i, errorString(lib, ret))
		}
		dev.Name, _ = d.GetName()
		if mem, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			dev.MemoryBytes = mem.Total
		}
		if major, minor, ret := d.GetCudaComputeCapability(); ret == nvml.SUCCESS {
			dev.Compute = fmt.Sprintf("%d.%d", major, minor)
		}
		if minor, ret := d.GetMinorNumber(); ret == nvml.SUCCESS {
			dev.Minor = minor
		} else {
			dev.Minor = i
		}
		m.Devices = append(m.Devices, dev)
	}
	m.Links = make([][]Link, n)
	for i := range m.Links {
		m.Links[i] = make([]Link, n)
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			l := link(handles[i], handles[j])
			m.Links[i][j], m.Links[j][i] = l, l
		}
	}
	return m, nil
}

func link(a, b nvml.Device) Link {
	if st, ret := a.GetP2PStatus(b, nvml.P2P_CAPS_INDEX_NVLINK); ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK {
		return LinkNVLink
	}
	if st, ret := a.GetP2PStatus(b, nvml.P2P_CAPS_INDEX_READ); ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK {
		return LinkPCIe
	}
	return LinkNone
}

func errorString(lib nvml.Interface, ret nvml.Return) string {
	return fmt.Sprintf("NVML return %d", int32(ret))
}

// Health is a GPU's error counters.
type Health struct {
	// UncorrectedECC is the volatile count of uncorrected ECC errors.
	UncorrectedECC uint64 `json:"uncorrected_ecc"`
	RetiredPages   int    `json:"retired_pages"`
}

// Healthy reports whether nothing suggests the GPU is faulty.
func (h Health) Healthy() bool { return h.UncorrectedECC == 0 }

// CheckHealth reads a GPU's error counters; counters a GPU does not support read as zero.
func CheckHealth(lib nvml.Interface, index int) (Health, error) {
	d, ret := lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return Health{}, fmt.Errorf("GPU %d: %s", index, errorString(lib, ret))
	}
	var h Health
	if n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
		h.UncorrectedECC = n
	}
	for _, cause := range []nvml.PageRetirementCause{nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR} {
		if pages, ret := d.GetRetiredPages(cause); ret == nvml.SUCCESS {
			h.RetiredPages += len(pages)
		}
	}
	return h, nil
}

// Xid is one Xid error event (a GPU fault reported by the driver).
type Xid struct {
	Index int
	Code  uint64
}

// Watch watches the given GPUs for Xid errors until Stop. Stop returns every Xid seen.
type Watch struct {
	set  nvml.EventSet
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	xids []Xid
}

// WatchXids registers the GPUs for Xid events and starts watching.
func WatchXids(lib nvml.Interface, indices []int) (*Watch, error) {
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("creating an NVML event set: %s", errorString(lib, ret))
	}
	byHandle := map[nvml.Device]int{}
	for _, i := range indices {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			set.Free()
			return nil, fmt.Errorf("GPU %d: %s", i, errorString(lib, ret))
		}
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			set.Free()
			return nil, fmt.Errorf("GPU %d: registering for Xid events: %s", i, errorString(lib, ret))
		}
		byHandle[d] = i
	}
	w := &Watch{set: set, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			default:
			}
			e, ret := set.Wait(100)
			if ret != nvml.SUCCESS || e.EventType != nvml.EventTypeXidCriticalError {
				continue
			}
			w.mu.Lock()
			w.xids = append(w.xids, Xid{Index: byHandle[e.Device], Code: e.EventData})
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// Seen returns the Xids seen so far.
func (w *Watch) Seen() []Xid {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Xid{}, w.xids...)
}

// Stop ends the watch and returns the Xids seen.
func (w *Watch) Stop() []Xid {
	close(w.stop)
	<-w.done
	w.set.Free()
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Xid{}, w.xids...)
}

// Sampler samples the used memory of leased GPUs while a run goes on. Leased GPUs are the
// attempt's alone, so used memory above the idle level at Start is the attempt's.
type Sampler struct {
	stop chan struct{}
	done chan struct{}
	peak uint64
}

// Sample starts sampling the GPUs every interval (default 50ms).
func Sample(lib nvml.Interface, indices []int, interval time.Duration) *Sampler {
	if interval == 0 {
		interval = 50 * time.Millisecond
	}
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{})}
	var handles []nvml.Device
	for _, i := range indices {
		if d, ret := lib.DeviceGetHandleByIndex(i); ret == nvml.SUCCESS {
			handles = append(handles, d)
		}
	}
	used := func() uint64 {
		var total uint64
		for _, d := range handles {
			if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
				total += m.Used
			}
		}
		return total
	}
	idle := used()
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if u := used(); u > idle && u-idle > s.peak {
				s.peak = u - idle
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends sampling and returns the peak memory used above the idle level, in bytes.
func (s *Sampler) Stop() uint64 {
	close(s.stop)
	<-s.done
	return s.peak
}
