package sim

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// OpenMachine simulates the node described by a machine file.
func OpenMachine(path string, opts ...Option) (*nvmlgpu.Library, error) {
	m, err := LoadMachine(path)
	if err != nil {
		return nil, err
	}
	return OpenSimulated(m, opts...)
}

// OpenSimulated simulates a validated Machine on top of go-nvml's mock
// server, with MIG that behaves like the hardware's (see mig.go). By
// default the simulated MIG state lives in memory; WithStateFile keeps it
// across processes.
func OpenSimulated(m *Machine, opts ...Option) (*nvmlgpu.Library, error) {
	lib, _, err := openSimulated(m, opts...)
	return lib, err
}

// openSimulated is OpenSimulated, also returning the mock server behind the
// library (for tests that reach into a simulated device).
func openSimulated(m *Machine, opts ...Option) (*nvmlgpu.Library, *server.Server, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := m.Validate(); err != nil {
		return nil, nil, err
	}
	cuda, _ := cudaVersionInt(m.CUDADriverVersion)
	configs := make([]gpus.Config, len(m.GPUs))
	for i, g := range m.GPUs {
		configs[i] = models[g.Model].Config
	}
	srv := server.NewServerWithGPUs(m.DriverVersion, "12."+m.DriverVersion, cuda, configs...)
	roots := map[string]string{}
	modelNames := make([]string, len(m.GPUs))
	for i, g := range m.GPUs {
		dev := srv.Devices[i].(*server.Device)
		simulateDevice(dev, g, models[g.Model])
		roots[g.PCIBusID] = g.PCIeRoot
		modelNames[i] = g.Model
	}
	simulateTopology(srv, m)
	sysfs := machineSysfs(m)
	paths := pciPaths(m)
	sysfs.PCIPath = func(busID string) (string, error) {
		p, ok := paths[busID]
		if !ok {
			return "", fmt.Errorf("bus ID %s is not in machine %s", busID, m.Name)
		}
		return p, nil
	}
	sysfs.PCIeRoot = func(busID string) (string, error) {
		root, ok := roots[busID]
		if !ok {
			return "", fmt.Errorf("bus ID %s is not in machine %s", busID, m.Name)
		}
		return root, nil
	}
	simulateDriverSymbols(srv, m.DriverVersion)
	sim := newSimNode(srv, modelNames)
	sim.ciInfoParent = m.CIInfoParentDevice
	var faults *faultSource
	if o.faultFile != "" {
		var err error
		if faults, err = newFaultSource(o.faultFile); err != nil {
			return nil, nil, err
		}
	}
	sim.installEvents(srv, faults)
	if o.stateFile != "" {
		if err := sim.openStore(o.stateFile, m.Name); err != nil {
			return nil, nil, err
		}
	}
	lib := nvmlgpu.New(srv, sysfs)
	return lib, srv, nil
}

// simulateDriverSymbols makes the simulated NVML lack the functions
// (nvmlgpu.NewerSymbols) that its driver version predates, as a real
// libnvidia-ml.so.1 of that version does: LookupSymbol says so, and a call
// panics with the loader's words, where the real process would end with
// "symbol lookup error". A simulated R470 node thus tests every fallback.
func simulateDriverSymbols(srv *server.Server, driverVersion string) {
	branch, _ := strconv.Atoi(strings.SplitN(driverVersion, ".", 2)[0])
	lacks := func(name string) bool {
		first, ok := nvmlgpu.NewerSymbols[name]
		return ok && branch < first
	}
	srv.LookupSymbolFunc = func(name string) error {
		if lacks(name) {
			return fmt.Errorf("undefined symbol: %s (simulated driver %s)", name, driverVersion)
		}
		return nil
	}
	if lacks("nvmlDeviceGetMemoryInfo_v2") {
		for _, d := range srv.Devices {
			d.(*server.Device).GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
				panic("symbol lookup error: undefined symbol: nvmlDeviceGetMemoryInfo_v2 (simulated driver " + driverVersion + ")")
			}
		}
	}
	if lacks("nvmlDeviceGetGpuFabricInfo") {
		for _, d := range srv.Devices {
			d.(*server.Device).GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
				panic("symbol lookup error: undefined symbol: nvmlDeviceGetGpuFabricInfo (simulated driver " + driverVersion + ")")
			}
		}
	}
}

// defaultUUID derives a stable UUID, so a restarted plugin on the same
// machine file sees the same GPUs (the mock would draw random ones).
func defaultUUID(machine string, index int) string {
	ns := uuid.MustParse("8f0e6c1a-6a52-4f43-9a5e-2f9a4b7f1d10")
	return "GPU-" + uuid.NewSHA1(ns, fmt.Appendf(nil, "%s/%d", machine, index)).String()
}

// machineSysfs is the machine's sysfs as discovery reads it: each GPU's
// bus/pci/devices/<bus ID>/numa_node, "-1" where the machine file gives no
// NUMA node, as the kernel writes it.
func machineSysfs(m *Machine) nvmlgpu.Sysfs {
	fsys := fstest.MapFS{}
	for _, g := range m.GPUs {
		numa := -1
		if g.NUMANode != nil {
			numa = *g.NUMANode
		}
		fsys[path.Join("bus", "pci", "devices", g.PCIBusID, "numa_node")] = &fstest.MapFile{Data: fmt.Appendf(nil, "%d\n", numa), Mode: 0o444}
	}
	return nvmlgpu.Sysfs{FS: fsys}
}

// simulateDevice fills in what go-nvml's mock leaves out or gets wrong for
// Facet's purposes: identity, PCI location, memory info v2 and the MIG
// mode at boot. MIG itself is newSimNode's.
func simulateDevice(dev *server.Device, g MachineGPU, m model) {
	dev.UUID = g.UUID
	// An idle GPU: v1 counts the reserved memory as used (free = total -
	// reserved, as nvidia-smi shows it); v2 reports it apart.
	total, reserved := m.MemoryMB<<20, m.ReservedBytes
	dev.MemoryInfo = nvml.Memory{Total: total, Free: total - reserved, Used: reserved}
	dev.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		return nvml.Memory_v2{Version: 2, Total: total, Reserved: reserved, Free: total - reserved}, nvml.SUCCESS
	}
	virt := nvml.GPU_VIRTUALIZATION_MODE_NONE
	if g.VGPUGuest {
		virt = nvml.GPU_VIRTUALIZATION_MODE_VGPU
	}
	dev.GetVirtualizationModeFunc = func() (nvml.GpuVirtualizationMode, nvml.Return) { return virt, nvml.SUCCESS }
	// An idle GPU's utilization; with MIG mode on NVML reports none per
	// GPU, as on a real A100 or H100.
	dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		if current, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS && current == nvml.DEVICE_MIG_ENABLE {
			return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.Utilization{}, nvml.SUCCESS
	}
	dev.PciBusID = g.PCIBusID
	if g.MIGEnabled {
		dev.MigMode = nvml.DEVICE_MIG_ENABLE
	}
	dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		var p nvml.PciInfo
		p.PciDeviceId = dev.Config.PciDeviceId
		// NVML reports an 8-digit domain.
		id := "0000" + g.PCIBusID
		for i := 0; i < len(id) && i < len(p.BusId)-1; i++ {
			p.BusId[i] = int8(id[i])
		}
		// Validate checked the bus ID against busIDPattern.
		_, _ = fmt.Sscanf(g.PCIBusID, "%x:%x:%x", &p.Domain, &p.Bus, &p.Device)
		return p, nvml.SUCCESS
	}
	// nvcdi asks every handle whether it is a MIG device.
	dev.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	// As measured on an H100 80GB HBM3: NVML has a NUMA node only for a GPU
	// whose memory is one (Grace Hopper); the NUMA affinity of a PCIe or
	// SXM GPU is sysfs's (machineSysfs).
	dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
}

// DiscoverMachine simulates the node of a machine file and discovers it,
// for tools and tests that want the node but not the library.
func DiscoverMachine(path string) (*nvmlgpu.Node, error) {
	m, err := LoadMachine(path)
	if err != nil {
		return nil, err
	}
	return DiscoverSimulated(m)
}

// DiscoverSimulated is DiscoverMachine for a Machine built in code.
func DiscoverSimulated(m *Machine) (*nvmlgpu.Node, error) {
	lib, err := OpenSimulated(m)
	if err != nil {
		return nil, err
	}
	defer lib.Close()
	return lib.Discover()
}
