package nvmlgpu

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// nvmlError turns an NVML return code into an error naming the call.
func nvmlError(call string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("%s: %w", call, nvmlReturnError{ret})
}

type nvmlReturnError struct{ ret nvml.Return }

func (e nvmlReturnError) Error() string { return nvml.ErrorString(e.ret) }

// IsNotSupported reports whether err carries NVML's ERROR_NOT_SUPPORTED.
func IsNotSupported(err error) bool {
	var e nvmlReturnError
	return errors.As(err, &e) && e.ret == nvml.ERROR_NOT_SUPPORTED
}

// discover reads the node through lib. It is the one code path for the real
// library and the simulated one.
func discover(lib nvml.Interface, sysfs Sysfs) (*Node, error) {
	driver, ret := lib.SystemGetDriverVersion()
	if err := nvmlError("nvmlSystemGetDriverVersion", ret); err != nil {
		return nil, err
	}
	if branch, err := strconv.Atoi(strings.SplitN(driver, ".", 2)[0]); err != nil || branch < OldestSupportedDriver {
		return nil, fmt.Errorf("NVIDIA driver %q: Facet supports R%d and later (docs/operators.md, \"Drivers\")", driver, OldestSupportedDriver)
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
	devs := make([]nvml.Device, 0, count)
	for i := 0; i < count; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if err := nvmlError("nvmlDeviceGetHandleByIndex", ret); err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		gpu, err := discoverGPU(lib, devlib, dev, i, sysfs)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		node.GPUs = append(node.GPUs, *gpu)
		devs = append(devs, dev)
	}
	discoverPairs(node, devs)
	return node, nil
}

func discoverGPU(lib nvml.Interface, devlib nvdev.Interface, dev nvml.Device, index int, sysfs Sysfs) (*GPU, error) {
	gpu := &GPU{Index: index, NUMANode: -1}
	var ret nvml.Return
	if gpu.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetUUID", ret)
	}
	if gpu.Minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetMinorNumber", ret)
	}
	if gpu.ProductName, ret = dev.GetName(); ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetName", ret)
	}
	arch, ret := dev.GetArchitecture()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetArchitecture", ret)
	}
	gpu.Architecture = nameOr(architectureNames, arch, "unknown")
	brand, ret := dev.GetBrand()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetBrand", ret)
	}
	gpu.Brand = nameOr(brandNames, brand, "unknown")
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetCudaComputeCapability", ret)
	}
	gpu.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	if err := readMemory(dev, gpu, HasSymbol(lib, "nvmlDeviceGetMemoryInfo_v2")); err != nil {
		return nil, err
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return nil, nvmlError("nvmlDeviceGetPciInfo", ret)
	}
	gpu.PCIBusID = normalizeBusID(busIDString(pci.BusId))
	if gpu.PCIBusID != "" && sysfs.PCIeRoot != nil {
		root, err := sysfs.PCIeRoot(gpu.PCIBusID)
		if err != nil {
			return nil, fmt.Errorf("PCIe root of %s: %w", gpu.PCIBusID, err)
		}
		gpu.PCIeRoot = root
	}
	if gpu.PCIBusID != "" {
		numa, err := sysfs.NUMANode(gpu.PCIBusID)
		if err != nil {
			return nil, fmt.Errorf("NUMA node of %s: %w", gpu.PCIBusID, err)
		}
		gpu.NUMANode = numa
	}
	if gpu.PCIBusID != "" && sysfs.PCIPath != nil {
		// A path sysfs cannot resolve leaves the switch unknown, never
		// guessed.
		if p, err := sysfs.PCIPath(gpu.PCIBusID); err == nil {
			gpu.PCIeSwitch = PCIeSwitchFromPath(p)
		} else {
			klog.InfoS("PCIe switch unknown", "gpu", gpu.UUID, "err", err)
		}
	}
	gpu.NVLinks, gpu.NVLinkSupported = discoverNVLinks(dev, HasSymbol(lib, "nvmlDeviceGetNvLinkRemoteDeviceType"))
	gpu.Fabric = discoverFabric(lib, dev)

	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		gpu.MIGCapable = true
		gpu.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
		var err error
		if gpu.VGPUGuest, err = vgpuGuest(dev); err != nil {
			return nil, err
		}
		gpu.MIGModeFixed = MIGModeFixedReason(arch, gpu.VGPUGuest)
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return nil, nvmlError("nvmlDeviceGetMigMode", ret)
	}
	if gpu.MIGCapable {
		profiles, err := discoverMIGProfiles(devlib, dev, gpu.TotalMemoryBytes)
		if err != nil {
			return nil, err
		}
		gpu.MIGProfiles = profiles
	}
	return gpu, nil
}

// readMemory fills the GPU's memory fields from NVML memory info v2: the
// usable memory is Total minus Reserved, the figure CUDA reports as total
// (measured on an H100 80GB HBM3, driver 580.159.04: 81559 MiB total, 480
// MiB reserved, cudaMemGetInfo total 81079 MiB). A driver that does not
// support v2 (ERROR_NOT_SUPPORTED or ERROR_FUNCTION_NOT_FOUND), or whose
// NVML lacks the function (haveV2 false: a driver older than R510, see
// NewerSymbols), gets v1's Total, with a log line that says the figure
// includes reserved memory.
func readMemory(dev nvml.Device, gpu *GPU, haveV2 bool) error {
	v2, ret := nvml.Memory_v2{}, nvml.ERROR_FUNCTION_NOT_FOUND
	if haveV2 {
		v2, ret = dev.GetMemoryInfo_v2()
	}
	switch {
	case ret == nvml.SUCCESS && v2.Reserved < v2.Total:
		gpu.TotalMemoryBytes, gpu.ReservedMemoryBytes = v2.Total, v2.Reserved
		// Whole MiB: HAMi-core limits and slots are given in MiB, and CUDA
		// reports the H200's 143155.5 MiB as 143155.
		gpu.MemoryBytes = (v2.Total - v2.Reserved) &^ (1<<20 - 1)
		gpu.MemorySource = MemorySourceV2
		return nil
	case ret == nvml.SUCCESS:
		return fmt.Errorf("nvmlDeviceGetMemoryInfo_v2: reserved %d bytes is not less than total %d bytes", v2.Reserved, v2.Total)
	case ret != nvml.ERROR_NOT_SUPPORTED && ret != nvml.ERROR_FUNCTION_NOT_FOUND:
		return nvmlError("nvmlDeviceGetMemoryInfo_v2", ret)
	}
	why := "the driver returned " + nvml.ErrorString(ret)
	if !haveV2 {
		why = symbolError("nvmlDeviceGetMemoryInfo_v2").Error()
	}
	v1, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nvmlError("nvmlDeviceGetMemoryInfo", ret)
	}
	gpu.TotalMemoryBytes, gpu.ReservedMemoryBytes, gpu.MemoryBytes = v1.Total, 0, v1.Total&^(1<<20-1)
	gpu.MemorySource = MemorySourceV1Total
	klog.InfoS("NVML memory info v2 is not supported; publishing the v1 total, which includes the driver's reserved memory and so overstates what a workload can allocate",
		"gpu", gpu.UUID, "totalBytes", v1.Total, "why", why)
	return nil
}

// MIGModeFixedReason says why Facet must not change a MIG-capable GPU's MIG
// mode, or "" where it may: only Hopper and later apply a change without a
// GPU reset, and a vGPU guest's mode is fixed by its vGPU profile. NVIDIA's
// DRA driver draws the same line (cmd/gpu-kubelet-plugin/nvlib.go,
// supportsMIGModeToggle and isDynamicMIGCapable).
func MIGModeFixedReason(arch nvml.DeviceArchitecture, vgpuGuest bool) string {
	switch {
	case vgpuGuest:
		return "the GPU is a vGPU in a virtual machine: its MIG mode and instances are the hypervisor's vGPU profile"
	case arch < nvml.DEVICE_ARCH_HOPPER:
		return fmt.Sprintf("this %s GPU applies a MIG mode change only after a GPU reset (Hopper and later apply it at once); "+
			"Facet never leaves a change pending, so MIG mode on this GPU is the admin's (nvidia-smi -i <index> -mig 1 to turn it on, -mig 0 off, then a GPU reset or reboot)", nameOr(architectureNames, arch, "unknown"))
	}
	return ""
}

// vgpuGuest reports whether dev is a vGPU in a guest VM. A driver that
// cannot say (ERROR_NOT_SUPPORTED) is not in one.
func vgpuGuest(dev nvml.Device) (bool, error) {
	mode, ret := dev.GetVirtualizationMode()
	switch ret {
	case nvml.SUCCESS:
		return mode == nvml.GPU_VIRTUALIZATION_MODE_VGPU, nil
	case nvml.ERROR_NOT_SUPPORTED:
		return false, nil
	}
	return false, nvmlError("nvmlDeviceGetVirtualizationMode", ret)
}

// discoverMIGProfiles lists every GPU instance profile the device supports
// whose full-size compute instance exists, with its placements.
func discoverMIGProfiles(devlib nvdev.Interface, dev nvml.Device, deviceMemory uint64) ([]MIGProfile, error) {
	var profiles []MIGProfile
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
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
		if ret != nvml.SUCCESS {
			return nil, nvmlError(fmt.Sprintf("nvmlDeviceGetGpuInstancePossiblePlacements(%d)", id), ret)
		}
		if len(placements) == 0 {
			continue
		}
		named, err := devlib.NewMigProfile(id, ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, info.MemorySizeMB, deviceMemory)
		if err != nil {
			return nil, fmt.Errorf("MIG profile ID %d (NVML index %d): %w", info.Id, id, err)
		}
		p := MIGProfile{
			Name:            named.String(),
			GIProfileID:     id,
			GIProfileInfoID: int(info.Id),
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
	// Plain before variants ("+me"): the scarce media engines are only
	// taken when asked for.
	variant := func(p MIGProfile) int {
		if strings.ContainsAny(p.Name, "+-") {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(profiles, func(a, b MIGProfile) int {
		return cmp.Or(cmp.Compare(a.MemoryBytes, b.MemoryBytes), cmp.Compare(a.SliceCount, b.SliceCount),
			cmp.Compare(variant(a), variant(b)), cmp.Compare(a.GIProfileID, b.GIProfileID))
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
	p, ok := fullComputeInstanceProfiles[slices]
	return p, ok
}

var fullComputeInstanceProfiles = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE, 7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE,
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

// architectureNames and brandNames are how Facet publishes NVML's
// architecture and brand (attributes architecture and brand).
var architectureNames = map[nvml.DeviceArchitecture]string{
	nvml.DEVICE_ARCH_KEPLER: "kepler", nvml.DEVICE_ARCH_MAXWELL: "maxwell", nvml.DEVICE_ARCH_PASCAL: "pascal",
	nvml.DEVICE_ARCH_VOLTA: "volta", nvml.DEVICE_ARCH_TURING: "turing", nvml.DEVICE_ARCH_AMPERE: "ampere",
	nvml.DEVICE_ARCH_ADA: "ada", nvml.DEVICE_ARCH_HOPPER: "hopper", nvml.DEVICE_ARCH_BLACKWELL: "blackwell",
	nvml.DEVICE_ARCH_RUBIN: "rubin",
}

var brandNames = map[nvml.BrandType]string{
	nvml.BRAND_QUADRO: "quadro", nvml.BRAND_TESLA: "tesla", nvml.BRAND_NVS: "nvs", nvml.BRAND_GRID: "grid",
	nvml.BRAND_GEFORCE: "geforce", nvml.BRAND_TITAN: "titan", nvml.BRAND_NVIDIA_RTX: "nvidia-rtx",
	nvml.BRAND_NVIDIA: "nvidia", nvml.BRAND_GEFORCE_RTX: "geforce-rtx",
}

// nameOr is NVML's enum value v by its name in names, or unknown for a
// value Facet does not know (a newer driver's).
func nameOr[V comparable](names map[V]string, v V, unknown string) string {
	if n, ok := names[v]; ok {
		return n
	}
	return unknown
}
