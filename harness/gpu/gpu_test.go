package gpu_test

import (
	"errors"
	"testing"
	"time"

	"github.com/infradev/infradev/harness/gpu"
	"github.com/infradev/infradev/harness/gpu/gputest"
)

func TestDiscoverReadsDevicesAndTopology(t *testing.T) {
	m, err := gpu.Discover(gputest.Islands())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Devices) != 8 || m.Devices[3].UUID == "" || m.Devices[0].MemoryBytes < 80<<30 || m.Devices[0].Compute != "9.0" {
		t.Fatalf("devices = %+v", m.Devices[:2])
	}
	if m.Links[0][3] != gpu.LinkNVLink || m.Links[0][4] != gpu.LinkPCIe || m.Links[5][7] != gpu.LinkNVLink {
		t.Errorf("links 0-3 %s, 0-4 %s, 5-7 %s; want nvlink, pcie, nvlink", m.Links[0][3], m.Links[0][4], m.Links[5][7])
	}
	if !m.Connected([]int{4, 5, 6, 7}) || m.Connected([]int{2, 3, 4}) {
		t.Errorf("Connected() disagrees with the islands")
	}
}

func TestNoDriverCallsNothingAfterInit(t *testing.T) {
	_, err := gpu.Discover(gputest.NoDriver())
	if !errors.Is(err, gpu.ErrNoDriver) {
		t.Errorf("Discover() error = %v, want ErrNoDriver", err)
	}
}

func TestHealthXidsAndMemorySampling(t *testing.T) {
	lib := gputest.Islands()
	if _, err := gpu.Discover(lib); err != nil {
		t.Fatal(err)
	}
	h, err := gpu.CheckHealth(lib, 2)
	if err != nil || !h.Healthy() {
		t.Errorf("health = %+v, %v", h, err)
	}
	w, err := gpu.WatchXids(lib, []int{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	lib.Xid(2, 79)
	deadline := time.Now().Add(5 * time.Second)
	for len(w.Seen()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if xids := w.Stop(); len(xids) != 1 || xids[0].Index != 2 || xids[0].Code != 79 {
		t.Errorf("Xids = %+v, want one Xid 79 on GPU 2", xids)
	}
	lib.SetUsed(3, 1<<30) // idle use before the run starts
	s := gpu.Sample(lib, []int{3}, 5*time.Millisecond)
	lib.SetUsed(3, 5<<30)
	time.Sleep(50 * time.Millisecond)
	lib.SetUsed(3, 2<<30)
	time.Sleep(20 * time.Millisecond)
	if peak := s.Stop(); peak != 4<<30 {
		t.Errorf("peak = %d, want 4GiB above the idle level", peak)
	}
}
