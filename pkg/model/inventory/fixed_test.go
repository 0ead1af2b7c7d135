package inventory

import (
	"strings"
	"testing"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// TestFixedMIGMode: on a GPU whose MIG mode Facet does not change
// (nvmlgpu.GPU.MIGModeFixed: before Hopper, or a vGPU guest), each mode is
// narrowed to what the GPU serves in the MIG mode it is in, with a note
// naming the reason, as NVIDIA's DRA driver does; auto picks from what
// the GPU serves without one. Hopper is unchanged.
func TestFixedMIGMode(t *testing.T) {
	a100Off := sim.MachineGPU{Model: "A100-SXM4-80GB"}
	a30On := sim.MachineGPU{Model: "A30-PCIE-24GB", MIGEnabled: true}
	h100Guest := sim.MachineGPU{Model: "H100-SXM5-80GB", VGPUGuest: true}
	h100GuestOn := sim.MachineGPU{Model: "H100-SXM5-80GB", VGPUGuest: true, MIGEnabled: true}
	h100Off := sim.MachineGPU{Model: "H100-SXM5-80GB"}
	h100On := sim.MachineGPU{Model: "H100-SXM5-80GB", MIGEnabled: true}
	stock := cluster("v1.35.4")
	const (
		reset = "applies a MIG mode change only after a GPU reset"
		vgpu  = "vGPU in a virtual machine"
	)
	for _, tc := range []struct {
		name string
		gpu  sim.MachineGPU
		mode Mode
		// features is the cluster's; nil: every gate on, 1.37.
		features *features.Set
		// carved gives the GPU one MIG instance (its smallest profile at
		// its first placement).
		carved bool

		want Mode
		// whole: gpu-0 is published (first); migDevices: how many MIG
		// devices are, -1 for some.
		whole      bool
		shareable  bool
		migDevices int
		// notes are substrings of the one fallback note; none: no note.
		notes []string
		// extraNotes counts notes beside it (static-mig's "no MIG
		// instance to publish").
		extraNotes int
		// modeNote is a substring of GPU.ModeNote where there is no note.
		modeNote string
	}{
		// Ampere, MIG mode off: no MIG.
		{name: "A100 MIG off: mig is exclusive", gpu: a100Off, mode: ModeMIG, want: ModeExclusive, whole: true,
			notes: []string{"mode mig: MIG mode is off and stays so", reset, "using exclusive"}},
		{name: "A100 MIG off: dynamic is shared", gpu: a100Off, mode: ModeDynamic, want: ModeShared, whole: true, shareable: true,
			notes: []string{"mode dynamic: MIG mode is off and stays so", reset, "using shared"}},
		{name: "A100 MIG off: exclusive", gpu: a100Off, mode: ModeExclusive, want: ModeExclusive, whole: true},
		{name: "A100 MIG off: shared", gpu: a100Off, mode: ModeShared, want: ModeShared, whole: true, shareable: true},
		{name: "A100 MIG off: auto is exclusive, without a note", gpu: a100Off, mode: ModeAuto, want: ModeExclusive, whole: true,
			modeNote: "auto: exclusive, because its MIG mode is off and its MIG mode is not Facet's to change"},

		// Ampere, MIG mode on: MIG only, never the whole GPU.
		{name: "A30 MIG on: mig without gpu-0", gpu: a30On, mode: ModeMIG, want: ModeMIG, migDevices: -1},
		{name: "A30 MIG on: dynamic is mig", gpu: a30On, mode: ModeDynamic, want: ModeMIG, migDevices: -1,
			notes: []string{"mode dynamic: MIG mode is on and stays so", reset, "using mig without the whole GPU"}},
		{name: "A30 MIG on: exclusive is static-mig", gpu: a30On, mode: ModeExclusive, carved: true, want: ModeStaticMIG, migDevices: 1,
			notes: []string{"mode exclusive: MIG mode is on and stays so", reset, "using static-mig"}},
		{name: "A30 MIG on: shared is static-mig", gpu: a30On, mode: ModeShared, carved: true, want: ModeStaticMIG, migDevices: 1,
			notes: []string{"mode shared: MIG mode is on and stays so", "using static-mig"}},
		{name: "A30 MIG on: slots is static-mig", gpu: a30On, mode: ModeSlots, features: stock, carved: true, want: ModeStaticMIG, migDevices: 1,
			notes: []string{"mode slots: MIG mode is on and stays so", "using static-mig"}},
		{name: "A30 MIG on, no instances: exclusive publishes nothing", gpu: a30On, mode: ModeExclusive, want: ModeStaticMIG,
			notes: []string{"mode exclusive: MIG mode is on and stays so", "using static-mig"}, extraNotes: 1},
		{name: "A30 MIG on: static-mig", gpu: a30On, mode: ModeStaticMIG, features: stock, carved: true, want: ModeStaticMIG, migDevices: 1},
		{name: "A30 MIG on: auto on 1.37 is mig", gpu: a30On, mode: ModeAuto, want: ModeMIG, migDevices: -1, modeNote: "auto: mig"},
		{name: "A30 MIG on: auto with instances is static-mig", gpu: a30On, mode: ModeAuto, features: stock, carved: true, want: ModeStaticMIG, migDevices: 1,
			modeNote: "auto: static-mig"},
		{name: "A30 MIG on: auto on stock is static-mig, with a note", gpu: a30On, mode: ModeAuto, features: stock, want: ModeStaticMIG,
			notes: []string{"auto (exclusive): MIG mode is on and stays so", "using static-mig"}, extraNotes: 1},

		// A vGPU guest: no MIG, whatever its MIG mode.
		{name: "H100 vGPU guest: mig is exclusive", gpu: h100Guest, mode: ModeMIG, want: ModeExclusive, whole: true,
			notes: []string{"mode mig: MIG mode is off and stays so", vgpu, "using exclusive"}},
		{name: "H100 vGPU guest: dynamic is shared", gpu: h100Guest, mode: ModeDynamic, want: ModeShared, whole: true, shareable: true,
			notes: []string{vgpu, "using shared"}},
		{name: "H100 vGPU guest: auto is exclusive, without a note", gpu: h100Guest, mode: ModeAuto, want: ModeExclusive, whole: true,
			modeNote: "auto: exclusive, because it cannot create MIG instances"},
		{name: "H100 vGPU guest, MIG on: mig is exclusive", gpu: h100GuestOn, mode: ModeMIG, want: ModeExclusive, whole: true,
			notes: []string{"mode mig: MIG mode is on and stays so", vgpu, "using exclusive"}},

		// Hopper: Facet changes MIG mode, so nothing narrows.
		{name: "H100 MIG off: mig with gpu-0", gpu: h100Off, mode: ModeMIG, want: ModeMIG, whole: true, migDevices: -1},
		{name: "H100 MIG on: mig with gpu-0", gpu: h100On, mode: ModeMIG, want: ModeMIG, whole: true, migDevices: -1},
		{name: "H100 MIG on: dynamic", gpu: h100On, mode: ModeDynamic, want: ModeDynamic, whole: true, shareable: true, migDevices: -1},
		{name: "H100 MIG on: exclusive", gpu: h100On, mode: ModeExclusive, want: ModeExclusive, whole: true},
		{name: "H100 MIG off: auto is mig", gpu: h100Off, mode: ModeAuto, want: ModeMIG, whole: true, migDevices: -1, modeNote: "auto: mig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := discoverGPUs(t, tc.gpu)
			cfg := Config{DefaultMode: tc.mode, Features: tc.features}
			if tc.carved {
				cfg.MIGInstances = []nvmlgpu.MIGInstance{instance(node.GPUs[0], 0, 0, 1)}
			}
			inv, err := Build(node, cfg)
			if err != nil {
				t.Fatal(err)
			}
			g := inv.GPUs[0]
			if g.Mode != tc.want || g.ModeRequested != tc.mode {
				t.Fatalf("mode %s for %s (%s), want %s", g.Mode, g.ModeRequested, g.ModeNote, tc.want)
			}
			_, whole := inv.Device(WholeGPUName(0))
			if whole != tc.whole || (whole && (g.Devices[0].Name != WholeGPUName(0) || g.Devices[0].Shareable != tc.shareable)) {
				t.Errorf("gpu-0 published %v (devices %v), want %v, shareable %v", whole, deviceNames(g), tc.whole, tc.shareable)
			}
			mig := 0
			for _, d := range g.Devices {
				if d.Kind == KindMIG {
					mig++
				}
			}
			if (tc.migDevices < 0 && mig == 0) || (tc.migDevices >= 0 && mig != tc.migDevices) {
				t.Errorf("%d MIG devices, want %d (-1: some)", mig, tc.migDevices)
			}
			wantNotes := tc.extraNotes
			if len(tc.notes) > 0 {
				wantNotes++
			}
			if len(inv.Notes) != wantNotes {
				t.Fatalf("notes %q, want %d", inv.Notes, wantNotes)
			}
			for _, want := range tc.notes {
				if !strings.Contains(inv.Notes[0], want) || !strings.Contains(g.ModeNote, want) {
					t.Errorf("note %q (mode note %q) lacks %q", inv.Notes[0], g.ModeNote, want)
				}
			}
			if !strings.Contains(g.ModeNote, tc.modeNote) {
				t.Errorf("mode note %q lacks %q", g.ModeNote, tc.modeNote)
			}
		})
	}
}

func deviceNames(g *GPU) []string {
	var out []string
	for _, d := range g.Devices {
		out = append(out, d.Name)
	}
	return out
}
