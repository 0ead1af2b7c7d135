package occupancy

import (
	"fmt"
	"strconv"
	"strings"
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

// KnownProfiles are the MIG tables of the GPUs Facet knows (pkg/model/nvmlgpu's
// models: A100, A30, H100, H100 NVL, H200, B200), keyed by the product name NVML
// reports and Facet publishes in `productName`. A GPU of another product
// gets no memory-slice bar; everything else about it is still shown.
//
// They are data, not computed at run time by the simulator, so that the
// daemons that read them (facet-preemptor, through pkg/cluster/fit) link no test
// support. TestKnownProfilesMatchTheSimulator checks them against the
// simulated GPUs' MIG profiles (internal/nvml/sim, calibrated to NVIDIA's
// "Multi-Instance GPU User Guide", Supported MIG Profiles, and to the H100
// and H200 measured in shared/hardware/), and prints the table to paste
// when a model changes.
func KnownProfiles() ProfileTable { return knownTables }

// knownTables are knownProducts, parsed once.
var knownTables = parseProducts(knownProducts)

// product is a GPU product's MIG table, in a line: the whole GPU's memory
// and compute slices, and its profiles as "name=memory slices" (those a
// placement spans), separated by spaces. A profile's compute slices are
// its name's "<n>g". One line a product, so that the table reads as the
// data it is and products with the same table show as the same line.
type product struct {
	memory, compute int
	profiles        string
}

var knownProducts = map[string]product{
	"NVIDIA A100-PCIE-40GB": {8, 7, "1g.10gb=2 1g.5gb=1 1g.5gb+me=1 2g.10gb=2 3g.20gb=4 4g.20gb=4 7g.40gb=8"},
	"NVIDIA A100-PCIE-80GB": {8, 7, "1g.10gb=1 1g.10gb+me=1 1g.20gb=2 2g.20gb=2 3g.40gb=4 4g.40gb=4 7g.80gb=8"},
	"NVIDIA A100-SXM4-40GB": {8, 7, "1g.10gb=2 1g.5gb=1 1g.5gb+me=1 2g.10gb=2 3g.20gb=4 4g.20gb=4 7g.40gb=8"},
	"NVIDIA A100-SXM4-80GB": {8, 7, "1g.10gb=1 1g.10gb+me=1 1g.20gb=2 2g.20gb=2 3g.40gb=4 4g.40gb=4 7g.80gb=8"},
	"NVIDIA A30-PCIE-24GB":  {4, 4, "1g.6gb=1 1g.6gb+me=1 2g.12gb=2 2g.12gb+me=2 4g.24gb=4"},
	"NVIDIA B200":           {8, 7, "1g.23gb=1 1g.23gb+me=1 1g.45gb=2 2g.45gb=2 3g.90gb=4 4g.90gb=4 7g.180gb=8"},
	"NVIDIA H100 80GB HBM3": {8, 7, "1g.10gb=1 1g.10gb+me=1 1g.20gb=2 2g.20gb=2 3g.40gb=4 4g.40gb=4 7g.80gb=8"},
	"NVIDIA H100 NVL":       {8, 7, "1g.12gb=1 1g.12gb+me=1 1g.24gb=2 2g.24gb=2 3g.47gb=4 4g.47gb=4 7g.94gb=8"},
	"NVIDIA H200":           {8, 7, "1g.18gb=1 1g.18gb+me=1 1g.35gb=2 2g.35gb=2 3g.71gb=4 4g.71gb=4 7g.141gb=8"},
}

// parseProducts turns products into tables. The products are compiled in
// and TestKnownProfilesMatchTheSimulator reads every one, so a malformed
// entry is a programming error: it panics.
func parseProducts(products map[string]product) tables {
	t := tables{}
	for name, p := range products {
		byName := map[string]Profile{}
		for _, f := range strings.Fields(p.profiles) {
			profile, mem, ok := strings.Cut(f, "=")
			compute, _, gOK := strings.Cut(profile, "g.")
			m, mErr := strconv.Atoi(mem)
			c, cErr := strconv.Atoi(compute)
			if !ok || !gOK || mErr != nil || cErr != nil {
				panic(fmt.Sprintf("occupancy: MIG table of %q: %q is not <n>g.<memory>=<memory slices>", name, f))
			}
			byName[profile] = Profile{MemorySlices: m, ComputeSlices: c, GPUMemorySlices: p.memory, GPUComputeSlices: p.compute}
		}
		t[name] = byName
	}
	return t
}
