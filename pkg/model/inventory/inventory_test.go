package inventory

import (
	"fmt"
	resourceapi "k8s.io/api/resource/v1"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// MIGModels are the simulated MIG-capable models.
var MIGModels = []string{"A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIE-40GB", "A100-PCIE-80GB", "A30-PCIE-24GB", "H100-SXM5-80GB", "H200-141GB", "B200-180GB"}

// discover simulates a node of GPUs of the models, MIG mode off at boot.
func discover(t *testing.T, models ...string) *nvmlgpu.Node {
	t.Helper()
	var gpus []sim.MachineGPU
	for _, model := range models {
		gpus = append(gpus, sim.MachineGPU{Model: model})
	}
	return discoverGPUs(t, gpus...)
}

// discoverGPUs simulates a node of the GPUs as a machine file lists them.
func discoverGPUs(t *testing.T, gpus ...sim.MachineGPU) *nvmlgpu.Node {
	t.Helper()
	node, err := sim.DiscoverSimulated(&sim.Machine{Name: "inv-test", DriverVersion: "580.159.04", CUDADriverVersion: "13.0", GPUs: gpus})
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// discoverForMIG simulates one GPU of a MIG-capable model as an admin
// leaves it for MIG: MIG mode off on Hopper and later (Facet turns it on),
// on before Hopper, whose MIG mode Facet does not change
// (nvmlgpu.GPU.MIGModeFixed).
func discoverForMIG(t *testing.T, model string) *nvmlgpu.Node {
	t.Helper()
	node := discover(t, model)
	if node.GPUs[0].MIGModeFixed != "" {
		node = discoverGPUs(t, sim.MachineGPU{Model: model, MIGEnabled: true})
	}
	return node
}

// TestModes: each mode and its fallbacks on MIG-capable GPUs (Hopper,
// whose MIG mode Facet changes) and GPUs without MIG. Ampere GPUs, whose
// MIG mode Facet leaves as it is, are TestFixedMIGMode's.
func TestModes(t *testing.T) {
	node := discover(t, "H100-SXM5-80GB", "L4", "H200-141GB", "L4")
	for _, tc := range []struct {
		cfg       Config
		modes     []Mode
		notes     int
		shareable []bool
		counters  []bool
	}{
		{Config{}, []Mode{ModeMIG, ModeExclusive, ModeMIG, ModeExclusive}, 0, []bool{false, false, false, false}, []bool{true, false, true, false}},
		{Config{DefaultMode: ModeMIG}, []Mode{ModeMIG, ModeExclusive, ModeMIG, ModeExclusive}, 2, []bool{false, false, false, false}, []bool{true, false, true, false}},
		{Config{DefaultMode: ModeDynamic}, []Mode{ModeDynamic, ModeShared, ModeDynamic, ModeShared}, 2, []bool{true, true, true, true}, []bool{true, false, true, false}},
		{Config{DefaultMode: ModeShared}, []Mode{ModeShared, ModeShared, ModeShared, ModeShared}, 0, []bool{true, true, true, true}, []bool{false, false, false, false}},
		{Config{DefaultMode: ModeExclusive, PerGPU: map[int]Mode{2: ModeDynamic, 3: ModeMIG}}, []Mode{ModeExclusive, ModeExclusive, ModeDynamic, ModeExclusive}, 1, []bool{false, false, true, false}, []bool{false, false, true, false}},
	} {
		t.Run(fmt.Sprint(tc.cfg), func(t *testing.T) {
			inv, err := Build(node, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.Notes) != tc.notes {
				t.Errorf("notes %q, want %d", inv.Notes, tc.notes)
			}
			for i, g := range inv.GPUs {
				whole := g.Devices[0]
				if g.Mode != tc.modes[i] || whole.Shareable != tc.shareable[i] || (g.CounterSet != "") != tc.counters[i] {
					t.Errorf("GPU %d: mode %s shareable %v counters %q, want %s %v %v", i, g.Mode, whole.Shareable, g.CounterSet, tc.modes[i], tc.shareable[i], tc.counters[i])
				}
				if whole.Name != WholeGPUName(i) || whole.Kind != KindGPU {
					t.Errorf("GPU %d: first device %s %s", i, whole.Name, whole.Kind)
				}
				hasMIG := len(g.Devices) > 1
				if hasMIG != (g.Mode == ModeMIG || g.Mode == ModeDynamic) {
					t.Errorf("GPU %d in mode %s has %d devices", i, g.Mode, len(g.Devices))
				}
				if g.CounterSet != "" && !reflect.DeepEqual(whole.Counters, g.Counters) {
					t.Errorf("GPU %d: gpu-%d consumes %v, want all of %v", i, i, whole.Counters, g.Counters)
				}
				if g.Mode != g.ModeRequested && g.ModeNote == "" {
					t.Errorf("GPU %d: mode %s for requested %s without a note", i, g.Mode, g.ModeRequested)
				}
			}
			for _, n := range inv.Notes {
				if !strings.Contains(n, "has no MIG") {
					t.Errorf("note %q", n)
				}
			}
		})
	}
}

// TestMIGDevices checks every simulated MIG model: names are DNS labels
// that map back to their profile and placement, devices come in policy
// order, and each device consumes exactly its placement's memory slices
// (plus media-extensions for "+me"). From Hopper on, gpu-0 comes first and
// consumes every counter; before Hopper the GPU runs with MIG mode on
// (discoverForMIG), and mig mode publishes its MIG devices alone.
func TestMIGDevices(t *testing.T) {
	for _, model := range MIGModels {
		t.Run(model, func(t *testing.T) {
			node := discoverForMIG(t, model)
			inv, err := Build(node, Config{DefaultMode: ModeMIG})
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.Notes) > 0 {
				t.Fatalf("notes: %q", inv.Notes)
			}
			g := inv.GPUs[0]
			if g.Mode != ModeMIG {
				t.Fatalf("mode %s (%s)", g.Mode, g.ModeNote)
			}
			if len(g.Counters) > 32 {
				t.Errorf("%d counters", len(g.Counters))
			}
			migDevices := g.Devices
			_, hasWhole := inv.Device(WholeGPUName(0))
			if wantWhole := g.MIGModeFixed == ""; hasWhole != wantWhole {
				t.Fatalf("gpu-0 published: %v, want %v (MIGModeFixed %q, MIG mode on %v)", hasWhole, wantWhole, g.MIGModeFixed, g.MIGEnabled)
			}
			if hasWhole {
				whole := g.Devices[0]
				if whole.Name != WholeGPUName(0) || whole.Kind != KindGPU || !reflect.DeepEqual(whole.Counters, g.Counters) {
					t.Errorf("first device %s %s consumes %v, want gpu-0 consuming all of %v", whole.Name, whole.Kind, whole.Counters, g.Counters)
				}
				migDevices = g.Devices[1:]
			}
			if len(migDevices) == 0 {
				t.Fatal("no MIG devices")
			}
			t.Logf("%d MIG devices, counters %v", len(migDevices), g.Counters)
			var prev *Device
			for _, d := range migDevices {
				if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
					t.Errorf("%s: %v", d.Name, errs)
				}
				if got, ok := inv.Device(d.Name); !ok || got != d {
					t.Errorf("Device(%s) = %v %v", d.Name, got, ok)
				}
				if d.Kind != KindMIG || d.MIG == nil || d.Placement.Size == 0 {
					t.Fatalf("%s: %+v", d.Name, d)
				}
				label, _ := ProfileLabel(d.MIG.Name)
				if want := fmt.Sprintf("gpu-0-mig-%s-%d", label, d.Placement.Start); d.Name != want {
					t.Errorf("name %s, want %s", d.Name, want)
				}
				if len(d.Counters) == 0 {
					t.Errorf("%s consumes no counter", d.Name)
				}
				for _, c := range d.Counters {
					if !slices.Contains(g.Counters, c) {
						t.Errorf("%s consumes %s, which the set lacks", d.Name, c)
					}
				}
				if prev != nil {
					if prev.MIG.Name == d.MIG.Name && prev.Placement.Start <= d.Placement.Start {
						t.Errorf("%s before %s: placements must go from the end of the GPU", prev.Name, d.Name)
					}
					if prev.MIG.Name != d.MIG.Name && prev.MIG.MemoryBytes > d.MIG.MemoryBytes {
						t.Errorf("%s before %s: smaller profiles first", prev.Name, d.Name)
					}
				}
				prev = d
			}
			// Pairwise exactness: two MIG devices share a counter (each
			// of value 1) exactly when the hardware refuses the pair.
			for _, a := range migDevices {
				for _, b := range migDevices {
					overlap := a.Placement.Start < b.Placement.Start+b.Placement.Size && b.Placement.Start < a.Placement.Start+a.Placement.Size
					bothME := IsMediaExtensions(a.MIG.Name) && IsMediaExtensions(b.MIG.Name)
					share := false
					for _, c := range a.Counters {
						share = share || slices.Contains(b.Counters, c)
					}
					if share != (overlap || bothME) {
						t.Errorf("%s and %s: share a counter %v, overlap %v, both +me %v", a.Name, b.Name, share, overlap, bothME)
					}
				}
			}
		})
	}
}

func TestProfileLabel(t *testing.T) {
	for in, want := range map[string]string{
		"1g.10gb":        "1g10gb",
		"1g.10gb+me":     "1g10gb-me",
		"7g.141gb":       "7g141gb",
		"1g.23gb+me.all": "1g23gb-meall",
		"1g.23gb-me":     "1g23gb-nome",
		"1g.24gb+gfx":    "1g24gb-gfx",
	} {
		got, err := ProfileLabel(in)
		if err != nil || got != want {
			t.Errorf("ProfileLabel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "1g 10gb", "1g.10gb+", "1g_10gb"} {
		if got, err := ProfileLabel(bad); err == nil {
			t.Errorf("ProfileLabel(%q) = %q, want an error", bad, got)
		}
	}
}

// TestMIGModelRefusesWhatItCannotEncode: a table where engines or compute
// would bind beyond memory slices makes the GPU fall back, with a note: to
// the mode without MIG, or, on a GPU whose MIG mode stays on (an A100 with
// MIG mode on, where dynamic is mig), to static-mig, as the whole GPU
// cannot be served either.
func TestMIGModelRefusesWhatItCannotEncode(t *testing.T) {
	for _, tc := range []struct {
		gpu     sim.MachineGPU
		profile string
		// decoders makes 7 instances of the profile need more decoders
		// than the GPU has.
		decoders int
		// carved gives the GPU one MIG instance, which static-mig
		// publishes.
		carved  bool
		mode    Mode
		devices int
	}{
		{sim.MachineGPU{Model: "H100-SXM5-80GB"}, "1g.10gb", 2, false, ModeShared, 1},                    // 7 × 2 of 7 decoders
		{sim.MachineGPU{Model: "A100-SXM4-40GB", MIGEnabled: true}, "1g.5gb", 1, true, ModeStaticMIG, 1}, // 7 × 1 of 5
	} {
		t.Run(tc.gpu.Model, func(t *testing.T) {
			node := discoverGPUs(t, tc.gpu)
			g := &node.GPUs[0]
			for i := range g.MIGProfiles {
				if g.MIGProfiles[i].Name == tc.profile {
					g.MIGProfiles[i].Decoders = tc.decoders
				}
			}
			if _, err := NewMIGModel(g.MIGProfiles); err == nil || !strings.Contains(err.Error(), "decoders") {
				t.Fatalf("NewMIGModel: %v, want a decoder error", err)
			}
			cfg := Config{DefaultMode: ModeDynamic}
			if tc.carved {
				cfg.MIGInstances = []nvmlgpu.MIGInstance{instance(*g, 0, 0, 1)}
			}
			inv, err := Build(node, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if gpu := inv.GPUs[0]; gpu.Mode != tc.mode || len(inv.Notes) != 1 || len(gpu.Devices) != tc.devices ||
				!strings.Contains(inv.Notes[0], "decoders") || !strings.Contains(inv.Notes[0], "using "+string(tc.mode)) {
				t.Fatalf("mode %s, notes %q, %d devices; want %s with a note naming the decoders, %d devices", gpu.Mode, inv.Notes, len(gpu.Devices), tc.mode, tc.devices)
			}
			t.Log(inv.Notes[0])
		})
	}
}

func TestMaxDisjoint(t *testing.T) {
	p := func(name string, slices int, pls ...nvmlgpu.Placement) nvmlgpu.MIGProfile {
		return nvmlgpu.MIGProfile{Name: name, SliceCount: slices, Placements: pls}
	}
	profiles := []nvmlgpu.MIGProfile{
		p("1g", 1, nvmlgpu.Placement{Start: 0, Size: 1}, nvmlgpu.Placement{Start: 1, Size: 1}, nvmlgpu.Placement{Start: 2, Size: 1}),
		p("1g+me", 5, nvmlgpu.Placement{Start: 0, Size: 1}, nvmlgpu.Placement{Start: 2, Size: 1}),
		p("2g", 3, nvmlgpu.Placement{Start: 0, Size: 2}),
	}
	weight := func(p nvmlgpu.MIGProfile) int { return p.SliceCount }
	// Best: 2g at 0-1 (3) + 1g+me at 2 (5) = 8; two +me would be 11.
	if got := maxDisjoint(profiles, weight); got != 8 {
		t.Errorf("maxDisjoint = %d, want 8", got)
	}
}

func TestBuildErrors(t *testing.T) {
	node := discover(t, "L4")
	for _, cfg := range []Config{
		{PerGPU: map[int]Mode{1: ModeMIG}},
		{DefaultMode: "turbo"},
		{Order: "random"},
	} {
		if _, err := Build(node, cfg); err == nil {
			t.Errorf("Build(%+v) succeeded", cfg)
		}
	}
}

// TestMaxDevicesPerSliceCounters pins Facet's copy of the limit to the
// k8s.io/api it is built with (v0.35 here).
func TestMaxDevicesPerSliceCounters(t *testing.T) {
	if MaxDevicesPerSliceCounters != resourceapi.ResourceSliceMaxDevicesWithTaintsOrConsumesCounters {
		t.Errorf("MaxDevicesPerSliceCounters %d, k8s.io/api says %d", MaxDevicesPerSliceCounters, resourceapi.ResourceSliceMaxDevicesWithTaintsOrConsumesCounters)
	}
}

// TestMPSReserve: the MPS server's memory is kept out of what shares and
// slots publish, and only theirs; a slot layout that no longer fits says
// why.
func TestMPSReserve(t *testing.T) {
	const mib = 1 << 20
	node := discover(t, "H100-SXM5-80GB")
	whole := int64(node.GPUs[0].MemoryBytes)
	four, err := ParseSlotLayout("4")
	if err != nil {
		t.Fatal(err)
	}
	full, err := ParseSlotLayout("4x20269Mi/25")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		mode      Mode
		slots     SlotLayout
		reserve   int64
		wantShare int64
		wantSlot  int64
		wantErr   string
	}{
		{name: "exclusive: nothing kept out", mode: ModeExclusive, reserve: 66 * mib, wantShare: whole},
		{name: "shared without MPS", mode: ModeShared, wantShare: whole},
		{name: "shared under MPS", mode: ModeShared, reserve: 66 * mib, wantShare: whole - 66*mib},
		{name: "dynamic under MPS", mode: ModeDynamic, reserve: 66 * mib, wantShare: whole - 66*mib},
		{name: "equal slots under MPS", mode: ModeSlots, slots: four, reserve: 66 * mib, wantShare: whole - 66*mib, wantSlot: (whole - 66*mib) / 4 &^ (mib - 1)},
		{name: "slots that filled the GPU no longer fit", mode: ModeSlots, slots: full, reserve: 66 * mib, wantErr: "less the MPS server's 66 MiB"},
		{name: "a reserve of a part of a MiB", mode: ModeShared, reserve: 66*mib + 1, wantErr: "want whole MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := Build(node, Config{DefaultMode: tc.mode, DefaultSlots: tc.slots, MPSReserveBytes: tc.reserve})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			g := inv.GPUs[0]
			if g.ShareMemoryBytes != tc.wantShare {
				t.Errorf("ShareMemoryBytes %d MiB, want %d MiB", g.ShareMemoryBytes/mib, tc.wantShare/mib)
			}
			if tc.wantSlot != 0 && g.Devices[0].Slot.MemoryBytes != tc.wantSlot {
				t.Errorf("slot %d MiB, want %d MiB", g.Devices[0].Slot.MemoryBytes/mib, tc.wantSlot/mib)
			}
		})
	}
}
