package nvmlgpu

// Node is what discovery learns about one machine.
type Node struct {
	// DriverVersion is the kernel driver version, e.g. "580.159.04"
	// (nvmlSystemGetDriverVersion).
	DriverVersion string
	// CUDADriverVersion is the newest CUDA version the driver supports,
	// as "major.minor", e.g. "13.0" (nvmlSystemGetCudaDriverVersion).
	CUDADriverVersion string
	// GPUs in NVML index order.
	GPUs []GPU
	// Pairs[i][j] is what NVML says of GPUs i and j (empty on the
	// diagonal): their common PCIe ancestor, NVLinks and P2P over NVLink.
	Pairs [][]Pair
}

// GPU is one physical GPU as NVML reports it.
type GPU struct {
	// Index is the NVML device index (0-based).
	Index int
	// Minor is the minor number of /dev/nvidia<Minor>.
	Minor int
	// UUID is NVML's "GPU-xxxxxxxx-..." identifier.
	UUID string
	// ProductName is nvmlDeviceGetName, e.g. "NVIDIA H100 80GB HBM3".
	ProductName string
	// Architecture is the lower-case architecture name, e.g. "hopper".
	Architecture string
	// Brand is the lower-case brand name, e.g. "nvidia" or "tesla".
	Brand string
	// CUDAComputeCapability is "major.minor", e.g. "9.0".
	CUDAComputeCapability string
	// MemoryBytes is the framebuffer memory a workload can be given, in
	// bytes: NVML memory info v2's Total minus Reserved (the memory the
	// driver keeps for itself), rounded down to a whole MiB; what CUDA's
	// cudaMemGetInfo reports as total on an idle GPU. It is what Facet publishes as a whole GPU's memory
	// capacity and sizes slots, vGPU shares and HAMi-core limits from.
	// Where the driver does not support memory info v2, it is the v1 total
	// (MemorySource says which), which overstates it by the reserved part.
	MemoryBytes uint64
	// TotalMemoryBytes is NVML's total framebuffer in bytes (memory info
	// v1 and v2 Total, nvidia-smi's "FB Memory Usage: Total"), reserved
	// memory included. MIG profile names are derived from it, as NVIDIA's
	// tools derive them.
	TotalMemoryBytes uint64
	// ReservedMemoryBytes is the framebuffer the driver reserves (memory
	// info v2 Reserved; nvidia-smi's "Reserved"); 0 when MemorySource is
	// MemorySourceV1Total.
	ReservedMemoryBytes uint64
	// MemorySource names the NVML figure MemoryBytes comes from.
	MemorySource MemorySource
	// PCIBusID is the bus ID in the kernel's sysfs form "dddd:bb:dd.f"
	// (NVML's 8-digit domain is shortened to 4).
	PCIBusID string
	// PCIeRoot is the PCIe root complex, e.g. "pci0000:00", or "" when it
	// cannot be determined.
	PCIeRoot string
	// NUMANode is the NUMA node the GPU's PCI device is attached to, as
	// sysfs's numa_node says (Sysfs.NUMANode), or -1 when it has none (a VM)
	// or the bus ID is unknown.
	NUMANode int
	// PCIeSwitch is the bus ID of the upstream port of the PCIe switch the
	// GPU sits directly under, from its sysfs path (PCIeSwitchFromPath), or
	// "" where it sits on a root port or sysfs does not say.
	PCIeSwitch string
	// NVLinkSupported is false where NVML does not support NVLink on the
	// GPU (ERROR_NOT_SUPPORTED for every link).
	NVLinkSupported bool
	// NVLinks are the GPU's active NVLinks (nvmlDeviceGetNvLinkState).
	NVLinks []NVLink
	// NVLinkDomain identifies the GPUs of this node joined by NVLink
	// (setDomains), or "" where the GPU has no active NVLink to a GPU or an
	// NVSwitch.
	NVLinkDomain string
	// NVLinkDomainSize is the number of GPUs in NVLinkDomain.
	NVLinkDomainSize int
	// NVLinkBandwidthGBps is the total bandwidth of the active NVLinks, in
	// GB/s with both directions counted (NVLinkGBpsPerLink), or 0 where
	// the GPU has none or NVML does not give a link's version.
	NVLinkBandwidthGBps int
	// Fabric is the GPU's multi-node NVLink fabric cluster and clique
	// (GB200 NVL72), or nil.
	Fabric *Fabric
	// MIGCapable is true when the GPU supports MIG at all.
	MIGCapable bool
	// MIGEnabled is the current MIG mode (only meaningful when MIGCapable).
	MIGEnabled bool
	// MIGModeFixed, when not empty, says why Facet must not change this
	// GPU's MIG mode (MIGModeFixedReason): a GPU before Hopper applies a
	// change only after a GPU reset, and a vGPU guest's mode is the
	// hypervisor's. Empty on a MIG-capable Hopper or later GPU outside a
	// vGPU guest, and on GPUs without MIG.
	MIGModeFixed string
	// VGPUGuest is true when the GPU is a vGPU in a virtual machine
	// (nvmlDeviceGetVirtualizationMode: NVML_GPU_VIRTUALIZATION_MODE_VGPU):
	// the guest cannot create GPU or compute instances.
	VGPUGuest bool
	// MIGProfiles lists the GPU instance profiles whose compute instance
	// spans the whole GPU instance, in best-fit order: less memory first,
	// then fewer compute slices, then plain before variants ("+me"), then
	// by profile ID. Empty unless MIGCapable.
	MIGProfiles []MIGProfile
}

// MemorySource names where a GPU's MemoryBytes comes from.
type MemorySource string

const (
	// MemorySourceV2 is NVML memory info v2 (nvmlDeviceGetMemoryInfo_v2):
	// Total minus Reserved.
	MemorySourceV2 MemorySource = "nvml-memory-info-v2"
	// MemorySourceV1Total is NVML memory info v1's Total, used where the
	// driver answers v2 with ERROR_NOT_SUPPORTED: it includes the driver's
	// reserved memory, so it overstates what a workload can allocate.
	MemorySourceV1Total MemorySource = "nvml-memory-info-v1-total"
)

// MIGProfile is one GPU instance profile and every placement NVML allows
// for it. The tables behind it are NVIDIA's: on real hardware they come from
// the driver; in simulation from Facet's model tables (internal/nvml/sim,
// models.go), which hold the values NVML reports on the measured H100 and
// H200 and NVIDIA's MIG user guide for the other models.
type MIGProfile struct {
	// Name in NVIDIA's notation, e.g. "1g.10gb", "1g.10gb+me", "4g.40gb".
	Name string
	// GIProfileID is NVML's GPU instance profile index, the
	// GPU_INSTANCE_PROFILE_* constant nvmlDeviceGetGpuInstanceProfileInfo
	// takes (0 for a 1g), as go-nvlib and mig-parted name it. CreateMIG
	// and the checkpoint take this one.
	GIProfileID int
	// GIProfileInfoID is the profile's ID as `nvidia-smi mig -lgip` shows
	// it and -cgi takes, NVML's GpuInstanceProfileInfo.Id: 19 for a
	// 1g.10gb on an H100, 9 for its 3g.40gb, 0 for 7g.80gb. For people and
	// logs; the code looks profiles up by GIProfileID.
	GIProfileInfoID int
	// CIProfileID is the NVML compute instance profile index
	// (COMPUTE_INSTANCE_PROFILE_*) that spans the whole GPU instance. On
	// the GPUs Facet knows it equals the compute instance profile ID
	// nvidia-smi shows.
	CIProfileID int
	// SliceCount is the number of compute slices ("1g" = 1).
	SliceCount int
	// MemorySlices is the number of memory slices a placement occupies
	// (the placement's Size).
	MemorySlices int
	// MemoryBytes is the instance's framebuffer in bytes, as NVML reports
	// it (GpuInstanceProfileInfo.MemorySizeMB, in MiB): e.g. 9984 MiB for
	// an H100 80GB's 1g.10gb, not the 10 GB of its name.
	MemoryBytes uint64
	// Multiprocessors is the number of SMs of the instance.
	Multiprocessors int
	// Engines counts the instance's copy engines, decoders, encoders, JPEG
	// and OFA units.
	CopyEngines, Decoders, Encoders, JPEGs, OFAs int
	// Placements are the legal (start, size) memory-slice ranges, as
	// nvmlDeviceGetGpuInstancePossiblePlacements returns them.
	Placements []Placement
}

// Placement is a range of memory slices [Start, Start+Size).
type Placement struct {
	Start int
	Size  int
}
