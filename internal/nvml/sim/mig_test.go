package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// migModels are the MIG-capable models, with their memory slices and the
// full profile's compute slices.
var migModels = []struct {
	model             string
	memSlices, slices int
}{
	{"A100-SXM4-40GB", 8, 7},
	{"A100-SXM4-80GB", 8, 7},
	{"A30-PCIE-24GB", 4, 4},
	{"H100-SXM5-80GB", 8, 7},
	{"H200-141GB", 8, 7},
	{"B200-180GB", 8, 7},
}

// migGPU opens a machine of n GPUs of model, enables MIG on the first, and
// returns the library and that GPU as discovery sees it.
func migGPU(t *testing.T, model string, n int, opts ...Option) (*nvmlgpu.Library, nvmlgpu.GPU) {
	t.Helper()
	// Before Hopper MIG mode is the admin's (Facet never changes it): the
	// GPU boots with it on; from Hopper on, Facet turns it on.
	beforeHopper := strings.HasPrefix(model, "A100") || strings.HasPrefix(model, "A30")
	lib := openTestMachineMIG(t, model, n, beforeHopper, opts...)
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	g := node.GPUs[0]
	if changed, err := lib.EnableMIG(g.UUID); err != nil || changed == beforeHopper {
		t.Fatalf("EnableMIG: %v, %v", changed, err)
	}
	return lib, g
}

// profileNamed returns the GPU's profile with this name.
func profileNamed(t *testing.T, g nvmlgpu.GPU, name string) nvmlgpu.MIGProfile {
	t.Helper()
	for _, p := range g.MIGProfiles {
		if p.Name == name {
			return p
		}
	}
	var names []string
	for _, p := range g.MIGProfiles {
		names = append(names, p.Name)
	}
	t.Fatalf("%s has no profile %s (has %v)", g.ProductName, name, names)
	return nvmlgpu.MIGProfile{}
}

func mustCreate(t *testing.T, lib *nvmlgpu.Library, uuid string, p nvmlgpu.MIGProfile, start int) nvmlgpu.MIGInstance {
	t.Helper()
	inst, err := lib.CreateMIG(uuid, p.GIProfileID, start)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

func listMIG(t *testing.T, lib *nvmlgpu.Library) []nvmlgpu.MIGInstance {
	t.Helper()
	insts, err := lib.ListMIG()
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

func TestMIGEveryProfileEveryPlacement(t *testing.T) {
	for _, m := range migModels {
		t.Run(m.model, func(t *testing.T) {
			lib, g := migGPU(t, m.model, 1)
			if len(g.MIGProfiles) == 0 {
				t.Fatal("no MIG profiles")
			}
			for _, p := range g.MIGProfiles {
				for _, pl := range p.Placements {
					inst, err := lib.CreateMIG(g.UUID, p.GIProfileID, pl.Start)
					if err != nil {
						t.Fatalf("%s at %d: %v", p.Name, pl.Start, err)
					}
					wantGI, _ := giIDForPlacement(m.memSlices, nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
					want := nvmlgpu.MIGInstance{
						ParentUUID: g.UUID, ParentIndex: 0, Profile: p.Name,
						GIProfileID: p.GIProfileID, GIProfileInfoID: p.GIProfileInfoID, CIProfileID: p.CIProfileID,
						Placement: pl, GIID: wantGI, CIID: 0, UUID: inst.UUID,
					}
					if inst != want || !strings.HasPrefix(inst.UUID, "MIG-") {
						t.Fatalf("%s at %d: got %+v, want %+v", p.Name, pl.Start, inst, want)
					}
					if got := listMIG(t, lib); len(got) != 1 || got[0] != inst {
						t.Fatalf("%s at %d: ListMIG %+v", p.Name, pl.Start, got)
					}
					if err := lib.DestroyMIG(g.UUID, inst.GIID, inst.CIID); err != nil {
						t.Fatal(err)
					}
					if got := listMIG(t, lib); len(got) != 0 {
						t.Fatalf("%s at %d: after destroy, ListMIG %+v", p.Name, pl.Start, got)
					}
				}
			}
		})
	}
}

// TestMIGTablesAsDocumented checks the placements discovery reports against
// `nvidia-smi mig -lgipp` as NVIDIA documents it (see eightSlice), and that
// applyTable left go-nvml's own tables alone.
func TestMIGTablesAsDocumented(t *testing.T) {
	eight := map[string]string{
		"1g":       "[{0 1} {1 1} {2 1} {3 1} {4 1} {5 1} {6 1}]",
		"1g+me":    "[{0 1} {1 1} {2 1} {3 1} {4 1} {5 1} {6 1}]",
		"1g(2/8)":  "[{0 2} {2 2} {4 2} {6 2}]",
		"2g":       "[{0 2} {2 2} {4 2}]",
		"3g":       "[{0 4} {4 4}]",
		"4g":       "[{0 4}]",
		"7g":       "[{0 8}]",
		"one +me":  "true",
		"profiles": "7",
	}
	four := map[string]string{
		"1g":       "[{0 1} {1 1} {2 1} {3 1}]",
		"1g+me":    "[{0 1} {1 1} {2 1} {3 1}]",
		"2g":       "[{0 2} {2 2}]",
		"2g+me":    "[{0 2} {2 2}]",
		"4g":       "[{0 4}]",
		"profiles": "5",
	}
	for _, m := range migModels {
		t.Run(m.model, func(t *testing.T) {
			_, g := migGPU(t, m.model, 1)
			got := map[string]string{"profiles": fmt.Sprint(len(g.MIGProfiles))}
			for _, p := range g.MIGProfiles {
				key, _, _ := strings.Cut(p.Name, ".")
				if strings.HasSuffix(p.Name, "+me") {
					key += "+me"
					if m.memSlices == 8 {
						got["one +me"] = "true"
					}
				} else if p.SliceCount == 1 && p.MemorySlices == 2 {
					key += "(2/8)"
				}
				got[key] = fmt.Sprint(p.Placements)
			}
			want := eight
			if m.memSlices == 4 {
				want = four
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("placements\n got %v\nwant %v", got, want)
			}
		})
	}
	if pl := gpus.H100_SXM5_80GB.MIGProfiles.GpuInstancePlacements[nvml.GPU_INSTANCE_PROFILE_3_SLICE]; pl[0].Size != 3 {
		t.Errorf("go-nvml's own H100 table was modified: 3g placements %v", pl)
	}
}

// migItem is one MIG device Facet publishes: a profile at a placement.
type migItem struct {
	p  nvmlgpu.MIGProfile
	pl nvmlgpu.Placement
}

func (it migItem) String() string { return fmt.Sprintf("%s@%d", it.p.Name, it.pl.Start) }

func overlap(a, b nvmlgpu.Placement) bool {
	return a.Start < b.Start+b.Size && b.Start < a.Start+a.Size
}

// TestEngineRuleOnlyLimitsMediaExtensions is the hardware side of "the
// allocator accepts these devices iff NVML can create them together": for
// every model and every set of MIG devices whose memory slices are
// disjoint, the simulated NVML creates them all iff at most one of them is
// a "+me" profile. So memory slices plus one media-extension counter
// express every rule the simulation enforces (InstanceCount, compute
// slices, engines), and overlapping memory slices are always refused.
func TestEngineRuleOnlyLimitsMediaExtensions(t *testing.T) {
	for _, m := range migModels {
		t.Run(m.model, func(t *testing.T) {
			lib, g := migGPU(t, m.model, 1)
			var items []migItem
			for _, p := range g.MIGProfiles {
				for _, pl := range p.Placements {
					items = append(items, migItem{p, pl})
				}
			}
			// Overlapping pairs, and an item with itself.
			for i, a := range items {
				for _, b := range items[i:] {
					if !overlap(a.pl, b.pl) {
						continue
					}
					ok, err := lib.CanCreateTogether(g.UUID, []nvmlgpu.MIGPlacement{{GIProfileID: a.p.GIProfileID, Start: a.pl.Start}, {GIProfileID: b.p.GIProfileID, Start: b.pl.Start}})
					if err != nil || ok {
						t.Fatalf("%v + %v: %v, %v; want refused", a, b, ok, err)
					}
				}
			}
			// Every memory-disjoint set.
			sets, refused := 0, 0
			var set []migItem
			var walk func(next int)
			walk = func(next int) {
				if len(set) > 0 {
					me := 0
					req := make([]nvmlgpu.MIGPlacement, len(set))
					for i, it := range set {
						req[i] = nvmlgpu.MIGPlacement{GIProfileID: it.p.GIProfileID, Start: it.pl.Start}
						if strings.HasSuffix(it.p.Name, "+me") {
							me++
						}
					}
					ok, err := lib.CanCreateTogether(g.UUID, req)
					if err != nil {
						t.Fatalf("%v: %v", set, err)
					}
					if want := me <= 1; ok != want {
						t.Fatalf("%v: NVML says %v, memory slices and one +me say %v", set, ok, want)
					}
					sets++
					if !ok {
						refused++
					}
				}
				for i := next; i < len(items); i++ {
					free := true
					for _, it := range set {
						free = free && !overlap(it.pl, items[i].pl)
					}
					if free {
						set = append(set, items[i])
						walk(i + 1)
						set = set[:len(set)-1]
					}
				}
			}
			walk(0)
			t.Logf("%d memory-disjoint sets of %d devices, %d refused for a second +me", sets, len(items), refused)
			if refused == 0 {
				t.Error("no set was refused: the media-extension rule is not modelled")
			}
			if got := listMIG(t, lib); len(got) != 0 {
				t.Fatalf("CanCreateTogether left instances behind: %+v", got)
			}
		})
	}
}

func TestMIGOverlapAndMediaExtensions(t *testing.T) {
	for _, m := range migModels {
		t.Run(m.model, func(t *testing.T) {
			lib, g := migGPU(t, m.model, 1)
			var small, me, full nvmlgpu.MIGProfile
			for _, p := range g.MIGProfiles {
				switch {
				case strings.HasSuffix(p.Name, "+me") && me.Name == "":
					me = p
				case p.SliceCount == 1 && p.MemorySlices == 1 && !strings.HasSuffix(p.Name, "+me"):
					small = p
				case p.SliceCount == m.slices:
					full = p
				}
			}
			first := mustCreate(t, lib, g.UUID, me, 0)
			// Overlapping memory slices.
			for _, p := range []nvmlgpu.MIGProfile{small, me, full} {
				_, err := lib.CreateMIG(g.UUID, p.GIProfileID, 0)
				if !nvmlgpu.IsInsufficientResources(err) {
					t.Errorf("%s at 0 over %s at 0: error %v, want insufficient resources", p.Name, me.Name, err)
				}
				for _, s := range []string{g.UUID, "GPU 0", p.Name, "at placement 0:", "memory slice"} {
					if err != nil && !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not name %q", err, s)
					}
				}
			}
			// A second +me, anywhere, of any +me profile.
			for _, p := range g.MIGProfiles {
				if !strings.HasSuffix(p.Name, "+me") {
					continue
				}
				last := p.Placements[len(p.Placements)-1]
				if _, err := lib.CreateMIG(g.UUID, p.GIProfileID, last.Start); !nvmlgpu.IsInsufficientResources(err) {
					t.Errorf("second media extension %s at %d: error %v", p.Name, last.Start, err)
				}
			}
			// A plain 1g next to it is fine; after destroying the +me, a +me
			// fits again.
			mustCreate(t, lib, g.UUID, small, 1)
			if err := lib.DestroyMIG(g.UUID, first.GIID, first.CIID); err != nil {
				t.Fatal(err)
			}
			mustCreate(t, lib, g.UUID, me, 2)
			// Not a legal placement.
			if _, err := lib.CreateMIG(g.UUID, full.GIProfileID, 1); err == nil || !strings.Contains(err.Error(), "no placement starting at memory slice 1") {
				t.Errorf("illegal placement: error %v", err)
			}
			if _, err := lib.CreateMIG(g.UUID, 13, 0); err == nil || !strings.Contains(err.Error(), "no MIG profile with NVML GI profile index 13") {
				t.Errorf("unknown profile: error %v", err)
			}
		})
	}
}

func TestMIGLayouts(t *testing.T) {
	type create struct {
		profile string
		start   int
	}
	for _, tc := range []struct {
		name    string
		model   string
		creates []create
		next    create // refused afterwards
	}{
		{
			// mig-parted's all-balanced for the A100 80GB: 1 x 3g.40gb,
			// 1 x 2g.20gb, 2 x 1g.10gb.
			name: "A100-80GB all-balanced", model: "A100-SXM4-80GB",
			creates: []create{{"3g.40gb", 4}, {"2g.20gb", 0}, {"1g.10gb", 2}, {"1g.10gb", 3}},
			next:    create{"1g.10gb", 6},
		},
		{
			name: "A100-80GB 7 x 1g", model: "A100-SXM4-80GB",
			creates: []create{{"1g.10gb", 0}, {"1g.10gb", 1}, {"1g.10gb", 2}, {"1g.10gb", 3}, {"1g.10gb", 4}, {"1g.10gb", 5}, {"1g.10gb", 6}},
			next:    create{"1g.10gb+me", 6},
		},
		{
			name: "A100-40GB 4g + 3g", model: "A100-SXM4-40GB",
			creates: []create{{"4g.20gb", 0}, {"3g.20gb", 4}},
			next:    create{"1g.5gb", 6},
		},
		{
			name: "H100 7 x 1g", model: "H100-SXM5-80GB",
			creates: []create{{"1g.10gb", 0}, {"1g.10gb", 1}, {"1g.10gb", 2}, {"1g.10gb", 3}, {"1g.10gb", 4}, {"1g.10gb", 5}, {"1g.10gb", 6}},
			next:    create{"1g.20gb", 6},
		},
		{
			// 3g.40gb takes four memory slices: two fill an H100.
			name: "H100 3g + 3g", model: "H100-SXM5-80GB",
			creates: []create{{"3g.40gb", 0}, {"3g.40gb", 4}},
			next:    create{"1g.10gb", 3},
		},
		{
			name: "H100 4 x 1g.20gb", model: "H100-SXM5-80GB",
			creates: []create{{"1g.20gb", 0}, {"1g.20gb", 2}, {"1g.20gb", 4}, {"1g.20gb", 6}},
			next:    create{"1g.10gb", 1},
		},
		{
			name: "H200 2g x 3 + 1g+me", model: "H200-141GB",
			creates: []create{{"2g.35gb", 0}, {"2g.35gb", 2}, {"2g.35gb", 4}, {"1g.18gb+me", 6}},
			next:    create{"1g.18gb", 6},
		},
		{
			name: "B200 4g + 2g + 1g+me", model: "B200-180GB",
			creates: []create{{"4g.90gb", 0}, {"2g.45gb", 4}, {"1g.23gb+me", 6}},
			next:    create{"1g.23gb", 6},
		},
		{
			name: "A30 4 x 1g", model: "A30-PCIE-24GB",
			creates: []create{{"1g.6gb", 0}, {"1g.6gb", 1}, {"1g.6gb", 2}, {"1g.6gb", 3}},
			next:    create{"1g.6gb+me", 0},
		},
		{
			// A30 has two +me profiles and one OFA.
			name: "A30 2g+me + 1g", model: "A30-PCIE-24GB",
			creates: []create{{"2g.12gb+me", 0}, {"1g.6gb", 2}},
			next:    create{"1g.6gb+me", 3},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lib, g := migGPU(t, tc.model, 1)
			var made []nvmlgpu.MIGInstance
			for _, c := range tc.creates {
				made = append(made, mustCreate(t, lib, g.UUID, profileNamed(t, g, c.profile), c.start))
			}
			p := profileNamed(t, g, tc.next.profile)
			if _, err := lib.CreateMIG(g.UUID, p.GIProfileID, tc.next.start); !nvmlgpu.IsInsufficientResources(err) {
				t.Fatalf("%s at %d: error %v, want insufficient resources", tc.next.profile, tc.next.start, err)
			}
			if got := listMIG(t, lib); len(got) != len(made) {
				t.Fatalf("ListMIG: %d instances, want %d", len(got), len(made))
			}
			// Destroying what is in the way makes room.
			var next nvmlgpu.Placement
			for _, pl := range p.Placements {
				if pl.Start == tc.next.start {
					next = pl
				}
			}
			for _, inst := range made {
				if overlap(inst.Placement, next) || strings.HasSuffix(inst.Profile, "+me") && strings.HasSuffix(p.Name, "+me") {
					if err := lib.DestroyMIG(g.UUID, inst.GIID, inst.CIID); err != nil {
						t.Fatal(err)
					}
				}
			}
			mustCreate(t, lib, g.UUID, p, tc.next.start)
		})
	}
}

// TestMIGCreateWithoutPlacement checks where the simulation puts instances
// created without a placement (nvmlDeviceCreateGpuInstance, as mig-parted
// does): where the A100 driver does.
func TestMIGCreateWithoutPlacement(t *testing.T) {
	// create makes GPU instances of the named profiles on a fresh A100 80GB
	// without placements and returns their IDs, then the NVML return code
	// of one more of the last profile.
	create := func(names ...string) ([]int, nvml.Return) {
		lib, g := migGPU(t, "A100-SXM4-80GB", 1)
		dev, _ := serverOf(lib).DeviceGetHandleByIndex(0)
		var ids []int
		var info nvml.GpuInstanceProfileInfo
		for _, name := range names {
			info, _ = dev.GetGpuInstanceProfileInfo(profileNamed(t, g, name).GIProfileID)
			gi, ret := dev.CreateGpuInstance(&info)
			if ret != nvml.SUCCESS {
				t.Fatalf("%s: %v", name, nvml.ErrorString(ret))
			}
			gii, _ := gi.GetInfo()
			ids = append(ids, int(gii.Id))
		}
		n, ret := dev.GetGpuInstanceRemainingCapacity(&info)
		if ret != nvml.SUCCESS {
			t.Fatal(nvml.ErrorString(ret))
		}
		if _, ret = dev.CreateGpuInstance(&info); (ret == nvml.SUCCESS) != (n > 0) {
			t.Errorf("remaining capacity %d, but one more: %v", n, nvml.ErrorString(ret))
		}
		return ids, ret
	}
	// all-balanced, in mig-parted's order.
	ids, _ := create("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
	if fmt.Sprint(ids) != "[2 3 9 10]" {
		t.Errorf("all-balanced GI IDs %v, want [2 3 9 10]", ids)
	}
	// Seven 1g, where nvidia-smi puts them, and no eighth.
	ids, ret := create("1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb")
	if fmt.Sprint(ids) != "[13 11 12 7 8 9 10]" || ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("7 x 1g GI IDs %v, want nvidia-smi's [13 11 12 7 8 9 10]; an 8th: %v", ids, nvml.ErrorString(ret))
	}
}

// TestEnableMIGResetRequired checks EnableMIG where the driver accepts the
// mode change but needs a GPU reset to make it, on a Hopper GPU (what NVML
// reports in some VMs): the error says so, and Facet takes the pending
// change back, so the GPU does not change mode at its next reset.
func TestEnableMIGResetRequired(t *testing.T) {
	lib := openTestMachine(t, "H100-SXM5-80GB", 2)
	node, _ := lib.Discover()
	g := node.GPUs[1]
	dev := serverOf(lib).Devices[1].(*server.Device)
	pending := nvml.DEVICE_MIG_DISABLE
	dev.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		pending = mode
		return nvml.SUCCESS, nvml.ERROR_RESET_REQUIRED
	}
	dev.GetMigModeFunc = func() (int, int, nvml.Return) { return nvml.DEVICE_MIG_DISABLE, pending, nvml.SUCCESS }
	changed, err := lib.EnableMIG(g.UUID)
	if err == nil || changed || !strings.Contains(err.Error(), "has not made it") || !strings.Contains(err.Error(), "Facet took the pending change back") || !strings.Contains(err.Error(), g.UUID) {
		t.Errorf("EnableMIG: %v, %v; want an error saying the pending change was taken back", changed, err)
	}
	if pending != nvml.DEVICE_MIG_DISABLE {
		t.Errorf("MIG mode left pending %d", pending)
	}
	if _, err := lib.CreateMIG(g.UUID, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0); !errors.Is(err, nvmlgpu.ErrMIGDisabled) {
		t.Errorf("CreateMIG: %v", err)
	}
}

// TestMIGModeFixedBeforeHopper: Facet never changes the MIG mode of a GPU
// before Hopper (which would hold the change pending until a reset), nor
// of a vGPU guest: EnableMIG and DisableMIG refuse with the reason and
// ErrMIGModeFixed, and the simulated A100 is never left pending. Discovery
// says why in GPU.MIGModeFixed.
func TestMIGModeFixedBeforeHopper(t *testing.T) {
	dir := t.TempDir()
	machine := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(machine, []byte(`name: fixed
driverVersion: "580.159.04"
cudaDriverVersion: "13.0"
gpus:
- model: A100-SXM4-80GB
- model: A100-SXM4-80GB
  migEnabled: true
- model: H100-SXM5-80GB
  vgpuGuest: true
- model: H100-SXM5-80GB
`), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := openMachineFile(machine)
	if err != nil {
		t.Fatal(err)
	}
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"applies a MIG mode change only after a GPU reset", "applies a MIG mode change only after a GPU reset", "vGPU in a virtual machine", ""} {
		if got := node.GPUs[i].MIGModeFixed; (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("GPU %d: MIGModeFixed %q, want %q", i, got, want)
		}
	}
	for i, change := range []func(string) (bool, error){lib.EnableMIG, lib.DisableMIG, lib.EnableMIG} {
		changed, err := change(node.GPUs[i].UUID)
		if changed || !errors.Is(err, nvmlgpu.ErrMIGModeFixed) || !strings.Contains(err.Error(), node.GPUs[i].UUID) {
			t.Errorf("GPU %d: changed %v, error %v; want ErrMIGModeFixed", i, changed, err)
		}
		dev, _ := serverOf(lib).DeviceGetHandleByIndex(i)
		if current, pending, _ := dev.GetMigMode(); current != pending {
			t.Errorf("GPU %d left pending: current %d, pending %d", i, current, pending)
		}
	}
	// Asking for the mode the GPU is in is no change, and no refusal.
	if changed, err := lib.EnableMIG(node.GPUs[1].UUID); changed || err != nil {
		t.Errorf("EnableMIG on an A100 with MIG on: %v, %v", changed, err)
	}
	if changed, err := lib.EnableMIG(node.GPUs[3].UUID); !changed || err != nil {
		t.Errorf("EnableMIG on an H100: %v, %v", changed, err)
	}
	// The simulated A100's own NVML holds a change pending, as the driver.
	dev, _ := serverOf(lib).DeviceGetHandleByIndex(0)
	if ret, act := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.ERROR_RESET_REQUIRED {
		t.Errorf("A100 SetMigMode: %v, activation %v", nvml.ErrorString(ret), nvml.ErrorString(act))
	}
	if current, pending, _ := dev.GetMigMode(); current != nvml.DEVICE_MIG_DISABLE || pending != nvml.DEVICE_MIG_ENABLE {
		t.Errorf("A100 after SetMigMode: current %d pending %d, want 0 and 1", current, pending)
	}
}

// TestMIGModeFixedNeverSetsMode: on an A100, EnableMIG and DisableMIG
// never reach nvmlDeviceSetMigMode: where the mode is already the one
// wanted they return at once (a whole GPU with MIG mode off, a MIG device
// with it on: what prepare asks for), and elsewhere they refuse before
// it. On an H100 the change is one call.
func TestMIGModeFixedNeverSetsMode(t *testing.T) {
	dir := t.TempDir()
	machine := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(machine, []byte(`name: fixed-calls
driverVersion: "580.159.04"
cudaDriverVersion: "13.0"
gpus:
- model: A100-SXM4-80GB
- model: A100-SXM4-80GB
  migEnabled: true
- model: H100-SXM5-80GB
`), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := openMachineFile(machine)
	if err != nil {
		t.Fatal(err)
	}
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	calls := make([]int, len(node.GPUs))
	for i := range node.GPUs {
		dev := serverOf(lib).Devices[i].(*server.Device)
		set := dev.SetMigModeFunc
		dev.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
			calls[i]++
			return set(mode)
		}
	}
	for _, tc := range []struct {
		gpu     int
		change  func(string) (bool, error)
		name    string
		changed bool
		refused bool
		calls   int
	}{
		{0, lib.DisableMIG, "A100, MIG mode off: disable", false, false, 0},
		{0, lib.EnableMIG, "A100, MIG mode off: enable", false, true, 0},
		{1, lib.EnableMIG, "A100, MIG mode on: enable", false, false, 0},
		{1, lib.DisableMIG, "A100, MIG mode on: disable", false, true, 0},
		{2, lib.DisableMIG, "H100, MIG mode off: disable", false, false, 0},
		{2, lib.EnableMIG, "H100, MIG mode off: enable", true, false, 1},
	} {
		before := calls[tc.gpu]
		changed, err := tc.change(node.GPUs[tc.gpu].UUID)
		if changed != tc.changed || errors.Is(err, nvmlgpu.ErrMIGModeFixed) != tc.refused || (err != nil && !tc.refused) {
			t.Errorf("%s: changed %v, error %v; want changed %v, refused %v", tc.name, changed, err, tc.changed, tc.refused)
		}
		if n := calls[tc.gpu] - before; n != tc.calls {
			t.Errorf("%s: %d SetMigMode calls, want %d", tc.name, n, tc.calls)
		}
	}
}

func TestMIGIDsReused(t *testing.T) {
	lib, g := migGPU(t, "H100-SXM5-80GB", 1)
	one := profileNamed(t, g, "1g.10gb")
	var made []nvmlgpu.MIGInstance
	for s := range 7 {
		made = append(made, mustCreate(t, lib, g.UUID, one, s))
	}
	for s, inst := range made {
		if inst.GIID != 7+s || inst.CIID != 0 {
			t.Errorf("1g at %d: GI %d CI %d, want GI %d CI 0", s, inst.GIID, inst.CIID, 7+s)
		}
	}
	// Destroy and create again, many times: IDs stay in the driver's range.
	for round := range 20 {
		s := round % 7
		if err := lib.DestroyMIG(g.UUID, made[s].GIID, made[s].CIID); err != nil {
			t.Fatal(err)
		}
		again := mustCreate(t, lib, g.UUID, one, s)
		if again.GIID != made[s].GIID || again.CIID != 0 {
			t.Fatalf("round %d: recreated GI %d CI %d, want GI %d CI 0", round, again.GIID, again.CIID, made[s].GIID)
		}
		if again.UUID == made[s].UUID {
			t.Fatalf("round %d: a new MIG device kept the old UUID %s", round, again.UUID)
		}
		made[s] = again
	}
	// The 7g is GI 0.
	for _, inst := range made {
		if err := lib.DestroyMIG(g.UUID, inst.GIID, inst.CIID); err != nil {
			t.Fatal(err)
		}
	}
	if full := mustCreate(t, lib, g.UUID, profileNamed(t, g, "7g.80gb"), 0); full.GIID != 0 {
		t.Errorf("7g: GI %d", full.GIID)
	}
}

func TestGIIDForPlacement(t *testing.T) {
	for _, tc := range []struct {
		slices, start, size, want int
		ok                        bool
	}{
		{8, 0, 8, 0, true}, {8, 0, 4, 1, true}, {8, 4, 4, 2, true}, {8, 0, 2, 3, true}, {8, 6, 2, 6, true},
		{8, 0, 1, 7, true}, {8, 6, 1, 13, true}, {8, 7, 1, 14, true},
		{4, 0, 4, 0, true}, {4, 2, 2, 2, true}, {4, 3, 1, 6, true},
		{8, 0, 3, 0, false}, {8, 4, 3, 0, false}, {8, 0, 7, 0, false}, {8, 2, 4, 0, false}, {7, 0, 1, 0, false},
	} {
		got, ok := giIDForPlacement(tc.slices, nvml.GpuInstancePlacement{Start: uint32(tc.start), Size: uint32(tc.size)})
		if got != tc.want || ok != tc.ok {
			t.Errorf("giIDForPlacement(%d, %d:%d) = %d, %v", tc.slices, tc.start, tc.size, got, ok)
		}
	}
}

func TestListMIG(t *testing.T) {
	lib := openTestMachine(t, "H100-SXM5-80GB", 3)
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	if got := listMIG(t, lib); len(got) != 0 {
		t.Fatalf("MIG off: %+v", got)
	}
	g0, g2 := node.GPUs[0], node.GPUs[2]
	for _, g := range []nvmlgpu.GPU{g0, g2} {
		if _, err := lib.EnableMIG(g.UUID); err != nil {
			t.Fatal(err)
		}
	}
	a := mustCreate(t, lib, g2.UUID, profileNamed(t, g2, "3g.40gb"), 4)
	b := mustCreate(t, lib, g0.UUID, profileNamed(t, g0, "1g.10gb+me"), 5)
	c := mustCreate(t, lib, g0.UUID, profileNamed(t, g0, "2g.20gb"), 0)

	// Instances Facet did not make: a GPU instance without a compute
	// instance (a crash between the two), and one with two.
	dev, _ := serverOf(lib).DeviceGetHandleByIndex(2)
	info, _ := dev.GetGpuInstanceProfileInfo(profileNamed(t, g2, "1g.10gb").GIProfileID)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	p2 := profileNamed(t, g2, "2g.20gb")
	info, _ = dev.GetGpuInstanceProfileInfo(p2.GIProfileID)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 2, Size: 2})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	for range 2 {
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("third 1-slice compute instance in a 2g: %v", nvml.ErrorString(ret))
	}

	got := listMIG(t, lib)
	var brief []string
	for _, inst := range got {
		brief = append(brief, fmt.Sprintf("%d/%s@%d/gi%d/ci%d/cip%d/%v", inst.ParentIndex, inst.Profile, inst.Placement.Start, inst.GIID, inst.CIID, inst.CIProfileID, strings.HasPrefix(inst.UUID, "MIG-")))
	}
	want := []string{
		"0/2g.20gb@0/gi3/ci0/cip1/true",
		"0/1g.10gb+me@5/gi12/ci0/cip0/true",
		"2/3g.40gb@4/gi2/ci0/cip2/true",
		"2/2g.20gb@2/gi4/ci0/cip0/true",
		"2/2g.20gb@2/gi4/ci1/cip0/true",
		"2/1g.10gb@0/gi7/ci-1/cip-1/false",
	}
	if fmt.Sprint(brief) != fmt.Sprint(want) {
		t.Errorf("ListMIG\n got %v\nwant %v", brief, want)
	}
	for _, inst := range []nvmlgpu.MIGInstance{c, b, a} {
		found := false
		for _, g := range got {
			found = found || g == inst
		}
		if !found {
			t.Errorf("%+v missing from ListMIG", inst)
		}
	}
	// DestroyMIG leaves a GPU instance with another compute instance.
	if err := lib.DestroyMIG(g2.UUID, 4, 0); !nvmlgpu.IsInUse(err) || !strings.Contains(err.Error(), g2.UUID) {
		t.Errorf("GI with two CIs: error %v", err)
	}
	if err := lib.DestroyMIG(g2.UUID, 4, 1); err != nil {
		t.Error(err)
	}
	// A GPU instance without a compute instance, as ListMIG names it
	// (CIID -1): this used to fail with INVALID_ARGUMENT.
	if err := lib.DestroyMIG(g2.UUID, 7, -1); err != nil {
		t.Error(err)
	}
	if got := listMIG(t, lib); len(got) != 3 {
		t.Errorf("after destroys: %+v", got)
	}
}

func TestDestroyMIGIdempotent(t *testing.T) {
	lib, g := migGPU(t, "A100-SXM4-40GB", 2)
	inst := mustCreate(t, lib, g.UUID, profileNamed(t, g, "3g.20gb"), 4)
	for range 3 {
		if err := lib.DestroyMIG(g.UUID, inst.GIID, inst.CIID); err != nil {
			t.Fatal(err)
		}
	}
	if err := lib.DestroyMIG(g.UUID, 9, 5); err != nil {
		t.Errorf("never created: %v", err)
	}
	// The second GPU has MIG off: nothing to destroy.
	node, _ := lib.Discover()
	if err := lib.DestroyMIG(node.GPUs[1].UUID, 0, 0); err != nil {
		t.Errorf("MIG off: %v", err)
	}
	if err := lib.DestroyMIG("GPU-00000000-0000-0000-0000-000000000000", 0, 0); err == nil {
		t.Error("unknown GPU: no error")
	}
}

func TestMIGModeRequired(t *testing.T) {
	lib := openTestMachine(t, "H100-SXM5-80GB", 1)
	node, _ := lib.Discover()
	g := node.GPUs[0]
	if g.MIGEnabled {
		t.Fatal("MIG on at boot")
	}
	one := profileNamed(t, g, "1g.10gb")
	_, err := lib.CreateMIG(g.UUID, one.GIProfileID, 0)
	if !errors.Is(err, nvmlgpu.ErrMIGDisabled) || !strings.Contains(err.Error(), g.UUID) {
		t.Fatalf("MIG off: error %v", err)
	}
	if _, err := lib.CanCreateTogether(g.UUID, []nvmlgpu.MIGPlacement{{GIProfileID: one.GIProfileID, Start: 0}}); !errors.Is(err, nvmlgpu.ErrMIGDisabled) {
		t.Errorf("CanCreateTogether with MIG off: %v", err)
	}
	// NVML itself refuses too.
	dev, _ := serverOf(lib).DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(one.GIProfileID)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("NVML create with MIG off: %v", nvml.ErrorString(ret))
	}
	if changed, err := lib.EnableMIG(g.UUID); err != nil || !changed {
		t.Fatalf("EnableMIG: %v %v", changed, err)
	}
	if changed, err := lib.EnableMIG(g.UUID); err != nil || changed {
		t.Fatalf("EnableMIG again: %v %v", changed, err)
	}
	node, _ = lib.Discover()
	if !node.GPUs[0].MIGEnabled {
		t.Error("discovery does not see MIG on")
	}
	mustCreate(t, lib, g.UUID, one, 0)
	// MIG cannot be turned off under instances.
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Errorf("disable MIG with instances: %v", nvml.ErrorString(ret))
	}
}

func TestMIGOnGPUWithoutMIG(t *testing.T) {
	lib := openTestMachine(t, "L4", 2)
	node, _ := lib.Discover()
	g := node.GPUs[1]
	_, err := lib.EnableMIG(g.UUID)
	if !nvmlgpu.IsNotSupported(err) || !strings.Contains(err.Error(), "does not support MIG") || !strings.Contains(err.Error(), g.UUID) || !strings.Contains(err.Error(), "GPU 1") {
		t.Errorf("EnableMIG on an L4: %v", err)
	}
	if _, err := lib.CreateMIG(g.UUID, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0); !nvmlgpu.IsNotSupported(err) || !strings.Contains(err.Error(), "does not support MIG") {
		t.Errorf("CreateMIG on an L4: %v", err)
	}
	if got := listMIG(t, lib); len(got) != 0 {
		t.Errorf("ListMIG: %+v", got)
	}
	dev, _ := serverOf(lib).DeviceGetHandleByIndex(1)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&nvml.GpuInstanceProfileInfo{}, &nvml.GpuInstancePlacement{}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("NVML create on an L4: %v", nvml.ErrorString(ret))
	}
}

func TestCanCreateTogether(t *testing.T) {
	lib, g := migGPU(t, "A100-SXM4-80GB", 1)
	p := func(name string, start int) nvmlgpu.MIGPlacement {
		return nvmlgpu.MIGPlacement{GIProfileID: profileNamed(t, g, name).GIProfileID, Start: start}
	}
	existing := mustCreate(t, lib, g.UUID, profileNamed(t, g, "1g.10gb"), 6)
	for _, tc := range []struct {
		set  []nvmlgpu.MIGPlacement
		want bool
	}{
		{[]nvmlgpu.MIGPlacement{p("3g.40gb", 0), p("2g.20gb", 4)}, true},
		{[]nvmlgpu.MIGPlacement{p("3g.40gb", 4)}, false},                  // overlaps the existing 1g
		{[]nvmlgpu.MIGPlacement{p("4g.40gb", 0), p("3g.40gb", 0)}, false}, // overlap
		{[]nvmlgpu.MIGPlacement{p("1g.10gb+me", 0), p("1g.10gb+me", 1)}, false},
		{[]nvmlgpu.MIGPlacement{p("1g.10gb+me", 0), p("1g.10gb", 1), p("1g.20gb", 2), p("2g.20gb", 4)}, true},
		{[]nvmlgpu.MIGPlacement{p("7g.80gb", 0)}, false},
		{nil, true},
	} {
		ok, err := lib.CanCreateTogether(g.UUID, tc.set)
		if err != nil || ok != tc.want {
			t.Errorf("%v: %v, %v; want %v", tc.set, ok, err, tc.want)
		}
		if got := listMIG(t, lib); len(got) != 1 || got[0] != existing {
			t.Fatalf("%v: GPU changed: %+v", tc.set, got)
		}
	}
	if _, err := lib.CanCreateTogether(g.UUID, []nvmlgpu.MIGPlacement{p("3g.40gb", 0), {GIProfileID: p("3g.40gb", 0).GIProfileID, Start: 2}}); err == nil || !strings.Contains(err.Error(), "no placement starting at memory slice 2") {
		t.Errorf("illegal placement: %v", err)
	}
	if got := listMIG(t, lib); len(got) != 1 {
		t.Fatalf("after an error: %+v", got)
	}
}

func TestMIGStateFile(t *testing.T) {
	state := filepath.Join(t.TempDir(), "nvml-state.json")
	dir := t.TempDir()
	machine := filepath.Join(dir, "machine.yaml")
	if err := os.WriteFile(machine, []byte(`name: persist
driverVersion: "580.159.04"
cudaDriverVersion: "13.0"
gpus:
- model: H100-SXM5-80GB
- model: L4
- model: A30-PCIE-24GB
  migEnabled: true
`), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := openMachineFile(machine, WithStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	node, _ := lib.Discover()
	h100, a30 := node.GPUs[0], node.GPUs[2]
	for _, g := range []nvmlgpu.GPU{h100, a30} {
		if _, err := lib.EnableMIG(g.UUID); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(t, lib, h100.UUID, profileNamed(t, h100, "3g.40gb"), 4)
	mustCreate(t, lib, h100.UUID, profileNamed(t, h100, "1g.10gb+me"), 2)
	mustCreate(t, lib, a30.UUID, profileNamed(t, a30, "2g.12gb"), 2)
	// A GPU instance whose compute instance was never made.
	dev, _ := serverOf(lib).DeviceGetHandleByIndex(2)
	info, _ := dev.GetGpuInstanceProfileInfo(profileNamed(t, a30, "1g.6gb").GIProfileID)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	before := listMIG(t, lib)
	lib.Close()

	var st simState
	data, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &st); err != nil || st.Version != 1 || st.Machine != "persist" || len(st.GPUs) != 3 || !st.GPUs[0].MIGEnabled || st.GPUs[1].MIGEnabled || len(st.GPUs[0].GPUInstances) != 2 {
		t.Fatalf("state file (%v):\n%s", err, data)
	}
	if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(state), ".*tmp*")); len(matches) != 0 {
		t.Errorf("temporary files left: %v", matches)
	}

	// The "plugin" restarts.
	lib, err = openMachineFile(machine, WithStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	after := listMIG(t, lib)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("after reopening:\n got %+v\nwant %+v", after, before)
	}
	node, _ = lib.Discover()
	if !node.GPUs[0].MIGEnabled || node.GPUs[1].MIGEnabled || !node.GPUs[2].MIGEnabled {
		t.Errorf("MIG modes not restored: %v %v %v", node.GPUs[0].MIGEnabled, node.GPUs[1].MIGEnabled, node.GPUs[2].MIGEnabled)
	}
	// The reloaded instances are real: they still take their room, MIG
	// devices resolve by UUID, and they can be destroyed.
	if _, err := lib.CreateMIG(h100.UUID, profileNamed(t, h100, "1g.10gb+me").GIProfileID, 0); !nvmlgpu.IsInsufficientResources(err) {
		t.Errorf("second +me after reload: %v", err)
	}
	for _, inst := range after {
		if inst.UUID == "" {
			continue
		}
		if d, ret := serverOf(lib).DeviceGetHandleByUUID(inst.UUID); ret != nvml.SUCCESS {
			t.Errorf("%s: %v", inst.UUID, nvml.ErrorString(ret))
		} else if gi, _ := d.GetGpuInstanceId(); gi != inst.GIID {
			t.Errorf("%s: GI %d", inst.UUID, gi)
		}
	}
	for _, inst := range after {
		if err := lib.DestroyMIG(inst.ParentUUID, inst.GIID, max(inst.CIID, 0)); err != nil {
			t.Fatal(err)
		}
	}
	lib.Close()
	lib, err = openMachineFile(machine, WithStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	if got := listMIG(t, lib); len(got) != 0 {
		t.Errorf("after destroying all and reopening: %+v", got)
	}

	// State files that do not fit the machine.
	for name, mutate := range map[string]func(*simState){
		"unknown GPU":   func(s *simState) { s.GPUs[0].UUID = "GPU-00000000-0000-0000-0000-000000000000" },
		"other model":   func(s *simState) { s.GPUs[0].Model = "H200-141GB" },
		"other machine": func(s *simState) { s.Machine = "other" },
		"MIG on an L4":  func(s *simState) { s.GPUs[1].MIGEnabled = true },
		"overlap": func(s *simState) {
			s.GPUs[0].GPUInstances = []simGIState{{ID: 1, ProfileID: nvml.GPU_INSTANCE_PROFILE_4_SLICE, Placement: simPlacement{0, 4}}, {ID: 3, ProfileID: nvml.GPU_INSTANCE_PROFILE_2_SLICE, Placement: simPlacement{0, 2}}}
		},
		"bad MIG UUID": func(s *simState) {
			s.GPUs[0].GPUInstances = []simGIState{{ID: 7, ProfileID: 0, Placement: simPlacement{0, 1}, ComputeInstances: []simCIState{{ID: 0, ProfileID: 0, Placement: simPlacement{0, 1}, UUID: "x"}}}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			var s simState
			if err := json.Unmarshal(data, &s); err != nil {
				t.Fatal(err)
			}
			mutate(&s)
			bad := filepath.Join(t.TempDir(), "state.json")
			b, _ := json.Marshal(s)
			if err := os.WriteFile(bad, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := OpenMachine(machine, WithStateFile(bad)); err == nil || !strings.Contains(err.Error(), bad) {
				t.Errorf("error %v", err)
			}
		})
	}
	if _, err := OpenMachine(machine, WithStateFile(filepath.Join(dir, "missing", "state.json"))); err == nil {
		t.Error("unwritable state file: no error")
	}
}

// TestMIGConcurrent creates and destroys MIG instances on eight GPUs at
// once (run with -race), with and without a state file.
func TestMIGConcurrent(t *testing.T) {
	for _, withState := range []bool{false, true} {
		t.Run(fmt.Sprintf("state file %v", withState), func(t *testing.T) {
			var opts []Option
			rounds := 10
			if withState {
				opts = append(opts, WithStateFile(filepath.Join(t.TempDir(), "state.json")))
				rounds = 2
			}
			lib := openTestMachine(t, "H100-SXM5-80GB", 8, opts...)
			node, _ := lib.Discover()
			one := profileNamed(t, node.GPUs[0], "1g.10gb")
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for _, g := range node.GPUs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, err := lib.EnableMIG(g.UUID); err != nil {
						errs <- err
						return
					}
					for range rounds {
						var made []nvmlgpu.MIGInstance
						for s := range 7 {
							inst, err := lib.CreateMIG(g.UUID, one.GIProfileID, s)
							if err != nil {
								errs <- err
								return
							}
							made = append(made, inst)
						}
						if _, err := lib.CreateMIG(g.UUID, one.GIProfileID, 0); !nvmlgpu.IsInsufficientResources(err) {
							errs <- fmt.Errorf("GPU %d: 8th 1g: %v", g.Index, err)
							return
						}
						if _, err := lib.ListMIG(); err != nil {
							errs <- err
							return
						}
						for _, inst := range made {
							if err := lib.DestroyMIG(g.UUID, inst.GIID, inst.CIID); err != nil {
								errs <- err
								return
							}
						}
					}
					if _, err := lib.CreateMIG(g.UUID, one.GIProfileID, g.Index%7); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if got := listMIG(t, lib); len(got) != 8 {
				t.Errorf("ListMIG: %d instances, want 8", len(got))
			}
		})
	}
}

// TestSimComputeInstances checks the simulated compute instance rules at
// the NVML level: they must fit in their GPU instance, and a GPU instance
// with compute instances cannot be destroyed.
func TestSimComputeInstances(t *testing.T) {
	lib, g := migGPU(t, "H100-SXM5-80GB", 1)
	dev, _ := serverOf(lib).DeviceGetHandleByIndex(0)
	p := profileNamed(t, g, "3g.40gb")
	info, _ := dev.GetGpuInstanceProfileInfo(p.GIProfileID)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 4, Size: 4})
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	full, _ := gi.GetComputeInstanceProfileInfo(p.CIProfileID, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	one, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("7-slice compute instance profile in a 3g: %v", nvml.ErrorString(ret))
	}
	ci, ret := gi.CreateComputeInstance(&full)
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	for _, info := range []nvml.ComputeInstanceProfileInfo{full, one} {
		if _, ret := gi.CreateComputeInstance(&info); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
			t.Errorf("compute instance %d next to the full one: %v", info.Id, nvml.ErrorString(ret))
		}
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("destroy GPU instance with a compute instance: %v", nvml.ErrorString(ret))
	}
	cii, _ := ci.GetInfo()
	mig, ret := dev.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	attrs, _ := mig.GetAttributes()
	if isMig, _ := mig.IsMigDeviceHandle(); !isMig || attrs.MemorySizeMB != 40448 || attrs.GpuInstanceSliceCount != 3 || cii.Id != 0 {
		t.Errorf("MIG device: %v %+v, CI %d", isMig, attrs, cii.Id)
	}
	if _, ret := dev.GetMigDeviceHandleByIndex(1); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("second MIG device: %v", nvml.ErrorString(ret))
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	if ret := ci.Destroy(); ret == nvml.SUCCESS {
		t.Error("compute instance destroyed twice")
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	if _, ret := dev.GetGpuInstanceById(2); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("destroyed GPU instance: %v", nvml.ErrorString(ret))
	}
}

func TestDisableMIG(t *testing.T) {
	lib, err := openMachineFile(machinePath("dgx-h100"))
	if err != nil {
		t.Fatal(err)
	}
	node, _ := lib.Discover()
	gpu := node.GPUs[2]
	if changed, err := lib.DisableMIG(gpu.UUID); err != nil || changed {
		t.Fatalf("MIG already off: changed %v, %v", changed, err)
	}
	if _, err := lib.EnableMIG(gpu.UUID); err != nil {
		t.Fatal(err)
	}
	in, err := lib.CreateMIG(gpu.UUID, gpu.MIGProfiles[0].GIProfileID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lib.DisableMIG(gpu.UUID); !nvmlgpu.IsInUse(err) {
		t.Fatalf("disable with an instance: %v, want ERROR_IN_USE", err)
	}
	if err := lib.DestroyMIG(gpu.UUID, in.GIID, in.CIID); err != nil {
		t.Fatal(err)
	}
	if changed, err := lib.DisableMIG(gpu.UUID); err != nil || !changed {
		t.Fatalf("disable: changed %v, %v", changed, err)
	}
	if n, _ := lib.Discover(); n.GPUs[2].MIGEnabled {
		t.Fatal("MIG mode still on")
	}
	l4, _ := OpenMachine(machinePath("l4x4"))
	n4, _ := l4.Discover()
	if _, err := l4.DisableMIG(n4.GPUs[0].UUID); err == nil || !strings.Contains(err.Error(), "does not support MIG") {
		t.Fatalf("L4: %v", err)
	}
}
