package gpu

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/infradev/infradev/harness/sandbox"
)

// Sandbox passes a run's GPUs into the sandbox it wraps and meters them, so the sandbox
// itself knows nothing of GPUs. For a Spec naming GPUs it adds their device nodes, driver
// mounts and visibility variables (from Nodes; only the variables when Nodes is nil). With
// NVML set it records their peak memory use during the run in the Result, and watches them
// for Xid faults: a fault makes the run an infrastructure error and is told to OnFault, so
// whoever leases GPUs can set those aside.
type Sandbox struct {
	sandbox.Sandbox
	Nodes   Nodes
	NVML    nvml.Interface
	OnFault func(indices []int)
}

// Run implements sandbox.Sandbox.
func (s Sandbox) Run(ctx context.Context, spec sandbox.Spec) (*sandbox.Result, error) {
	gpus := spec.GPUs
	if len(gpus) == 0 {
		return s.Sandbox.Run(ctx, spec)
	}
	spec.GPUs = nil
	if s.Nodes == nil {
		spec.Env = sandbox.MergeEnv(spec.Env, Visibility(gpus)...)
	} else {
		p, err := s.Nodes.Passthrough(gpus)
		if err != nil {
			return nil, fmt.Errorf("GPU pass-through: %w", err)
		}
		spec.Env = sandbox.MergeEnv(spec.Env, p.Env...)
		spec.Devices = append(append([]sandbox.Device{}, spec.Devices...), p.Devices...)
		spec.Mounts = append(append([]sandbox.Mount{}, spec.Mounts...), p.Mounts...)
	}
	if s.NVML == nil {
		return s.Sandbox.Run(ctx, spec)
	}
	sampler := Sample(s.NVML, gpus, 0)
	watch, err := WatchXids(s.NVML, gpus)
	if err != nil {
		sampler.Stop()
		return nil, err
	}
	res, err := s.Sandbox.Run(ctx, spec)
	peak := sampler.Stop()
	if xids := watch.Stop(); len(xids) > 0 && err == nil {
		var faulty []int
		for _, x := range xids {
			faulty = append(faulty, x.Index)
		}
		if s.OnFault != nil {
			s.OnFault(faulty)
		}
		return nil, fmt.Errorf("GPU fault during the run: Xid %d on GPU %d", xids[0].Code, xids[0].Index)
	}
	if res != nil {
		res.GPUPeakMemory = peak
	}
	return res, err
}
