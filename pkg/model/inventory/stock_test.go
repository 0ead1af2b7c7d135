package inventory

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

func cluster(version string, on ...features.Gate) *features.Set {
	s := features.Stock("test")
	for _, g := range on {
		s.Enabled[g] = true
	}
	s.ServerVersion = version
	return &s
}

// instance makes the MIG instance NVML would list for the p-th profile of
// gpu at its k-th placement.
func instance(gpu nvmlgpu.GPU, p, k, giID int) nvmlgpu.MIGInstance {
	prof := gpu.MIGProfiles[p]
	return nvmlgpu.MIGInstance{
		ParentUUID: gpu.UUID, ParentIndex: gpu.Index, Profile: prof.Name,
		GIProfileID: prof.GIProfileID, CIProfileID: prof.CIProfileID,
		Placement: prof.Placements[k], GIID: giID, CIID: 0, UUID: fmt.Sprintf("MIG-%d", giID),
	}
}

func TestModesOnTheCluster(t *testing.T) {
	node := discover(t, "H100-SXM5-80GB", "H100-SXM5-80GB", "L4")
	carved := []nvmlgpu.MIGInstance{instance(node.GPUs[1], 0, 0, 1)}
	stock := cluster("v1.35.4")
	gated135 := cluster("v1.35.4", features.PartitionableDevices, features.ConsumableCapacity)
	v137 := cluster("v1.37.2", features.PartitionableDevices, features.ConsumableCapacity)
	tests := []struct {
		name      string
		cfg       Config
		want      []Mode
		wantErr   []string
		wantNotes int
		// wantWarnings are substrings, one per expected warning.
		wantWarnings []string
	}{
		{name: "stock auto: exclusive, static-mig where instances exist", cfg: Config{Features: stock, MIGInstances: carved},
			want: []Mode{ModeExclusive, ModeStaticMIG, ModeExclusive}},
		{name: "gates on 1.35 auto: dynamic MIG does not scale before 1.37", cfg: Config{Features: gated135, MIGInstances: carved},
			want: []Mode{ModeExclusive, ModeStaticMIG, ModeExclusive}},
		{name: "1.37 auto: mig", cfg: Config{Features: v137, MIGInstances: carved},
			want: []Mode{ModeMIG, ModeStaticMIG, ModeExclusive}},
		{name: "no features given: every feature, current cluster", cfg: Config{},
			want: []Mode{ModeMIG, ModeMIG, ModeExclusive}},
		{name: "stock refuses mig", cfg: Config{Features: stock, DefaultMode: ModeMIG},
			wantErr: []string{"GPU 0", "mode mig needs the DRA feature gate DRAPartitionableDevices (test)", "--feature-gates=DRAPartitionableDevices=true", "static-mig or slots"}},
		{name: "stock refuses shared on one GPU", cfg: Config{Features: stock, PerGPU: map[int]Mode{2: ModeShared}},
			wantErr: []string{"GPU 2", "DRAConsumableCapacity"}},
		{name: "partitionable alone refuses dynamic", cfg: Config{Features: cluster("v1.35.4", features.PartitionableDevices), DefaultMode: ModeDynamic},
			wantErr: []string{"--feature-gates=DRAConsumableCapacity=true"}},
		{name: "stock takes static-mig and slots", cfg: Config{Features: stock, PerGPU: map[int]Mode{0: ModeSlots, 1: ModeStaticMIG, 2: ModeSlots}, MIGInstances: carved},
			want: []Mode{ModeSlots, ModeStaticMIG, ModeSlots}},
		// The allocator's known defects (AllocatorDefects), by version.
		{name: "gates on 1.35 refuse dynamic: the allocator double-books it", cfg: Config{Features: gated135, DefaultMode: ModeDynamic},
			wantErr: []string{"GPU 0", "mode dynamic is refused on Kubernetes v1.35.4", "kubernetes#139034", "fixed in Kubernetes 1.36.2",
				"safe on this cluster: exclusive, static-mig, slots, shared, mig"}},
		{name: "unknown version refuses dynamic", cfg: Config{Features: cluster("", features.PartitionableDevices, features.ConsumableCapacity), DefaultMode: ModeDynamic},
			wantErr: []string{"(version unknown)", "kubernetes#139034"}},
		{name: "dynamic on a GPU without MIG is shared, and meets no defect", cfg: Config{Features: gated135, PerGPU: map[int]Mode{2: ModeDynamic}},
			want: []Mode{ModeExclusive, ModeExclusive, ModeShared}, wantNotes: 1},
		{name: "1.36.2 takes dynamic with the rollback-leak warning", cfg: Config{Features: cluster("v1.36.2", features.PartitionableDevices, features.ConsumableCapacity), PerGPU: map[int]Mode{0: ModeDynamic, 1: ModeMIG}},
			want:         []Mode{ModeDynamic, ModeMIG, ModeExclusive},
			wantWarnings: []string{"mode dynamic on Kubernetes v1.36.2: the allocator keeps the counters", "mode mig on Kubernetes v1.36.2: the allocator keeps the counters"}},
		{name: "gates on 1.35 take mig with the rollback-leak warning", cfg: Config{Features: gated135, DefaultMode: ModeMIG},
			want: []Mode{ModeMIG, ModeMIG, ModeExclusive}, wantNotes: 1,
			wantWarnings: []string{"mode mig on Kubernetes v1.35.4: the allocator keeps the counters of a device it backtracks over, so a pod that fits"}},
		{name: "1.36.3 takes dynamic without a warning", cfg: Config{Features: cluster("v1.36.3", features.PartitionableDevices, features.ConsumableCapacity), DefaultMode: ModeDynamic},
			want: []Mode{ModeDynamic, ModeDynamic, ModeShared}, wantNotes: 1},
		// kubernetes#140433 is in every 1.36 allocator, but no mode meets it.
		{name: "1.36.6 takes dynamic without a warning", cfg: Config{Features: cluster("v1.36.6", features.PartitionableDevices, features.ConsumableCapacity), DefaultMode: ModeDynamic},
			want: []Mode{ModeDynamic, ModeDynamic, ModeShared}, wantNotes: 1},
		{name: "static-mig on a GPU without MIG falls back", cfg: Config{Features: stock, DefaultMode: ModeStaticMIG, MIGInstances: carved},
			want: []Mode{ModeStaticMIG, ModeStaticMIG, ModeExclusive}, wantNotes: 2}, // GPU 0 has no instance, GPU 2 no MIG
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := Build(node, tc.cfg)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, want %q", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, g := range inv.GPUs {
				if g.Mode != tc.want[i] {
					t.Errorf("GPU %d: mode %s (%s), want %s", i, g.Mode, g.ModeNote, tc.want[i])
				}
				if g.ModeNote == "" && g.ModeRequested == ModeAuto {
					t.Errorf("GPU %d: auto without a note", i)
				}
				if !slicesAllowed(g, tc.cfg.gates()) {
					t.Errorf("GPU %d: mode %s publishes what the cluster drops", i, g.Mode)
				}
			}
			if len(inv.Notes) != tc.wantNotes {
				t.Errorf("notes %q, want %d", inv.Notes, tc.wantNotes)
			}
			if len(inv.Warnings) != len(tc.wantWarnings) {
				t.Errorf("warnings %q, want %d", inv.Warnings, len(tc.wantWarnings))
			}
			for i, w := range tc.wantWarnings {
				if i < len(inv.Warnings) && !strings.Contains(inv.Warnings[i], w) {
					t.Errorf("warning %d: %q lacks %q", i, inv.Warnings[i], w)
				}
			}
		})
	}
}

// slicesAllowed checks the devices of a GPU use only fields the cluster
// keeps.
func slicesAllowed(g *GPU, gates features.Set) bool {
	for _, d := range g.Devices {
		if (len(d.Counters) > 0 || g.CounterSet != "") && !gates.Has(features.PartitionableDevices) {
			return false
		}
		if d.Shareable && !gates.Has(features.ConsumableCapacity) {
			return false
		}
	}
	return true
}

func TestStaticMIG(t *testing.T) {
	node := discover(t, "H100-SXM5-80GB")
	g := node.GPUs[0]
	noCI := instance(g, 0, 1, 2)
	noCI.CIID, noCI.CIProfileID, noCI.UUID = -1, -1, ""
	twoCIs := []nvmlgpu.MIGInstance{instance(g, 0, 2, 3), instance(g, 0, 2, 3)}
	twoCIs[1].CIID = 1
	var big int
	for i, p := range g.MIGProfiles {
		if p.Name == "3g.40gb" {
			big = i
		}
	}
	in := append([]nvmlgpu.MIGInstance{instance(g, big, 0, 1), instance(g, 0, 0, 5), noCI}, twoCIs...)
	// An instance of another GPU is not this GPU's.
	other := instance(g, 0, 3, 9)
	other.ParentUUID = "GPU-other"
	in = append(in, other)

	inv, err := Build(node, Config{Features: cluster("v1.35.4"), DefaultMode: ModeStaticMIG, MIGInstances: in})
	if err != nil {
		t.Fatal(err)
	}
	gpu := inv.GPUs[0]
	var got []string
	for _, d := range gpu.Devices {
		got = append(got, d.Name)
		if d.Kind != KindMIG || d.Instance == nil || len(d.Counters) > 0 {
			t.Errorf("%s: kind %s instance %v counters %v", d.Name, d.Kind, d.Instance, d.Counters)
		}
		if found, _ := inv.Device(d.Name); found != d {
			t.Errorf("%s: not found by name", d.Name)
		}
	}
	want := []string{"gpu-0-mig-1g10gb-" + fmt.Sprint(g.MIGProfiles[0].Placements[0].Start), "gpu-0-mig-3g40gb-0"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("devices %v, want %v (smallest profile first)", got, want)
	}
	if gpu.CounterSet != "" {
		t.Errorf("counter set %q in static-mig mode", gpu.CounterSet)
	}
	notes := strings.Join(inv.Notes, "\n")
	for _, w := range []string{"GI 2 CI -1", "has no compute instance", "GI 3 CI 0", "has 2 compute instances"} {
		if !strings.Contains(notes, w) {
			t.Errorf("notes lack %q:\n%s", w, notes)
		}
	}
}

func TestSlotLayouts(t *testing.T) {
	const gib = int64(1) << 30
	const h100 = 81559 << 20 // the simulated H100's memory, bytes
	tests := []struct {
		layout  string
		memory  uint64
		want    []Slot
		wantErr string
	}{
		{layout: "4", memory: 80 << 30, want: []Slot{{0, 20 * gib, 25}, {1, 20 * gib, 25}, {2, 20 * gib, 25}, {3, 20 * gib, 25}}},
		{layout: "4x20Gi/25", memory: 80 << 30, want: []Slot{{0, 20 * gib, 25}, {1, 20 * gib, 25}, {2, 20 * gib, 25}, {3, 20 * gib, 25}}},
		{layout: "1x40Gi/50+2x10Gi/10", memory: 80 << 30, want: []Slot{{0, 10 * gib, 10}, {1, 10 * gib, 10}, {2, 40 * gib, 50}}},
		{layout: "1x40Gi/50+2", memory: 80 << 30, want: []Slot{{0, 20 * gib, 25}, {1, 20 * gib, 25}, {2, 40 * gib, 50}}},
		{layout: "3", memory: h100, want: []Slot{{0, 27186 << 20, 33}, {1, 27186 << 20, 33}, {2, 27186 << 20, 33}}},
		{layout: "5x20Gi/10", memory: 80 << 30, wantErr: "takes more than the GPU has"},
		{layout: "2x10Gi/60", memory: 80 << 30, wantErr: "takes more than the GPU has"},
		{layout: "1x80Gi/100+1", memory: 80 << 30, wantErr: "leaves slots of 0 MiB"},
		// An MPS control daemon serves 48 clients per GPU.
		{layout: "48", memory: 80 << 30, want: slotsOf(48, 80<<30/48&^(1<<20-1), 2)},
		{layout: "49", memory: 80 << 30, wantErr: "has 49 slots; at most 48 fit on a GPU"},
		{layout: "40x1Gi/1+9", memory: 80 << 30, wantErr: "has 49 slots"},
		{layout: "4x20Gi", wantErr: "COUNTxMEMORY/PERCENT"},
		{layout: "4x20Gi/0", wantErr: "not a percentage"},
		{layout: "4xlots/5", wantErr: "not a positive quantity"},
		{layout: "-1", wantErr: "want COUNT"},
	}
	for _, tc := range tests {
		t.Run(tc.layout, func(t *testing.T) {
			l, err := ParseSlotLayout(tc.layout)
			var slots []Slot
			if err == nil {
				slots, err = l.Slots(tc.memory)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(slots) != fmt.Sprint(tc.want) {
				t.Errorf("slots %v, want %v", slots, tc.want)
			}
			if again, err := ParseSlotLayout(l.String()); err != nil || again.String() != l.String() {
				t.Errorf("%q does not round-trip: %q %v", l.String(), again, err)
			}
		})
	}
}

func TestSlotsMode(t *testing.T) {
	node := discover(t, "H100-SXM5-80GB", "L4")
	big := SlotLayout{{Count: 1, Memory: resource.MustParse("40Gi"), Cores: 50}, {Count: 2}}
	inv, err := Build(node, Config{Features: cluster("v1.35.4"), DefaultMode: ModeSlots, PerGPUSlots: map[int]SlotLayout{0: big}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range inv.GPUs {
		for _, d := range g.Devices {
			if d.Kind != KindSlot || d.Shareable || len(d.Counters) > 0 {
				t.Errorf("%s: kind %s shareable %v counters %v", d.Name, d.Kind, d.Shareable, d.Counters)
			}
			got = append(got, fmt.Sprintf("%s=%dMiB/%d", d.Name, d.Slot.MemoryBytes>>20, d.Slot.Cores))
		}
	}
	// The H100's usable 81079 MiB less the 40 GiB slot, halved; the L4's
	// usable 22898 MiB (23034 less its estimated 136 reserved) in quarters.
	want := "gpu-0-slot-0=20059MiB/25 gpu-0-slot-1=20059MiB/25 gpu-0-slot-2=40960MiB/50 " +
		"gpu-1-slot-0=5724MiB/25 gpu-1-slot-1=5724MiB/25 gpu-1-slot-2=5724MiB/25 gpu-1-slot-3=5724MiB/25"
	if strings.Join(got, " ") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, " "), want)
	}
}

// TestDefaultSlotsFitUsableMemory: the default four slots of a real card
// add up to no more than CUDA can give (the driver's reserved memory is not
// for slots): on the measured H100, 4 x 20269 MiB = 81076 of 81079 MiB.
func TestDefaultSlotsFitUsableMemory(t *testing.T) {
	for _, tc := range []struct {
		model   string
		slotMiB int64
	}{
		{"H100-SXM5-80GB", 20269}, // 81079 / 4
		{"H200-141GB", 35788},     // 143155 / 4
		{"L4", 5724},              // 22898 / 4
	} {
		node := discover(t, tc.model)
		inv, err := Build(node, Config{Features: cluster("v1.35.4"), DefaultMode: ModeSlots})
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		for _, d := range inv.GPUs[0].Devices {
			if d.Slot.MemoryBytes != tc.slotMiB<<20 {
				t.Errorf("%s: %s has %d MiB, want %d", tc.model, d.Name, d.Slot.MemoryBytes>>20, tc.slotMiB)
			}
			sum += d.Slot.MemoryBytes
		}
		if usable := int64(node.GPUs[0].MemoryBytes); sum > usable {
			t.Errorf("%s: slots take %d MiB of %d usable", tc.model, sum>>20, usable>>20)
		}
	}
}

func TestWithout(t *testing.T) {
	node := discover(t, "H100-SXM5-80GB", "L4", "L4")
	inv, err := Build(node, Config{})
	if err != nil {
		t.Fatal(err)
	}
	less := inv.Without(map[string]string{node.GPUs[1].UUID: "broken"})
	if len(less.GPUs) != 2 || less.GPUs[0].Index != 0 || less.GPUs[1].Index != 2 {
		t.Fatalf("GPUs %v", less.GPUs)
	}
	if _, ok := less.Device("gpu-1"); ok {
		t.Error("gpu-1 still found")
	}
	if _, ok := inv.Device("gpu-1"); !ok || len(inv.GPUs) != 3 {
		t.Error("the original inventory changed")
	}
	if inv.Without(nil) != inv {
		t.Error("nothing to leave out should return the inventory itself")
	}
}

// slotsOf is n slots of one size, indexed from 0.
func slotsOf(n int, memoryBytes, cores int64) []Slot {
	out := make([]Slot, n)
	for i := range out {
		out[i] = Slot{i, memoryBytes, cores}
	}
	return out
}
