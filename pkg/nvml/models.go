package nvml

import (
	"sort"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
)

// models maps a machine file's `model` to the GPU it simulates.
//
// The MIG-capable models are go-nvml's own mock configs
// (github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus at v0.13.3-1), whose MIG
// profile and placement tables transcribe NVIDIA's MIG user guide
// ("Supported MIG Profiles"). The others are defined here from the product
// data sheets, for GPUs the mock lacks.
var models = map[string]gpus.Config{
	"A100-SXM4-40GB": named(gpus.A100_SXM4_40GB, "NVIDIA A100-SXM4-40GB"),
	"A100-SXM4-80GB": gpus.A100_SXM4_80GB,
	"A100-PCIE-40GB": gpus.A100_PCIE_40GB,
	"A100-PCIE-80GB": gpus.A100_PCIE_80GB,
	"A30-PCIE-24GB":  gpus.A30_PCIE_24GB,
	"H100-SXM5-80GB": gpus.H100_SXM5_80GB,
	"H200-141GB":     gpus.H200_SXM5_141GB,
	"B200-180GB":     gpus.B200_SXM5_180GB,
	// NVIDIA L4 (Ada, AD104): 24 GB GDDR6 of which the driver reports
	// 23034 MiB, compute capability 8.9, no MIG. PCI device ID 0x27B8.
	"L4": {
		Name:         "NVIDIA L4",
		Architecture: gonvml.DEVICE_ARCH_ADA,
		Brand:        gonvml.BRAND_NVIDIA,
		MemoryMB:     23034,
		CudaMajor:    8,
		CudaMinor:    9,
		PciDeviceId:  0x27B810DE,
	},
	// NVIDIA T4 (Turing, TU104): 16 GB GDDR6 (15360 MiB reported), compute
	// capability 7.5, no MIG. PCI device ID 0x1EB8.
	"T4": {
		Name:         "Tesla T4",
		Architecture: gonvml.DEVICE_ARCH_TURING,
		Brand:        gonvml.BRAND_TESLA,
		MemoryMB:     15360,
		CudaMajor:    7,
		CudaMinor:    5,
		PciDeviceId:  0x1EB810DE,
	},
}

// The mock calls its 40 GB A100 "Mock NVIDIA A100-SXM4-40GB"; a simulated
// node should publish what the real card reports.
func named(c gpus.Config, name string) gpus.Config {
	c.Name = name
	return c
}

// Models lists the model names a machine file may use.
func Models() []string {
	names := make([]string, 0, len(models))
	for n := range models {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func migCapable(c gpus.Config) bool {
	return len(c.MIGProfiles.GpuInstanceProfiles) > 0
}
