package nvml

// Node is what discovery learns about one machine.
type Node struct {
	// DriverVersion is the kernel driver version, e.g. "550.54.15"
	// (nvmlSystemGetDriverVersion).
	DriverVersion string
	// CUDADriverVersion is the newest CUDA version the driver supports,
	// as "major.minor", e.g. "12.4" (nvmlSystemGetCudaDriverVersion).
	CUDADriverVersion string
	// GPUs in NVML index order.
	GPUs []GPU
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
	// MemoryBytes is the total framebuffer memory in bytes.
	MemoryBytes uint64
	// PCIBusID is the bus ID in the kernel's sysfs form "dddd:bb:dd.f"
	// (NVML's 8-digit domain is shortened to 4).
	PCIBusID string
	// PCIeRoot is the PCIe root complex, e.g. "pci0000:00", or "" when it
	// cannot be determined.
	PCIeRoot string
	// NUMANode is the NUMA node the GPU is attached to, or -1 when unknown.
	NUMANode int
	// MIGCapable is true when the GPU supports MIG at all.
	MIGCapable bool
	// MIGEnabled is the current MIG mode (only meaningful when MIGCapable).
	MIGEnabled bool
	// MIGProfiles lists the GPU instance profiles whose compute instance
	// spans the whole GPU instance, in best-fit order: less memory first,
	// then fewer compute slices, then plain before variants ("+me"), then
	// by profile ID. Empty unless MIGCapable.
	MIGProfiles []MIGProfile
}

// MIGProfile is one GPU instance profile and every placement NVML allows
// for it. The tables behind it are NVIDIA's: on real hardware they come from
// the driver; in simulation from go-nvml's mock GPU configs
// (github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus, v0.13.3-1), which transcribe
// the MIG user guide's profile tables.
type MIGProfile struct {
	// Name in NVIDIA's notation, e.g. "1g.10gb", "1g.10gb+me", "4g.40gb".
	Name string
	// GIProfileID is the NVML GPU instance profile ID (GPU_INSTANCE_PROFILE_*).
	GIProfileID int
	// CIProfileID is the NVML compute instance profile ID that spans the
	// whole GPU instance.
	CIProfileID int
	// SliceCount is the number of compute slices ("1g" = 1).
	SliceCount int
	// MemorySlices is the number of memory slices a placement occupies
	// (the placement's Size).
	MemorySlices int
	// MemoryBytes is the instance's framebuffer in bytes.
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
