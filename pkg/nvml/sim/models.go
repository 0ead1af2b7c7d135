package sim

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
// ("Supported MIG Profiles"), corrected where they differ from it in what
// decides which instances can coexist (placements and engine counts; see
// fixMIG). The others are defined here from the product data sheets, for
// GPUs the mock lacks.
var models = map[string]gpus.Config{
	"A100-SXM4-40GB": named(gpus.A100_SXM4_40GB, "NVIDIA A100-SXM4-40GB"),
	"A100-SXM4-80GB": fixMIG(gpus.A100_SXM4_80GB, fixA100_80GB),
	"A100-PCIE-40GB": gpus.A100_PCIE_40GB,
	"A100-PCIE-80GB": fixMIG(gpus.A100_PCIE_80GB, fixA100_80GB),
	"A30-PCIE-24GB":  gpus.A30_PCIE_24GB,
	"H100-SXM5-80GB": fixMIG(gpus.H100_SXM5_80GB, fixHopper),
	"H200-141GB":     fixMIG(gpus.H200_SXM5_141GB, fixHopper),
	"B200-180GB":     fixMIG(gpus.B200_SXM5_180GB, fixB200),
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

// fixMIG returns c with a private copy of its MIG tables, changed by fix.
// go-nvml's tables are package variables shared by its own configs, so they
// are never modified in place.
func fixMIG(c gpus.Config, fix func(*gpus.MIGProfileConfig)) gpus.Config {
	c.MIGProfiles = cloneMIGProfiles(c.MIGProfiles)
	fix(&c.MIGProfiles)
	return c
}

func cloneMIGProfiles(p gpus.MIGProfileConfig) gpus.MIGProfileConfig {
	out := gpus.MIGProfileConfig{
		GpuInstanceProfiles:       map[int]gonvml.GpuInstanceProfileInfo{},
		ComputeInstanceProfiles:   map[int]map[int]gonvml.ComputeInstanceProfileInfo{},
		GpuInstancePlacements:     map[int][]gonvml.GpuInstancePlacement{},
		ComputeInstancePlacements: map[int]map[int][]gonvml.ComputeInstancePlacement{},
	}
	for id, info := range p.GpuInstanceProfiles {
		out.GpuInstanceProfiles[id] = info
	}
	for id, cis := range p.ComputeInstanceProfiles {
		m := map[int]gonvml.ComputeInstanceProfileInfo{}
		for ci, info := range cis {
			m[ci] = info
		}
		out.ComputeInstanceProfiles[id] = m
	}
	for id, pl := range p.GpuInstancePlacements {
		out.GpuInstancePlacements[id] = append([]gonvml.GpuInstancePlacement(nil), pl...)
	}
	for id, cis := range p.ComputeInstancePlacements {
		m := map[int][]gonvml.ComputeInstancePlacement{}
		for ci, pl := range cis {
			m[ci] = append([]gonvml.ComputeInstancePlacement(nil), pl...)
		}
		out.ComputeInstancePlacements[id] = m
	}
	return out
}

// eightSlicePlacements sets the GPU instance placements NVIDIA documents
// for every 8-memory-slice GPU (A100, H100, H200, B200): `nvidia-smi mig
// -lgipp` prints, e.g. on an H100,
//
//	Profile ID 19 (1g)        Placements: {0,1,2,3,4,5,6}:1
//	Profile ID 20 (1g+me)     Placements: {0,1,2,3,4,5,6}:1
//	Profile ID 15 (1g, 2/8)   Placements: {0,2,4,6}:2
//	Profile ID 14 (2g)        Placements: {0,2,4}:2
//	Profile ID  9 (3g)        Placements: {0,4}:4
//	Profile ID  5 (4g)        Placement : {0}:4
//	Profile ID  0 (7g)        Placement : {0}:8
//
// go-nvml's H100, H200 and B200 tables instead give the 2/8-memory 1g
// profile 7 one-slice placements, 3g three slices and 7g seven, as if the
// GPU had 7 memory slices: a 3g+3g+1g layout (90 GB on an 80 GB H100) would
// then fit, which the hardware refuses. Its A100 tables are right.
func eightSlicePlacements(p *gpus.MIGProfileConfig) {
	pl := func(size uint32, starts ...uint32) []gonvml.GpuInstancePlacement {
		var out []gonvml.GpuInstancePlacement
		for _, s := range starts {
			out = append(out, gonvml.GpuInstancePlacement{Start: s, Size: size})
		}
		return out
	}
	p.GpuInstancePlacements[gonvml.GPU_INSTANCE_PROFILE_1_SLICE] = pl(1, 0, 1, 2, 3, 4, 5, 6)
	p.GpuInstancePlacements[gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1] = pl(1, 0, 1, 2, 3, 4, 5, 6)
	p.GpuInstancePlacements[gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2] = pl(2, 0, 2, 4, 6)
	p.GpuInstancePlacements[gonvml.GPU_INSTANCE_PROFILE_2_SLICE] = pl(2, 0, 2, 4)
	p.GpuInstancePlacements[gonvml.GPU_INSTANCE_PROFILE_3_SLICE] = pl(4, 0, 4)
	p.GpuInstancePlacements[gonvml.GPU_INSTANCE_PROFILE_4_SLICE] = pl(4, 0)
	p.GpuInstancePlacements[gonvml.GPU_INSTANCE_PROFILE_7_SLICE] = pl(8, 0)
}

// setEngines sets a GPU instance profile's decoder, JPEG and OFA counts.
func setEngines(p *gpus.MIGProfileConfig, id int, decoders, jpegs, ofas uint32) {
	info := p.GpuInstanceProfiles[id]
	info.DecoderCount, info.JpegCount, info.OfaCount = decoders, jpegs, ofas
	p.GpuInstanceProfiles[id] = info
}

// fixHopper corrects go-nvml's H100 and H200 tables to the MIG user guide's
// (tables "GPU Instance Profiles on H100/H200"; `nvidia-smi mig -lgip` on an
// H100 80GB prints the same): eight memory slices (eightSlicePlacements);
// every profile has one NVDEC and one NVJPG per compute slice, the 7g
// profile 7 NVDEC, 7 NVJPG, 1 OFA and 8 copy engines, and the only other
// profile with the GPU's single OFA is 1g+me. The mock copied the A100's
// engine counts (7g: 5 NVDEC, no NVJPG, no OFA), which would make the
// 1g+me profile impossible and seven 1g instances too many decoders.
func fixHopper(p *gpus.MIGProfileConfig) {
	eightSlicePlacements(p)
	setEngines(p, gonvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, 0)
	setEngines(p, gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1, 1)
	setEngines(p, gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 1, 0)
	setEngines(p, gonvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 2, 0)
	setEngines(p, gonvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 3, 0)
	setEngines(p, gonvml.GPU_INSTANCE_PROFILE_4_SLICE, 4, 4, 0)
	setEngines(p, gonvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 7, 1)
	full := p.GpuInstanceProfiles[gonvml.GPU_INSTANCE_PROFILE_7_SLICE]
	full.CopyEngineCount = 8
	p.GpuInstanceProfiles[gonvml.GPU_INSTANCE_PROFILE_7_SLICE] = full
}

// fixB200 corrects go-nvml's B200 tables: eight memory slices
// (eightSlicePlacements), and, as the MIG user guide's B200 table has it,
// the GPU's one OFA belongs to the 1g+me and 7g profiles only (the mock
// gives 2g one, 3g and 4g two, 7g four). Its decoder, encoder and JPEG
// counts are kept: the guide lists "1" for every profile, which cannot be
// per-instance counts, and the mock's never limit a layout that memory
// slices allow (TestEngineRuleOnlyLimitsMediaExtensions).
func fixB200(p *gpus.MIGProfileConfig) {
	eightSlicePlacements(p)
	for id, info := range p.GpuInstanceProfiles {
		info.OfaCount = 0
		if id == gonvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 || id == gonvml.GPU_INSTANCE_PROFILE_7_SLICE {
			info.OfaCount = 1
		}
		p.GpuInstanceProfiles[id] = info
	}
}

// fixA100_80GB corrects go-nvml's A100 80GB table: the MIG user guide gives
// 1g.10gb (like the 40 GB card's 1g.5gb, which the mock has right) no
// decoder. With the mock's one, seven 1g.10gb instances would need 7 of the
// GPU's 5 NVDECs.
func fixA100_80GB(p *gpus.MIGProfileConfig) {
	info := p.GpuInstanceProfiles[gonvml.GPU_INSTANCE_PROFILE_1_SLICE]
	info.DecoderCount = 0
	p.GpuInstanceProfiles[gonvml.GPU_INSTANCE_PROFILE_1_SLICE] = info
}
