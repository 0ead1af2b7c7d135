package nvml

import (
	"fmt"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// Library is an initialised NVML, real or simulated. It is safe for
// concurrent use.
type Library struct {
	lib      gonvml.Interface
	pcieRoot PCIeRootFunc
	// simulated is set for a machine-file backend.
	simulated *Machine
	// sim is the simulated MIG state of a machine-file backend.
	sim *simNode

	// gpusMu guards gpus, the per-GPU state of MIG operations (mig.go).
	// It is held only to look an entry up, never across an NVML call.
	gpusMu sync.Mutex
	gpus   map[string]*gpuState

	closeOnce sync.Once
}

// OpenReal loads libnvidia-ml.so.1 (or libraryPath when not empty) and
// initialises it. It fails on a node without the NVIDIA driver.
func OpenReal(libraryPath string) (*Library, error) {
	var opts []gonvml.LibraryOption
	if libraryPath != "" {
		opts = append(opts, gonvml.WithLibraryPath(libraryPath))
	}
	lib := gonvml.New(opts...)
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("initialise NVML: %w", nvmlError("nvmlInit", ret))
	}
	return &Library{lib: lib, pcieRoot: sysfsPCIeRoot}, nil
}

// sysfsPCIeRoot uses the upstream DRA helper, which reads /sys.
func sysfsPCIeRoot(busID string) (string, error) {
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID)
	if err != nil {
		return "", err
	}
	if attr.Value.StringValue == nil {
		return "", fmt.Errorf("no PCIe root for %s", busID)
	}
	return *attr.Value.StringValue, nil
}

// OpenMachine simulates the node described by a machine file.
func OpenMachine(path string, opts ...SimOption) (*Library, error) {
	m, err := LoadMachine(path)
	if err != nil {
		return nil, err
	}
	return OpenSimulated(m, opts...)
}

// OpenSimulated simulates a validated Machine on top of go-nvml's mock
// server, with MIG that behaves like the hardware's (see sim_mig.go). By
// default the simulated MIG state lives in memory; WithStateFile keeps it
// across processes.
func OpenSimulated(m *Machine, opts ...SimOption) (*Library, error) {
	var o simOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	cuda, _ := cudaVersionInt(m.CUDADriverVersion)
	configs := make([]gpus.Config, len(m.GPUs))
	for i, g := range m.GPUs {
		configs[i] = models[g.Model]
	}
	srv := server.NewServerWithGPUs(m.DriverVersion, "12."+m.DriverVersion, cuda, configs...)
	roots := map[string]string{}
	modelNames := make([]string, len(m.GPUs))
	for i, g := range m.GPUs {
		dev := srv.Devices[i].(*server.Device)
		simulateDevice(dev, g)
		roots[g.PCIBusID] = g.PCIeRoot
		modelNames[i] = g.Model
	}
	sim := newSimNode(srv, modelNames)
	if o.stateFile != "" {
		if err := sim.openStore(o.stateFile, m.Name); err != nil {
			return nil, err
		}
	}
	return &Library{
		lib: srv,
		pcieRoot: func(busID string) (string, error) {
			root, ok := roots[busID]
			if !ok {
				return "", fmt.Errorf("bus ID %s is not in machine %s", busID, m.Name)
			}
			return root, nil
		},
		simulated: m,
		sim:       sim,
	}, nil
}

// defaultUUID derives a stable UUID, so a restarted plugin on the same
// machine file sees the same GPUs (the mock would draw random ones).
func defaultUUID(machine string, index int) string {
	ns := uuid.MustParse("8f0e6c1a-6a52-4f43-9a5e-2f9a4b7f1d10")
	return "GPU-" + uuid.NewSHA1(ns, fmt.Appendf(nil, "%s/%d", machine, index)).String()
}

// simulateDevice fills in what go-nvml's mock leaves out or gets wrong for
// Facet's purposes: identity, PCI location, NUMA and the MIG mode at boot.
// MIG itself is newSimNode's.
func simulateDevice(dev *server.Device, g MachineGPU) {
	dev.UUID = g.UUID
	dev.PciBusID = g.PCIBusID
	if g.MIGEnabled {
		dev.MigMode = gonvml.DEVICE_MIG_ENABLE
	}
	dev.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
		var p gonvml.PciInfo
		p.PciDeviceId = dev.Config.PciDeviceId
		// NVML reports an 8-digit domain.
		id := "0000" + g.PCIBusID
		for i := 0; i < len(id) && i < len(p.BusId)-1; i++ {
			p.BusId[i] = int8(id[i])
		}
		fmt.Sscanf(g.PCIBusID, "%x:%x:%x", &p.Domain, &p.Bus, &p.Device)
		return p, gonvml.SUCCESS
	}
	// nvcdi asks every handle whether it is a MIG device.
	dev.IsMigDeviceHandleFunc = func() (bool, gonvml.Return) { return false, gonvml.SUCCESS }
	dev.GetNumaNodeIdFunc = func() (int, gonvml.Return) {
		if g.NUMANode == nil {
			return 0, gonvml.ERROR_NOT_SUPPORTED
		}
		return *g.NUMANode, gonvml.SUCCESS
	}
}

// Discover reads the node's driver and GPUs.
func (l *Library) Discover() (*Node, error) {
	return discover(l.lib, l.pcieRoot)
}

// Simulated reports whether this library is a machine-file simulation, and
// which machine.
func (l *Library) Simulated() (*Machine, bool) {
	return l.simulated, l.simulated != nil
}

// Close shuts NVML down. Safe to call more than once.
func (l *Library) Close() error {
	var err error
	l.closeOnce.Do(func() {
		err = nvmlError("nvmlShutdown", l.lib.Shutdown())
	})
	return err
}

// DiscoverMachine simulates the node of a machine file and discovers it,
// for tools and tests that want the node but not the library.
func DiscoverMachine(path string) (*Node, error) {
	m, err := LoadMachine(path)
	if err != nil {
		return nil, err
	}
	return DiscoverSimulated(m)
}

// DiscoverSimulated is DiscoverMachine for a Machine built in code.
func DiscoverSimulated(m *Machine) (*Node, error) {
	lib, err := OpenSimulated(m)
	if err != nil {
		return nil, err
	}
	defer lib.Close()
	return lib.Discover()
}
