package nvmlgpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// OldestSupportedDriver is the oldest NVIDIA driver branch Facet supports:
// R470, the oldest whose NVML has every MIG call Facet makes (GPU instances
// at a placement, nvmlDeviceGetGpuInstancePossiblePlacements_v2; NVML API
// Reference Guide vR470, "Multi Instance GPU Management").
const OldestSupportedDriver = 470

// NewerSymbols are the NVML functions Facet calls that are newer than
// OldestSupportedDriver, with the first driver branch that has them. go-nvml
// binds symbols lazily: calling one that the loaded libnvidia-ml.so.1 lacks
// ends the process with "symbol lookup error", not an NVML error code. So
// each is looked up first (HasSymbol) and has a fallback tested on a
// simulated driver that lacks it (sim, driverVersion below the branch).
var NewerSymbols = map[string]int{
	// Memory info v2 (the driver's reserved memory apart): R510
	// (NVIDIA/nvidia-settings#78, driver 510.39.01). Fallback: v1's total.
	"nvmlDeviceGetMemoryInfo_v2": 510,
	// Multi-node NVLink fabric membership (cluster UUID, clique ID): R525,
	// the first branch with Hopper's NVLink network (nvml.h of CUDA 12.0).
	// Fallback: no fabric attributes.
	"nvmlDeviceGetGpuFabricInfo": 525,
}

// HasSymbol reports whether the loaded NVML library has the function name:
// go-nvml's LookupSymbol on the real library, the simulator's answer on a
// simulated one. A library that cannot answer (a mock without the
// extension) is taken to have it, as every simulated driver before the
// lookup existed did.
func HasSymbol(lib nvml.Interface, name string) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			ok = true
		}
	}()
	ext := lib.Extensions()
	if ext == nil {
		return true
	}
	return ext.LookupSymbol(name) == nil
}

// symbolError says which function the driver lacks and what that means.
func symbolError(name string) error {
	return fmt.Errorf("%s: not in this driver's NVML (needs R%d or later)", name, NewerSymbols[name])
}
