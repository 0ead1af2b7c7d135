package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"maps"
	"slices"
)

// model is one GPU a machine file can name: go-nvml's mock config (or one
// defined here for GPUs the mock lacks), with the values the mock gets wrong
// replaced by Facet's tables below.
type model struct {
	gpus.Config
	// ReservedBytes is the framebuffer the driver reserves, as NVML
	// memory info v2 reports it; the simulated GPU answers
	// GetMemoryInfo_v2 with it, so discovery publishes MemoryMB MiB less
	// this, rounded down to a MiB.
	ReservedBytes uint64
	// ReservedSource says where ReservedBytes comes from: a measurement, or
	// "estimate" where no card was measured and NVIDIA publishes no figure.
	ReservedSource string
}

// Where the values come from. The tables below name one of these in a
// comment:
//
//   - measured: ../shared/hardware/h100-80gb-hbm3.md and h200.md (driver
//     580.159.04; nvidia-smi mig -lgip/-lgipp and NVML), as srcH100 and
//     srcH200 name them;
//   - the guide: NVIDIA's MIG User Guide (v580), "Supported MIG Profiles"
//     (engines, copy engines, instance counts) and its nvidia-smi mig
//     -lgipp example (placements);
//   - the mock: go-nvml's mock (v0.13.3-1) where it gives MiB as a driver
//     reports them (A100, A30: they match public nvidia-smi mig -lgip
//     transcripts to within a quarter GiB) — not measured by Facet;
//   - estimate: no card measured and no NVIDIA figure; said so where used.
const (
	srcH100 = "measured: ../shared/hardware/h100-80gb-hbm3.md (NVML memory info v2, driver 580.159.04)"
	srcH200 = "measured: ../shared/hardware/h200.md (NVML memory info v2, driver 580.159.04)"
	// Reserved memory of the models no card was measured for: the share
	// of the total the measured H100 reserves (480 of 81559 MiB, 0.59 %),
	// rounded to a MiB. The measured H200 reserves 615 of 143771 MiB
	// (0.43 %): the real figure depends on the driver and the board.
	srcReservedEstimate = "estimate: 0.59 % of the total, the measured H100's share"
)

// giRow is one GPU instance profile as NVML reports it
// (nvmlDeviceGetGpuInstanceProfileInfo) and where it may be placed
// (nvmlDeviceGetGpuInstancePossiblePlacements).
type giRow struct {
	id int // NVML GPU_INSTANCE_PROFILE_* index
	// profileID is GpuInstanceProfileInfo.Id, the ID `nvidia-smi mig
	// -lgip` shows and -cgi takes (19 for a 1g on an eight-slice GPU).
	profileID               int
	memMiB                  uint64
	instances, sms          uint32
	ce, dec, jpeg, enc, ofa uint32
	placementSize           uint32
	placementStarts         []uint32
}

// Profile indices, as NVML numbers them (the h200.md table's "NVML index").
const (
	p1    = nvml.GPU_INSTANCE_PROFILE_1_SLICE      // 0: 1g
	p1me  = nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 // 7: 1g+me
	p1x2  = nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2 // 9: 1g with two memory slices
	p2    = nvml.GPU_INSTANCE_PROFILE_2_SLICE      // 1: 2g
	p2me  = nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1 // 8: 2g+me (A30)
	p3    = nvml.GPU_INSTANCE_PROFILE_3_SLICE      // 2: 3g
	p4    = nvml.GPU_INSTANCE_PROFILE_4_SLICE      // 3: 4g
	p7    = nvml.GPU_INSTANCE_PROFILE_7_SLICE      // 4: 7g
	seven = 7
)

func starts(n ...uint32) []uint32 { return n }

// eightSlice builds the seven profiles of a GPU with eight memory slices
// (A100, H100, H200, B200), in the order 1g, 1g+me, 1g with two memory
// slices, 2g, 3g, 4g, 7g. Instance counts and placements are the same on
// all of them: `nvidia-smi mig -lgipp` on the measured H100 (and the MIG
// user guide's example) prints
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
// GPU had 7 memory slices: a 3g+3g+1g layout (90 GB on an 80 GB H100)
// would then fit, which the hardware refuses.
func eightSlice(mem, sms, ce, dec, jpeg, enc, ofa [7]uint32) []giRow {
	ids := [7]int{p1, p1me, p1x2, p2, p3, p4, p7}
	profileIDs := [7]int{19, 20, 15, 14, 9, 5, 0}
	inst := [7]uint32{7, 1, 4, 3, 2, 1, 1}
	size := [7]uint32{1, 1, 2, 2, 4, 4, 8}
	st := [7][]uint32{starts(0, 1, 2, 3, 4, 5, 6), starts(0, 1, 2, 3, 4, 5, 6), starts(0, 2, 4, 6), starts(0, 2, 4), starts(0, 4), starts(0), starts(0)}
	rows := make([]giRow, 7)
	for i := range rows {
		rows[i] = giRow{id: ids[i], profileID: profileIDs[i], memMiB: uint64(mem[i]), instances: inst[i], sms: sms[i],
			ce: ce[i], dec: dec[i], jpeg: jpeg[i], enc: enc[i], ofa: ofa[i],
			placementSize: size[i], placementStarts: st[i]}
	}
	return rows
}

// Hopper engines per instance (1g, 1g+me, 1g two-slice, 2g, 3g, 4g, 7g):
// one NVDEC and one NVJPG per compute slice, 7 of each and 8 copy engines
// in 7g, the GPU's one OFA in 1g+me and 7g, no NVENC. The measured H100
// and H200 tables and the guide's agree.
var (
	hopperCE   = [7]uint32{1, 1, 1, 2, 3, 4, 8}
	hopperDec  = [7]uint32{1, 1, 1, 2, 3, 4, 7}
	hopperJpeg = hopperDec
	hopperOFA  = [7]uint32{0, 1, 0, 0, 0, 0, 1}
	noEnc      = [7]uint32{}
	hopperSMs  = [7]uint32{16, 16, 26, 32, 60, 64, 132}
)

// tables holds the MIG profiles of every MIG-capable model; models without
// an entry have no MIG. The comment on each says where its values come
// from. Where go-nvml's mock differed, the table wins: the mock's H100 and
// H200 have nominal memory (10/20/40/80 GiB), 16/48/112 SMs for
// 1g.20gb/3g/7g instead of 26/60/132, and the A100's engine counts.
var tables = map[string][]giRow{
	// Every value measured (srcH100): memory in MiB as NVML reports it
	// (nvidia-smi prints 9.75, 19.62, 39.50 and 79.25 GiB).
	"H100-SXM5-80GB": eightSlice(
		[7]uint32{9984, 9984, 20096, 20096, 40448, 40448, 81152}, hopperSMs,
		hopperCE, hopperDec, hopperJpeg, noEnc, hopperOFA),
	// Every value measured (srcH200).
	"H200-141GB": eightSlice(
		[7]uint32{16384, 16384, 33280, 33280, 71424, 71424, 143360}, hopperSMs,
		hopperCE, hopperDec, hopperJpeg, noEnc, hopperOFA),
	// B200: copy engines and OFA from the guide's B200 table (2, 2, 2, 3,
	// 6, 8, 16 CEs; OFA only in 1g+me and 7g). Its NVDEC/NVJPG column
	// says "1" for every profile, which cannot be per-instance counts
	// beside seven 1g instances, so the mock's per-slice decoder, encoder
	// and JPEG counts stay. SMs: 18 per 1g (public CUDA device properties
	// of a B200 1g.23gb), 148 for 7g (the guide: "Full"; the B200 has 148
	// SMs); 36/54/72 for 2g/3g/4g are the mock's. Memory is an estimate
	// (estimate) chosen so that each profile gets NVIDIA's name
	// (1g.23gb, 1g.45gb, 2g.45gb, 3g.90gb, 4g.90gb, 7g.180gb) and fits the
	// card's 183359 MiB the way the measured Hopper profiles fit theirs.
	"B200-180GB": eightSlice(
		[7]uint32{22528, 22528, 45056, 45056, 90112, 90112, 182528},
		[7]uint32{18, 18, 18, 36, 54, 72, 148},
		[7]uint32{2, 2, 2, 3, 6, 8, 16},
		[7]uint32{1, 1, 1, 2, 3, 4, 7},
		[7]uint32{0, 1, 0, 1, 2, 2, 4},
		[7]uint32{0, 1, 0, 1, 2, 2, 4},
		[7]uint32{0, 1, 0, 0, 0, 0, 1}),
	// H100 NVL (94 GB): the H100's profiles, Hopper's engines and SMs
	// (132, as on the SXM5 card); memory an estimate (estimate), the
	// measured H100's MiB scaled by 95830/81559 and rounded to 256 MiB.
	"H100-NVL-94GB": eightSlice(
		[7]uint32{11776, 11776, 23552, 23552, 47360, 47360, 95232}, hopperSMs,
		hopperCE, hopperDec, hopperJpeg, noEnc, hopperOFA),
	"A100-SXM4-40GB": a100(40),
	"A100-PCIE-40GB": a100(40),
	"A100-SXM4-80GB": a100(80),
	"A100-PCIE-80GB": a100(80),
	// A30: four memory slices; 1g.6gb, 1g.6gb+me, 2g.12gb, 2g.12gb+me,
	// 4g.24gb. Engines and profile IDs (14, 21, 5, 6, 0) from the guide's
	// A30 table; SMs 14 per slice and memory (the mock) and placements are
	// go-nvml's mock's.
	"A30-PCIE-24GB": {
		{id: p1, profileID: 14, memMiB: 5836, instances: 4, sms: 14, ce: 1, placementSize: 1, placementStarts: starts(0, 1, 2, 3)},
		{id: p1me, profileID: 21, memMiB: 5836, instances: 1, sms: 14, ce: 1, dec: 1, jpeg: 1, ofa: 1, placementSize: 1, placementStarts: starts(0, 1, 2, 3)},
		{id: p2, profileID: 5, memMiB: 11672, instances: 2, sms: 28, ce: 2, dec: 2, placementSize: 2, placementStarts: starts(0, 2)},
		{id: p2me, profileID: 6, memMiB: 11672, instances: 1, sms: 28, ce: 2, dec: 2, jpeg: 1, ofa: 1, placementSize: 2, placementStarts: starts(0, 2)},
		{id: p4, profileID: 0, memMiB: 23344, instances: 1, sms: 56, ce: 4, dec: 4, jpeg: 1, ofa: 1, placementSize: 4, placementStarts: starts(0)},
	},
}

// a100 is the A100's table (the guide's A100 table; its 80 GB card has the
// same engines, names with twice the memory): 14 SMs per compute slice,
// 1g without NVDEC, 1g+me with one NVDEC, NVJPG and OFA, 7g with 5
// NVDECs, one NVJPG and one OFA. Memory is go-nvml's mock's, in MiB as a
// driver reports it (the 40 GB card: 4864, 9856, 19968, 40192 MiB, which
// nvidia-smi prints as 4.75, 9.62, 19.50 and 39.25 GiB; the mock).
func a100(gb int) []giRow {
	mem := [7]uint32{4864, 4864, 9856, 9856, 19968, 19968, 40192}
	if gb == 80 {
		mem = [7]uint32{9856, 9856, 19968, 19968, 40192, 40192, 80384}
	}
	return eightSlice(mem,
		[7]uint32{14, 14, 14, 28, 42, 56, 98},
		[7]uint32{1, 1, 1, 2, 3, 4, 7},
		[7]uint32{0, 1, 1, 1, 2, 2, 5},
		[7]uint32{0, 1, 0, 0, 0, 0, 1},
		noEnc,
		[7]uint32{0, 1, 0, 0, 0, 0, 1})
}

// models maps a machine file's `model` to the GPU it simulates. Memory
// totals are NVML's v1/v2 Total (what nvidia-smi prints as the FB total);
// ReservedMiB is memory info v2's Reserved.
var models = map[string]model{
	// Measured: 81559 MiB total, 480 MiB reserved, CUDA sees 81079 MiB.
	"H100-SXM5-80GB": calibrated(gpus.H100_SXM5_80GB, "NVIDIA H100 80GB HBM3", 81559, 480<<20, srcH100),
	// Measured: 143771 MiB total, 615 MiB reserved, CUDA sees 143155 MiB.
	// NVML's reserved figure is 615 MiB and a fraction (nvidia-smi rounds it
	// to 616, and free on the idle card is 143155 MiB, not 143156): half a
	// MiB reproduces all three.
	"H200-141GB": calibrated(gpus.H200_SXM5_141GB, "NVIDIA H200", 143771, 615<<20+1<<19, srcH200),
	// 183359 MiB: the total nvidia-smi prints for a B200 in public
	// transcripts (the mock's 184320 is the nominal 180 GiB).
	"B200-180GB": calibrated(gpus.B200_SXM5_180GB, "NVIDIA B200", 183359, 1082<<20, srcReservedEstimate),
	// H100 NVL: the PCIe card sold in NVLink-bridged pairs (NVIDIA H100
	// NVL product brief: 94 GB HBM3, 600 GB/s NVLink over three bridges).
	// 95830 MiB is the total nvidia-smi is commonly shown printing for it;
	// not measured by Facet. PCI device ID 0x2321.
	"H100-NVL-94GB": calibrated(h100NVL(), "NVIDIA H100 NVL", 95830, 564<<20, srcReservedEstimate),
	// GB200: one of the two Blackwell GPUs of a GB200 superchip (GB200
	// NVL72: 186 GB HBM3e per GPU); 189471 MiB is an estimate, as is the
	// reserved memory. PCI device ID 0x2941.
	"GB200-186GB": calibrated(gb200(), "NVIDIA GB200", 189471, 1117<<20, srcReservedEstimate),
	// The A100 and A30 totals are the mock's, which are what nvidia-smi
	// prints for those cards (40960, 81920 and 24576 MiB).
	"A100-SXM4-40GB": calibrated(gpus.A100_SXM4_40GB, "NVIDIA A100-SXM4-40GB", 40960, 241<<20, srcReservedEstimate),
	"A100-SXM4-80GB": calibrated(gpus.A100_SXM4_80GB, "", 81920, 482<<20, srcReservedEstimate),
	"A100-PCIE-40GB": calibrated(gpus.A100_PCIE_40GB, "", 40960, 241<<20, srcReservedEstimate),
	"A100-PCIE-80GB": calibrated(gpus.A100_PCIE_80GB, "", 81920, 482<<20, srcReservedEstimate),
	"A30-PCIE-24GB":  calibrated(gpus.A30_PCIE_24GB, "", 24576, 145<<20, srcReservedEstimate),
	// NVIDIA L4 (Ada, AD104): 24 GB GDDR6 of which the driver reports
	// 23034 MiB, compute capability 8.9, no MIG. PCI device ID 0x27B8.
	"L4": calibrated(noMIG("NVIDIA L4", nvml.DEVICE_ARCH_ADA, nvml.BRAND_NVIDIA, 8, 9, 0x27B810DE), "", 23034, 136<<20, srcReservedEstimate),
	// NVIDIA L40S (Ada, AD102): 48 GB GDDR6 (46068 MiB reported), compute
	// capability 8.9, no MIG and no NVLink (NVIDIA L40S datasheet). PCI
	// device ID 0x26B9.
	"L40S": calibrated(noMIG("NVIDIA L40S", nvml.DEVICE_ARCH_ADA, nvml.BRAND_NVIDIA, 8, 9, 0x26B910DE), "", 46068, 272<<20, srcReservedEstimate),
	// NVIDIA T4 (Turing, TU104): 16 GB GDDR6 (15360 MiB reported), compute
	// capability 7.5, no MIG. PCI device ID 0x1EB8.
	"T4": calibrated(noMIG("Tesla T4", nvml.DEVICE_ARCH_TURING, nvml.BRAND_TESLA, 7, 5, 0x1EB810DE), "", 15360, 91<<20, srcReservedEstimate),
}

// h100NVL is go-nvml's H100 with the NVL card's PCI device ID.
func h100NVL() gpus.Config {
	c := gpus.H100_SXM5_80GB
	c.PciDeviceId = 0x232110DE
	return c
}

// gb200 is go-nvml's B200 with the GB200's PCI device ID, without MIG:
// NVIDIA's MIG table for the GB200 was not at hand, and a guessed table
// would put guessed profile names into DeviceClasses. The simulator offers
// it whole; its NVLink and fabric topology is what its machine file is for.
func gb200() gpus.Config {
	c := gpus.B200_SXM5_180GB
	c.PciDeviceId = 0x294110DE
	c.MIGProfiles = gpus.MIGProfileConfig{}
	return c
}

// noMIG is the config of a GPU without MIG, which go-nvml does not
// model: its name, architecture and brand as NVML reports them, its
// compute capability and its PCI device ID.
func noMIG(name string, arch nvml.DeviceArchitecture, brand nvml.BrandType, cudaMajor, cudaMinor int, pciDeviceID uint32) gpus.Config {
	return gpus.Config{Name: name, Architecture: arch, Brand: brand, CudaMajor: cudaMajor, CudaMinor: cudaMinor, PciDeviceId: pciDeviceID}
}

// calibrated returns go-nvml's config c with its name (when not ""), memory
// total and reserved memory set, and its MIG tables replaced by tables[c's
// model] (see applyTable).
func calibrated(c gpus.Config, name string, totalMiB, reservedBytes uint64, reservedSource string) model {
	if name != "" {
		c.Name = name
	}
	c.MemoryMB = totalMiB
	return model{Config: c, ReservedBytes: reservedBytes, ReservedSource: reservedSource}
}

func init() {
	for name, m := range models {
		if rows, ok := tables[name]; ok {
			m.MIGProfiles = applyTable(m.MIGProfiles, rows)
			models[name] = m
		}
	}
}

// Models lists the model names a machine file may use.
func Models() []string {
	return slices.Sorted(maps.Keys(models))
}

func migCapable(c gpus.Config) bool {
	return len(c.MIGProfiles.GpuInstanceProfiles) > 0
}

// applyTable returns a private copy of p (go-nvml's tables are package
// variables shared by its configs, never modified in place) in which each
// row's GPU instance profile and placements are the row's, and the compute
// instance that spans the whole GPU instance has the row's SMs. Profiles
// absent from rows are dropped. Compute instance profiles smaller than their
// GPU instance keep the mock's SM counts (no card was measured with them).
func applyTable(p gpus.MIGProfileConfig, rows []giRow) gpus.MIGProfileConfig {
	out := gpus.MIGProfileConfig{
		GpuInstanceProfiles:       map[int]nvml.GpuInstanceProfileInfo{},
		ComputeInstanceProfiles:   map[int]map[int]nvml.ComputeInstanceProfileInfo{},
		GpuInstancePlacements:     map[int][]nvml.GpuInstancePlacement{},
		ComputeInstancePlacements: map[int]map[int][]nvml.ComputeInstancePlacement{},
	}
	for _, r := range rows {
		info := p.GpuInstanceProfiles[r.id]
		// NVML's profile info carries the ID nvidia-smi shows, not the
		// index it was asked for; the mock's tables give the index.
		info.Id = uint32(r.profileID)
		info.SliceCount = sliceCount(r.id)
		info.InstanceCount = r.instances
		info.MultiprocessorCount = r.sms
		info.CopyEngineCount, info.DecoderCount, info.JpegCount = r.ce, r.dec, r.jpeg
		info.EncoderCount, info.OfaCount = r.enc, r.ofa
		info.MemorySizeMB = r.memMiB
		out.GpuInstanceProfiles[r.id] = info
		for _, s := range r.placementStarts {
			out.GpuInstancePlacements[r.id] = append(out.GpuInstancePlacements[r.id], nvml.GpuInstancePlacement{Start: s, Size: r.placementSize})
		}
		cis := map[int]nvml.ComputeInstanceProfileInfo{}
		for ci, ciInfo := range p.ComputeInstanceProfiles[r.id] {
			if ciInfo.SliceCount == info.SliceCount {
				ciInfo.MultiprocessorCount = r.sms
			}
			cis[ci] = ciInfo
		}
		out.ComputeInstanceProfiles[r.id] = cis
		cps := map[int][]nvml.ComputeInstancePlacement{}
		for ci, pl := range p.ComputeInstancePlacements[r.id] {
			cps[ci] = append([]nvml.ComputeInstancePlacement(nil), pl...)
		}
		out.ComputeInstancePlacements[r.id] = cps
	}
	return out
}

// sliceCount is the compute slice count of an NVML GPU instance profile.
func sliceCount(id int) uint32 {
	switch id {
	case p1, p1me, p1x2:
		return 1
	case p2, p2me:
		return 2
	case p3:
		return 3
	case p4:
		return 4
	case p7:
		return seven
	}
	return 0
}
