package sandbox

import "testing"

// TestDeviceCgroupAllowsExactlyTheGivenDevices: beyond denying everything, the only device
// rules are allows for the given devices, each with its own numbers.
func TestDeviceCgroupAllowsExactlyTheGivenDevices(t *testing.T) {
	cfg := ociConfig(Spec{Root: "/r", Args: []string{"x"}, Devices: []Device{{Path: "/dev/nvidia2", Major: 195, Minor: 2}, {Path: "/dev/nvidiactl", Major: 195, Minor: 255}}}, "/c")
	rules := cfg.Linux.Resources.Devices
	if len(rules) != 3 || rules[0].Allow || rules[0].Access != "rwm" {
		t.Fatalf("rules = %+v, want deny-all then two allows", rules)
	}
	for i, want := range [][2]int64{{195, 2}, {195, 255}} {
		r := rules[i+1]
		if !r.Allow || r.Type != "c" || *r.Major != want[0] || *r.Minor != want[1] {
			t.Errorf("rule %d = %+v, want allow c %d:%d", i+1, r, want[0], want[1])
		}
	}
	if len(cfg.Linux.Devices) != 2 || cfg.Linux.Devices[0].Path != "/dev/nvidia2" {
		t.Errorf("device nodes = %+v", cfg.Linux.Devices)
	}
	if none := ociConfig(Spec{Root: "/r", Args: []string{"x"}}, "/c"); len(none.Linux.Resources.Devices) != 1 || len(none.Linux.Devices) != 0 {
		t.Errorf("without devices: %+v", none.Linux.Resources.Devices)
	}
}
