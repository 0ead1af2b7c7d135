package nvml

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// PCIeRootFunc resolves a PCI bus ID ("dddd:bb:dd.f") to its PCIe root
// complex ("pci0000:00"). Production uses sysfs through
// k8s.io/dynamic-resource-allocation/deviceattribute; a simulated machine
// answers from its machine file.
type PCIeRootFunc func(busID string) (string, error)

// nvmlError turns an NVML return code into an error naming the call.
func nvmlError(call string, ret gonvml.Return) error {
	if ret == gonvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("%s: %w", call, nvmlReturnError{ret})
}

type nvmlReturnError struct{ ret gonvml.Return }

func (e nvmlReturnError) Error() string { return gonvml.ErrorString(e.ret) }

// IsNotSupported reports whether err carries NVML's ERROR_NOT_SUPPORTED.
func IsNotSupported(err error) bool {
	var e nvmlReturnError
	return errors.As(err, &e) && e.ret == gonvml.ERROR_NOT_SUPPORTED
}

// discover reads the node through lib. It is the one code path for the real
// library and the simulated one.
func discover(lib gonvml.Interface, pcieRoot PCIeRootFunc) (*Node, error) {
	driver, ret := lib.SystemGetDriverVersion()
	if err := nvmlError("nvmlSystemGetDriverVersion", ret); err != nil {
		return nil, err
	}
	cuda, ret := lib.SystemGetCudaDriverVersion()
	if err := nvmlError("nvmlSystemGetCudaDriverVersion", ret); err != nil {
		return nil, err
	}
	count, ret := lib.DeviceGetCount()
	if err := nvmlError("nvmlDeviceGetCount", ret); err != nil {
		return nil, err
	}
	node := &Node{
		DriverVersion: driver,
		// NVML encodes CUDA 12.4 as 12040.
		CUDADriverVersion: fmt.Sprintf("%d.%d", cuda/1000, (cuda%1000)/10),
	}
	devlib := nvdev.New(lib)
	for i := 0; i < count; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if err := nvmlError("nvmlDeviceGetHandleByIndex", ret); err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		gpu, err := discoverGPU(devlib, dev, i, pcieRoot)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		node.GPUs = append(node.GPUs, *gpu)
	}
	return node, nil
}

func discoverGPU(devlib nvdev.Interface, dev gonvml.Device, index int, pcieRoot PCIeRootFunc) (*GPU, error) {
	gpu := &GPU{Index: index, NUMANode: -1}
	var ret gonvml.Return
	if gpu.UUID, ret = dev.GetUUID(); ret != gonvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetUUID", ret)
	}
	if gpu.Minor, ret = dev.GetMinorNumber(); ret != gonvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetMinorNumber", ret)
	}
	if gpu.ProductName, ret = dev.GetName(); ret != gonvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetName", ret)
	}
	arch, ret := dev.GetArchitecture()
	if ret != gonvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetArchitecture", ret)
	}
	gpu.Architecture = architectureName(arch)
	brand, ret := dev.GetBrand()
	if ret != gonvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetBrand", ret)
	}
	gpu.Brand = brandName(brand)
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != gonvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetCudaComputeCapability", ret)
	}
	gpu.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	mem, ret := dev.GetMemoryInfo()
	if ret != gonvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetMemoryInfo", ret)
	}
	gpu.MemoryBytes = mem.Total
	pci, ret := dev.GetPciInfo()
	if ret != gonvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetPciInfo", ret)
	}
	gpu.PCIBusID = normalizeBusID(busIDString(pci.BusId))
	if gpu.PCIBusID != "" && pcieRoot != nil {
		root, err := pcieRoot(gpu.PCIBusID)
		if err != nil {
			return nil, fmt.Errorf("PCIe root of %s: %w", gpu.PCIBusID, err)
		}
		gpu.PCIeRoot = root
	}
	// NUMA affinity is optional in NVML (and absent on single-socket
	// machines); unknown is -1, not an error.
	if numa, ret := dev.GetNumaNodeId(); ret == gonvml.SUCCESS {
		gpu.NUMANode = numa
	}

	current, _, ret := dev.GetMigMode()
	switch ret {
	case gonvml.SUCCESS:
		gpu.MIGCapable = true
		gpu.MIGEnabled = current == gonvml.DEVICE_MIG_ENABLE
	case gonvml.ERROR_NOT_SUPPORTED:
	default:
		return nil, nvmlError("nvmlDeviceGetMigMode", ret)
	}
	if gpu.MIGCapable {
		profiles, err := discoverMIGProfiles(devlib, dev, gpu.MemoryBytes)
		if err != nil {
			return nil, err
		}
		gpu.MIGProfiles = profiles
	}
	return gpu, nil
}

// discoverMIGProfiles lists every GPU instance profile the device supports
// whose full-size compute instance exists, with its placements.
func discoverMIGProfiles(devlib nvdev.Interface, dev gonvml.Device, deviceMemory uint64) ([]MIGProfile, error) {
	var profiles []MIGProfile
	for id := 0; id < gonvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret == gonvml.ERROR_NOT_SUPPORTED || ret == gonvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != gonvml.SUCCESS {
			return nil, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstanceProfileInfo(%d)", id), ret)
		}
		if info.InstanceCount == 0 {
			continue
		}
		ciProfile, ok := fullComputeInstanceProfile(int(info.SliceCount))
		if !ok {
			continue
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != gonvml.SUCCESS {
			return nil, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstancePossiblePlacements(%d)", id), ret)
		}
		if len(placements) == 0 {
			continue
		}
		named, err := devlib.NewMigProfile(id, ciProfile, gonvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, info.MemorySizeMB, deviceMemory)
		if err != nil {
			return nil, fmt.Errorf("MIG profile %d: %w", id, err)
		}
		p := MIGProfile{
			Name:            named.String(),
			GIProfileID:     id,
			CIProfileID:     ciProfile,
			SliceCount:      int(info.SliceCount),
			MemoryBytes:     info.MemorySizeMB << 20,
			Multiprocessors: int(info.MultiprocessorCount),
			CopyEngines:     int(info.CopyEngineCount),
			Decoders:        int(info.DecoderCount),
			Encoders:        int(info.EncoderCount),
			JPEGs:           int(info.JpegCount),
			OFAs:            int(info.OfaCount),
		}
		for _, pl := range placements {
			p.Placements = append(p.Placements, Placement{Start: int(pl.Start), Size: int(pl.Size)})
			p.MemorySlices = int(pl.Size)
		}
		profiles = append(profiles, p)
	}
	nameUniquely(profiles)
	sort.SliceStable(profiles, func(i, j int) bool {
		a, b := profiles[i], profiles[j]
		if a.MemoryBytes != b.MemoryBytes {
			return a.MemoryBytes < b.MemoryBytes
		}
		if a.SliceCount != b.SliceCount {
			return a.SliceCount < b.SliceCount
		}
		// Plain before variants ("+me"): the scarce media engines are
		// only taken when asked for.
		if va, vb := strings.ContainsAny(a.Name, "+-"), strings.ContainsAny(b.Name, "+-"); va != vb {
			return !va
		}
		return a.GIProfileID < b.GIProfileID
	})
	return profiles, nil
}

// nameUniquely keeps go-nvlib's names (the rule mig-parted and NVIDIA's
// device plugin use: memory as a fraction of the GPU, rounded up to eighths)
// unless they give two profiles of one GPU the same name. That happens when a
// profile table carries nominal sizes rather than what the hardware reports
// (go-nvml's H200 mock: 18432 MiB for 1g.18gb), and then every profile of that
// GPU is named by its nominal GiB instead, which is how NVIDIA's MIG user
// guide names them. Device names derive from these, so they must be unique.
func nameUniquely(profiles []MIGProfile) {
	seen := map[string]bool{}
	collide := false
	for _, p := range profiles {
		collide = collide || seen[p.Name]
		seen[p.Name] = true
	}
	if !collide {
		return
	}
	for i := range profiles {
		p := &profiles[i]
		suffix := ""
		if j := strings.IndexAny(p.Name, "+-"); j >= 0 {
			suffix = p.Name[j:]
		}
		gb := (p.MemoryBytes + 1<<29) >> 30
		p.Name = fmt.Sprintf("%dg.%dgb%s", p.SliceCount, gb, suffix)
	}
}

// fullComputeInstanceProfile maps a GPU instance's compute slice count to
// the compute instance profile that takes all of it.
func fullComputeInstanceProfile(slices int) (int, bool) {
	switch slices {
	case 1:
		return gonvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, true
	case 2:
		return gonvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, true
	case 3:
		return gonvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, true
	case 4:
		return gonvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, true
	case 6:
		return gonvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, true
	case 7:
		return gonvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, true
	case 8:
		return gonvml.COMPUTE_INSTANCE_PROFILE_8_SLICE, true
	}
	return 0, false
}

func busIDString(raw [32]int8) string {
	b := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// normalizeBusID turns NVML's "00000000:18:00.0" into sysfs's "0000:18:00.0".
func normalizeBusID(id string) string {
	id = strings.ToLower(id)
	if i := strings.Index(id, ":"); i > 4 {
		id = id[i-4:]
	}
	return id
}

func architectureName(a gonvml.DeviceArchitecture) string {
	switch a {
	case gonvml.DEVICE_ARCH_KEPLER:
		return "kepler"
	case gonvml.DEVICE_ARCH_MAXWELL:
		return "maxwell"
	case gonvml.DEVICE_ARCH_PASCAL:
		return "pascal"
	case gonvml.DEVICE_ARCH_VOLTA:
		return "volta"
	case gonvml.DEVICE_ARCH_TURING:
		return "turing"
	case gonvml.DEVICE_ARCH_AMPERE:
		return "ampere"
	case gonvml.DEVICE_ARCH_ADA:
		return "ada"
	case gonvml.DEVICE_ARCH_HOPPER:
		return "hopper"
	case gonvml.DEVICE_ARCH_BLACKWELL:
		return "blackwell"
	case gonvml.DEVICE_ARCH_RUBIN:
		return "rubin"
	}
	return "unknown"
}

func brandName(b gonvml.BrandType) string {
	switch b {
	case gonvml.BRAND_QUADRO:
		return "quadro"
	case gonvml.BRAND_TESLA:
		return "tesla"
	case gonvml.BRAND_NVS:
		return "nvs"
	case gonvml.BRAND_GRID:
		return "grid"
	case gonvml.BRAND_GEFORCE:
		return "geforce"
	case gonvml.BRAND_TITAN:
		return "titan"
	case gonvml.BRAND_NVIDIA_RTX:
		return "nvidia-rtx"
	case gonvml.BRAND_NVIDIA:
		return "nvidia"
	case gonvml.BRAND_GEFORCE_RTX:
		return "geforce-rtx"
	}
	return "unknown"
}
