package occupancy

import (
	"sync"

	"github.com/facet-gpu/facet/pkg/nvml"
	"github.com/facet-gpu/facet/pkg/nvml/sim"
)

// Profile is what the occupancy picture needs of a MIG profile and that
// ResourceSlices do not carry: how many memory slices a placement spans,
// and the profile's share of the GPU's compute slices.
type Profile struct {
	// MemorySlices a placement of the profile spans.
	MemorySlices int
	// ComputeSlices of the profile ("3g" = 3).
	ComputeSlices int
	// GPUMemorySlices and GPUComputeSlices are the whole GPU's.
	GPUMemorySlices, GPUComputeSlices int
}

// ProfileTable finds a MIG profile of a GPU product. Slices publish a MIG
// device's placementStart and memory, but not the size of its placement:
// that comes from NVIDIA's MIG tables for the product.
type ProfileTable interface {
	Lookup(product, profile string) (Profile, bool)
}

// tables maps a product name to its profiles by name.
type tables map[string]map[string]Profile

func (t tables) Lookup(product, profile string) (Profile, bool) {
	p, ok := t[product][profile]
	return p, ok
}

var (
	knownOnce sync.Once
	known     tables
)

// KnownProfiles are the MIG tables of the GPUs Facet knows (pkg/nvml's
// models: A100, A30, H100, H200, B200), keyed by the product name NVML
// reports and Facet publishes in `productName`. A GPU of another product
// gets no memory-slice bar; everything else about it is still shown.
func KnownProfiles() ProfileTable {
	knownOnce.Do(func() {
		known = tables{}
		m := &sim.Machine{Name: "profile-tables", DriverVersion: "580.159.04", CUDADriverVersion: "13.0"}
		for _, model := range sim.Models() {
			m.GPUs = append(m.GPUs, sim.MachineGPU{Model: model})
		}
		node, err := sim.DiscoverSimulated(m)
		if err != nil {
			// The models are compiled in; discovery of them cannot fail
			// unless pkg/nvml is broken, which its own tests catch.
			return
		}
		for _, g := range node.GPUs {
			known.add(g)
		}
	})
	return known
}

// add records a discovered GPU's MIG profiles under its product name.
func (t tables) add(g nvml.GPU) {
	if len(g.MIGProfiles) == 0 {
		return
	}
	var mem, compute int
	for _, p := range g.MIGProfiles {
		compute = max(compute, p.SliceCount)
		for _, pl := range p.Placements {
			mem = max(mem, pl.Start+pl.Size)
		}
	}
	byName := map[string]Profile{}
	for _, p := range g.MIGProfiles {
		byName[p.Name] = Profile{MemorySlices: p.MemorySlices, ComputeSlices: p.SliceCount, GPUMemorySlices: mem, GPUComputeSlices: compute}
	}
	t[truncate(g.ProductName)] = byName
}

// truncate is what pkg/slices does to a productName longer than the API
// allows.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}
