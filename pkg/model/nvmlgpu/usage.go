package nvmlgpu

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Usage is what a GPU's processes use now, as NVML reports it: the
// figures for nodes without DCGM (the plugin's /metrics).
type Usage struct {
	// UtilizationPercent is the percent of NVML's last sample period in
	// which a kernel ran on the GPU (nvmlDeviceGetUtilizationRates .gpu);
	// -1 where NVML does not report it (with MIG mode on it reports none
	// per GPU).
	UtilizationPercent int
	// MemoryUsedBytes is the framebuffer in use, in bytes: memory info
	// v2's used, which leaves out what the driver reserves, or v1's where
	// the driver lacks v2 (then the reserved memory counts as used); -1
	// where NVML does not report it.
	MemoryUsedBytes int64
	// MIG is each MIG device's memory in use, with MIG mode on.
	MIG []MIGUsage
}

// MIGUsage is one MIG device's memory in use.
type MIGUsage struct {
	// GIID is its GPU instance ID; MemoryUsedBytes the instance's
	// framebuffer in use (nvmlDeviceGetMemoryInfo on the MIG device), in
	// bytes.
	GIID            int
	MemoryUsedBytes int64
}

// Usage reads the GPU's usage: one handle lookup, its utilization and
// memory, and, with MIG mode on, each MIG device's memory. A figure NVML
// does not report is -1; an error is a GPU NVML cannot find.
func (l *Library) Usage(uuid string) (Usage, error) {
	dev, ret := l.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return Usage{}, fmt.Errorf("GPU %s: %w", uuid, nvmlError("nvmlDeviceGetHandleByUUID", ret))
	}
	u := Usage{UtilizationPercent: -1, MemoryUsedBytes: -1}
	if rates, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		u.UtilizationPercent = int(rates.Gpu)
	}
	if HasSymbol(l.lib, "nvmlDeviceGetMemoryInfo_v2") {
		if m, ret := dev.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
			u.MemoryUsedBytes = int64(m.Used)
		}
	} else if m, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		u.MemoryUsedBytes = int64(m.Used)
	}
	if current, _, ret := dev.GetMigMode(); ret != nvml.SUCCESS || current != nvml.DEVICE_MIG_ENABLE {
		return u, nil
	}
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return u, nil
	}
	for i := 0; i < n; i++ {
		mig, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		gi, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			continue
		}
		if m, ret := mig.GetMemoryInfo(); ret == nvml.SUCCESS {
			u.MIG = append(u.MIG, MIGUsage{GIID: gi, MemoryUsedBytes: int64(m.Used)})
		}
	}
	return u, nil
}
