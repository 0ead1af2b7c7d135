package nodemodel_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// failingLister stands for an NVML whose MIG listing fails.
type failingLister struct{ calls int }

func (f *failingLister) ListMIG() ([]nvmlgpu.MIGInstance, error) {
	f.calls++
	return nil, errors.New("boom")
}

func simulated(t *testing.T, migEnabled bool) *nvmlgpu.Library {
	t.Helper()
	m := &sim.Machine{Name: "n", DriverVersion: "580.159.04", CUDADriverVersion: "13.0"}
	for range 2 {
		m.GPUs = append(m.GPUs, sim.MachineGPU{Model: "H100-SXM5-80GB", MIGEnabled: migEnabled})
	}
	lib, err := sim.OpenSimulated(m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	return lib
}

func TestAssemblePreviewsLayouts(t *testing.T) {
	lib := simulated(t, true)
	_, inv, err := nodemodel.Assemble(lib, inventory.Config{DefaultMode: inventory.ModeStaticMIG}, map[int]string{1: "all-1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(inv.GPUs[0].Devices); n != 0 {
		t.Errorf("GPU 0 has %d devices, want none: no instances exist and none are previewed", n)
	}
	if n := len(inv.GPUs[1].Devices); n != 7 {
		t.Errorf("GPU 1 has %d devices, want the 7 of all-1g.10gb", n)
	}
}

func TestBuildNamesItsSteps(t *testing.T) {
	lib := simulated(t, true)
	node, err := nodemodel.Discover(lib)
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingLister{}
	if _, err := nodemodel.Build(node, inventory.Config{}, nodemodel.Options{MIG: fl}); err == nil || !strings.HasPrefix(err.Error(), "list MIG instances: ") {
		t.Errorf("err = %v, want the listing named", err)
	}
	if _, err := nodemodel.Build(node, inventory.Config{}, nodemodel.Options{Layouts: map[int]string{5: "all-1g.10gb", 2: "all-1g.10gb"}}); err == nil ||
		err.Error() != "--mig-layouts: GPU 2, but the node has GPUs 0-1" {
		t.Errorf("err = %v, want the first index the node lacks named", err)
	}
}

func TestBuildListsOnlyOnMIGCapableNodes(t *testing.T) {
	node := &nvmlgpu.Node{GPUs: []nvmlgpu.GPU{{Index: 0, UUID: "GPU-0"}}}
	fl := &failingLister{}
	if _, err := nodemodel.Build(node, inventory.Config{DefaultMode: inventory.ModeExclusive}, nodemodel.Options{MIG: fl}); err != nil {
		t.Fatal(err)
	}
	if fl.calls != 0 {
		t.Errorf("ListMIG called %d times on a node without MIG-capable GPUs", fl.calls)
	}
}
