package sim

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

func machinePath(name string) string {
	return filepath.Join("..", "..", "..", "demo", "machines", name+".yaml")
}

// discoverMachine opens the demo machine file called name, as the plugin's
// --machine does, and discovers its node; the library closes when t ends.
func discoverMachine(t testing.TB, name string, opts ...Option) (*nvmlgpu.Library, *nvmlgpu.Node) {
	t.Helper()
	lib, err := OpenMachine(machinePath(name), opts...)
	return lib, discovered(t, lib, err)
}

// discoverSimulated serves m on a simulated NVML and discovers its node;
// the library closes when t ends.
func discoverSimulated(t testing.TB, m *Machine) (*server.Server, *nvmlgpu.Node) {
	t.Helper()
	lib, srv, err := openSimulated(m)
	return srv, discovered(t, lib, err)
}

// discovered fails t on the error of opening lib, else closes lib when t
// ends and returns the node it discovers.
func discovered(t testing.TB, lib *nvmlgpu.Library, openErr error) *nvmlgpu.Node {
	t.Helper()
	if openErr != nil {
		t.Fatal(openErr)
	}
	t.Cleanup(func() { lib.Close() })
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	return node
}

func TestDiscoverMachineFiles(t *testing.T) {
	for _, tc := range []struct {
		machine      string
		gpus         int
		product      string
		arch         string
		cc           string
		memoryMiB    uint64 // usable: total less reserved
		totalMiB     uint64
		migCapable   bool
		smallestMIG  string
		largestMIG   string
		profileCount int
	}{
		{"dgx-a100-40gb", 8, "NVIDIA A100-SXM4-40GB", "ampere", "8.0", 40960 - 241, 40960, true, "1g.5gb", "7g.40gb", 6},
		{"dgx-a100-80gb", 8, "NVIDIA A100-SXM4-80GB", "ampere", "8.0", 81920 - 482, 81920, true, "1g.10gb", "7g.80gb", 6},
		{"dgx-h100", 8, "NVIDIA H100 80GB HBM3", "hopper", "9.0", 81079, 81559, true, "1g.10gb", "7g.80gb", 6},
		{"dgx-h200", 8, "NVIDIA H200", "hopper", "9.0", 143155, 143771, true, "1g.18gb", "7g.141gb", 6},
		{"l4x4", 4, "NVIDIA L4", "ada", "8.9", 23034 - 136, 23034, false, "", "", 0},
	} {
		t.Run(tc.machine, func(t *testing.T) {
			_, node := discoverMachine(t, tc.machine)
			if node.DriverVersion != "580.159.04" || node.CUDADriverVersion != "13.0" {
				t.Errorf("driver %q cuda %q", node.DriverVersion, node.CUDADriverVersion)
			}
			if len(node.GPUs) != tc.gpus {
				t.Fatalf("got %d GPUs, want %d", len(node.GPUs), tc.gpus)
			}
			uuids := map[string]bool{}
			for i, g := range node.GPUs {
				if g.Index != i || g.Minor != i {
					t.Errorf("GPU %d: index %d minor %d", i, g.Index, g.Minor)
				}
				if g.ProductName != tc.product || g.Architecture != tc.arch || g.CUDAComputeCapability != tc.cc {
					t.Errorf("GPU %d: %q %q %q", i, g.ProductName, g.Architecture, g.CUDAComputeCapability)
				}
				if g.MemoryBytes != tc.memoryMiB<<20 || g.TotalMemoryBytes != tc.totalMiB<<20 || g.MemorySource != nvmlgpu.MemorySourceV2 {
					t.Errorf("GPU %d: memory %d bytes of %d (%s), want %d MiB of %d from memory info v2",
						i, g.MemoryBytes, g.TotalMemoryBytes, g.MemorySource, tc.memoryMiB, tc.totalMiB)
				}
				if !strings.HasPrefix(g.PCIeRoot, "pci0000:") || !busIDPattern.MatchString(g.PCIBusID) {
					t.Errorf("GPU %d: bus %q root %q", i, g.PCIBusID, g.PCIeRoot)
				}
				if g.NUMANode != i*2/tc.gpus {
					t.Errorf("GPU %d: NUMA %d", i, g.NUMANode)
				}
				if g.MIGCapable != tc.migCapable {
					t.Errorf("GPU %d: migCapable %v", i, g.MIGCapable)
				}
				if uuids[g.UUID] {
					t.Errorf("GPU %d: duplicate UUID %s", i, g.UUID)
				}
				uuids[g.UUID] = true
				if len(g.MIGProfiles) < tc.profileCount {
					t.Errorf("GPU %d: %d MIG profiles, want at least %d", i, len(g.MIGProfiles), tc.profileCount)
				}
				if tc.migCapable {
					if got := g.MIGProfiles[0].Name; got != tc.smallestMIG {
						t.Errorf("GPU %d: smallest profile %q, want %q", i, got, tc.smallestMIG)
					}
					if got := g.MIGProfiles[len(g.MIGProfiles)-1].Name; got != tc.largestMIG {
						t.Errorf("GPU %d: largest profile %q, want %q", i, got, tc.largestMIG)
					}
				}
			}
		})
	}
}

func TestUUIDsStableAcrossOpens(t *testing.T) {
	a, err := OpenMachine(machinePath("dgx-h100"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenMachine(machinePath("dgx-h100"))
	if err != nil {
		t.Fatal(err)
	}
	na, _ := a.Discover()
	nb, _ := b.Discover()
	for i := range na.GPUs {
		if na.GPUs[i].UUID != nb.GPUs[i].UUID {
			t.Fatalf("GPU %d UUID changed between opens: %s vs %s", i, na.GPUs[i].UUID, nb.GPUs[i].UUID)
		}
	}
}

func TestMachineValidation(t *testing.T) {
	noNUMA, bad := -1, -2
	good := func() Machine {
		return Machine{Name: "m", DriverVersion: "580.159.04", CUDADriverVersion: "13.0",
			GPUs: []MachineGPU{{Model: "L4"}, {Model: "H100-SXM5-80GB"}}}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Machine)
		want   string
	}{
		{"ok", func(*Machine) {}, ""},
		{"no name", func(m *Machine) { m.Name = "" }, "name: required"},
		{"bad driver", func(m *Machine) { m.DriverVersion = "x" }, "driverVersion"},
		{"bad cuda", func(m *Machine) { m.CUDADriverVersion = "12" }, "cudaDriverVersion"},
		{"no gpus", func(m *Machine) { m.GPUs = nil }, "gpus: at least one"},
		{"unknown model", func(m *Machine) { m.GPUs[1].Model = "Z9" }, `gpus[1].model: unknown model "Z9"`},
		{"mig on L4", func(m *Machine) { m.GPUs[0].MIGEnabled = true }, "gpus[0].migEnabled"},
		{"bad bus", func(m *Machine) { m.GPUs[0].PCIBusID = "00:01.0" }, "gpus[0].pciBusID"},
		{"dup bus", func(m *Machine) { m.GPUs[0].PCIBusID = "0000:02:00.0" }, "gpus[1].pciBusID: 0000:02:00.0 already used by gpus[0]"},
		{"bad root", func(m *Machine) { m.GPUs[1].PCIeRoot = "root" }, "gpus[1].pcieRoot"},
		{"numa -1: none, as on a VM", func(m *Machine) { m.GPUs[1].NUMANode = &noNUMA }, ""},
		{"numa below -1", func(m *Machine) { m.GPUs[1].NUMANode = &bad }, "gpus[1].numaNode: -2 is not a NUMA node"},
		{"dup uuid", func(m *Machine) { m.GPUs[0].UUID = "GPU-a"; m.GPUs[1].UUID = "GPU-a" }, "gpus[1].uuid"},
		{"bad uuid", func(m *Machine) { m.GPUs[0].UUID = "x" }, "gpus[0].uuid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := good()
			tc.mutate(&m)
			err := m.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestSimulatedNUMA: the machine file's numaNode reaches discovery through
// the simulated sysfs (numa_node), -1 where the file gives none or -1, and
// NVML's own NUMA query answers "Not Supported", as on the measured H100.
func TestSimulatedNUMA(t *testing.T) {
	zero, one, none := 0, 1, -1
	m := &Machine{Name: "numa", DriverVersion: "550.54.15", CUDADriverVersion: "12.4", GPUs: []MachineGPU{
		{Model: "L4", NUMANode: &one},
		{Model: "L4", NUMANode: &zero},
		{Model: "L4"},
		{Model: "L4", NUMANode: &none},
	}}
	srv, node := discoverSimulated(t, m)
	for i, want := range []int{1, 0, -1, -1} {
		if got := node.GPUs[i].NUMANode; got != want {
			t.Errorf("GPU %d: NUMA node %d, want %d", i, got, want)
		}
		if _, ret := srv.Devices[i].GetNumaNodeId(); ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("GPU %d: nvmlDeviceGetNumaNodeId returned %v, want Not Supported", i, ret)
		}
	}
}
