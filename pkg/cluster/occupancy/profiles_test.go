package occupancy

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
)

// TestKnownProfilesMatchTheSimulator: the MIG tables compiled into
// KnownProfiles are those of the simulator's calibrated GPU models, every
// product and profile. On a mismatch it prints the table to paste.
func TestKnownProfilesMatchTheSimulator(t *testing.T) {
	m := &sim.Machine{Name: "profile-tables", DriverVersion: "580.159.04", CUDADriverVersion: "13.0"}
	for _, model := range sim.Models() {
		m.GPUs = append(m.GPUs, sim.MachineGPU{Model: model})
	}
	node, err := sim.DiscoverSimulated(m)
	if err != nil {
		t.Fatal(err)
	}
	want := tables{}
	for _, g := range node.GPUs {
		want.add(g)
	}
	if len(want) == 0 {
		t.Fatal("the simulator's models have no MIG profiles")
	}
	if !reflect.DeepEqual(knownTables, want) {
		t.Errorf("knownTables (profiles.go) differ from the simulator's models; want:\n%s", want.goSource())
	}
}

// add records a discovered GPU's MIG profiles under its product name.
func (t tables) add(g nvmlgpu.GPU) {
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
	t[resourceslices.Truncate(g.ProductName)] = byName
}

// goSource is the table as profiles.go spells knownProducts' entries.
func (t tables) goSource() string {
	var b strings.Builder
	products := make([]string, 0, len(t))
	for p := range t {
		products = append(products, p)
	}
	sort.Strings(products)
	for _, p := range products {
		names := make([]string, 0, len(t[p]))
		for n := range t[p] {
			names = append(names, n)
		}
		sort.Strings(names)
		var whole Profile
		profiles := make([]string, 0, len(names))
		for _, n := range names {
			whole = t[p][n]
			profiles = append(profiles, fmt.Sprintf("%s=%d", n, whole.MemorySlices))
		}
		fmt.Fprintf(&b, "\t%q: {%d, %d, %q},\n", p, whole.GPUMemorySlices, whole.GPUComputeSlices, strings.Join(profiles, " "))
	}
	return b.String()
}

// TestMalformedProductPanics: a product line that does not parse stops
// the program at start rather than drop a profile unseen.
func TestMalformedProductPanics(t *testing.T) {
	for _, line := range []string{"1g.10gb", "1g.10gb=x", "big.10gb=1", "1x.10gb=1"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%q: no panic", line)
				}
			}()
			parseProducts(map[string]product{"p": {8, 7, line}})
		}()
	}
}
