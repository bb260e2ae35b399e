// Package gputest provides mocked NVML machines for tests, built on go-nvml's DGX H100 mock
// with what it leaves out filled in: stable UUIDs, peer-to-peer topology, Xid events and
// memory use that a test can change.
package gputest

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// Machine is a mocked 8-GPU machine.
type Machine struct {
	*server.Server
	mu   sync.Mutex
	used [8]uint64
	xids chan nvml.EventData
}

// Islands is an 8 x H100 machine whose GPUs 0-3 and 4-7 form two NVLink islands, joined only
// over PCIe: the case where the choice of GPUs matters.
func Islands() *Machine { return build(func(a, b int) bool { return a/4 == b/4 }) }

// NVSwitch is an 8 x H100 machine where every pair is NVLink-connected.
func NVSwitch() *Machine { return build(func(a, b int) bool { return true }) }

func build(nvlinked func(a, b int) bool) *Machine {
	m := &Machine{Server: dgxh100.New(), xids: make(chan nvml.EventData, 16)}
	for i, h := range m.Devices {
		d := h.(*server.Device)
		d.UUID = fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i)
		i := i
		d.GetP2PStatusFunc = func(other nvml.Device, caps nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			j := other.(*server.Device).Index
			switch {
			case caps == nvml.P2P_CAPS_INDEX_NVLINK && nvlinked(i, j):
				return nvml.P2P_STATUS_OK, nvml.SUCCESS
			case caps == nvml.P2P_CAPS_INDEX_NVLINK:
				return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_OK, nvml.SUCCESS // PCIe peer-to-peer
		}
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			m.mu.Lock()
			defer m.mu.Unlock()
			return nvml.Memory{Total: d.MemoryInfo.Total, Used: m.used[i], Free: d.MemoryInfo.Total - m.used[i]}, nvml.SUCCESS
		}
		d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) { return 0, nvml.SUCCESS }
		d.GetRetiredPagesFunc = func(nvml.PageRetirementCause) ([]uint64, nvml.Return) { return nil, nvml.SUCCESS }
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(timeout uint32) (nvml.EventData, nvml.Return) {
				select {
				case e := <-m.xids:
					return e, nvml.SUCCESS
				case <-time.After(time.Duration(timeout) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return m
}

// SetUsed sets GPU i's used memory.
func (m *Machine) SetUsed(i int, bytes uint64) {
	m.mu.Lock()
	m.used[i] = bytes
	m.mu.Unlock()
}

// Xid injects an Xid error on GPU i.
func (m *Machine) Xid(i int, code uint64) {
	m.xids <- nvml.EventData{Device: m.Devices[i], EventType: nvml.EventTypeXidCriticalError, EventData: code}
}

// NoDriver is an NVML whose Init fails as it does on a machine without the driver; any other
// call fails the test run, as it would crash a real process.
func NoDriver() nvml.Interface {
	return &mock.Interface{
		InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
	}
}
