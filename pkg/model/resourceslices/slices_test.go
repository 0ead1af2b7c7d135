package resourceslices

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/miglayout"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func render(t *testing.T, machine string, cfg inventory.Config) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteYAML(&buf, objects(t, machine, cfg), false); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// discoverDemo discovers a demo machine; "<machine>+mig" is the machine
// with MIG mode on at boot, as an admin leaves an A100 for MIG (Facet does
// not change an A100's MIG mode).
func discoverDemo(t *testing.T, machine string) *nvmlgpu.Node {
	t.Helper()
	name, migOn := strings.CutSuffix(machine, "+mig")
	m, err := sim.LoadMachine(filepath.Join("..", "..", "..", "demo", "machines", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range m.GPUs {
		m.GPUs[i].MIGEnabled = m.GPUs[i].MIGEnabled || migOn
	}
	node, err := sim.DiscoverSimulated(m)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

func objects(t *testing.T, machine string, cfg inventory.Config) []*resourceapi.ResourceSlice {
	t.Helper()
	node := discoverDemo(t, machine)
	if cfg.MIGInstances == nil && cfg.DefaultMode == inventory.ModeStaticMIG {
		cfg.MIGInstances = balanced(t, node)
	}
	inv, err := inventory.Build(node, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return Objects(Resources(inv, "node-a"), "node-a")
}

// TestGolden pins the exact slices of each demo machine.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		machine string
		cfg     inventory.Config
		golden  string
	}{
		{"dgx-h100", inventory.Config{DefaultMode: inventory.ModeExclusive}, "dgx-h100-exclusive.yaml"},
		{"dgx-h100", inventory.Config{}, "dgx-h100-mig.yaml"}, // auto: mig
		{"dgx-h100", inventory.Config{DefaultMode: inventory.ModeShared}, "dgx-h100-shared.yaml"},
		{"dgx-h100", inventory.Config{DefaultMode: inventory.ModeDynamic}, "dgx-h100-dynamic.yaml"},
		{"dgx-h100", inventory.Config{DefaultMode: inventory.ModeExclusive, PerGPU: map[int]inventory.Mode{0: inventory.ModeMIG, 1: inventory.ModeDynamic, 2: inventory.ModeShared}}, "dgx-h100-mixed.yaml"},
		{"sixteen-h100", inventory.Config{DefaultMode: inventory.ModeMIG}, "sixteen-h100-mig.yaml"},
		// One slice per profile; 16 GPUs' 1g.10gb (112) need two.
		{"sixteen-h100", inventory.Config{DefaultMode: inventory.ModeMIG, Order: inventory.OrderProfile}, "sixteen-h100-profile.yaml"},
		// An A100's MIG mode is the admin's: with it on, mig publishes the
		// MIG devices without gpu-<i>.
		{"dgx-a100-40gb+mig", inventory.Config{DefaultMode: inventory.ModeMIG}, "dgx-a100-40gb-mig-on.yaml"},
		{"l4x4", inventory.Config{}, "l4x4-exclusive.yaml"},
		{"l4x4", inventory.Config{DefaultMode: inventory.ModeMIG}, "l4x4-mig.yaml"}, // falls back to exclusive
		// Topology (docs/workloads.md, "Topology"): every device of a GPU
		// carries its NVLink domain, PCIe switch and fabric.
		{"hgx-h100", inventory.Config{DefaultMode: inventory.ModeExclusive}, "hgx-h100-exclusive.yaml"},
		{"h100-nvl-pairs", inventory.Config{DefaultMode: inventory.ModeExclusive, PerGPU: map[int]inventory.Mode{3: inventory.ModeMIG}}, "h100-nvl-pairs-mixed.yaml"},
		{"l40s-8", inventory.Config{}, "l40s-8-exclusive.yaml"},
		{"gb200-nvl72-tray", inventory.Config{DefaultMode: inventory.ModeExclusive, PerGPU: map[int]inventory.Mode{1: inventory.ModeShared}}, "gb200-nvl72-tray-mixed.yaml"},
		// A GB200 tray whose driver offers IMEX channels: the node's IMEX
		// channel device, in the GPUs' slice.
		{"gb200-nvl72-tray", inventory.Config{DefaultMode: inventory.ModeExclusive, IMEXChannels: &simChannels}, "gb200-nvl72-tray-imex.yaml"},
		// Stock 1.35: GA fields only.
		{"dgx-h100", inventory.Config{Features: &stock, DefaultMode: inventory.ModeStaticMIG}, "dgx-h100-static-mig.yaml"},
		{"dgx-h100", inventory.Config{Features: &stock, DefaultMode: inventory.ModeSlots,
			PerGPUSlots: map[int]inventory.SlotLayout{1: mustLayout(t, "1x40Gi/50+2"), 2: mustLayout(t, "2")}}, "dgx-h100-slots.yaml"},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			got := render(t, tc.machine, tc.cfg)
			path := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("slices differ from %s (run with -update if intended):\n%s", path, got)
			}
		})
	}
}

// TestLimits renders every machine in every mode and checks the slices
// against the API's limits and the allocator's cross-references.
func TestLimits(t *testing.T) {
	machines := []string{"dgx-a100-40gb", "dgx-a100-80gb", "dgx-a100-40gb+mig", "dgx-a100-80gb+mig", "dgx-h100", "dgx-h200", "l4x4", "sixteen-h100",
		"hgx-h100", "h100-nvl-pairs", "l40s-8", "gb200-nvl72-tray"}
	for _, machine := range machines {
		for _, mode := range inventory.Modes {
			for _, order := range inventory.Orders {
				cfg := inventory.Config{DefaultMode: mode, Order: order, IMEXChannels: &simChannels}
				t.Run(fmt.Sprintf("%s/%s/%s", machine, mode, order), func(t *testing.T) {
					objs := objects(t, machine, cfg)
					for _, err := range CheckLimits(objs) {
						t.Error(err)
					}
				})
			}
		}
	}
}

// TestCounterSlices: more than 8 MIG GPUs need more than one counter
// slice, and each GPU's devices stay in one slice.
func TestCounterSlices(t *testing.T) {
	objs := objects(t, "sixteen-h100", inventory.Config{DefaultMode: inventory.ModeMIG})
	var counterSlices, sets int
	where := map[string]string{} // GPU → slice
	for _, o := range objs {
		if len(o.Spec.SharedCounters) > 0 {
			counterSlices++
			sets += len(o.Spec.SharedCounters)
		}
		for _, d := range o.Spec.Devices {
			gpu := fmt.Sprint(*d.Attributes["index"].IntValue)
			if s, ok := where[gpu]; ok && s != o.Name {
				t.Errorf("GPU %s has devices in slices %s and %s", gpu, s, o.Name)
			}
			where[gpu] = o.Name
		}
	}
	if counterSlices != 2 || sets != 16 || len(where) != 16 {
		t.Errorf("%d counter slices with %d sets, devices of %d GPUs; want 2, 16, 16", counterSlices, sets, len(where))
	}
	if want := int64(len(objs)); objs[0].Spec.Pool.ResourceSliceCount != want {
		t.Errorf("resourceSliceCount %d, want %d", objs[0].Spec.Pool.ResourceSliceCount, want)
	}
}

// TestCounterOnly: in mig mode the pool's counter sets sit in slices of
// their own, which CounterOnly recognises and ExplainCounterOnly explains
// by name; slices with devices, and every slice of a mode without
// counters, are not counter-only.
func TestCounterOnly(t *testing.T) {
	for _, tc := range []struct {
		name    string
		machine string
		mode    inventory.Mode
		want    []string // the explanations, one per counter-only slice
	}{
		{"mig, 8 GPUs", "dgx-h100", inventory.ModeMIG, []string{"(gpu-0-counters, gpu-1-counters, gpu-2-counters, gpu-3-counters, gpu-4-counters, gpu-5-counters, gpu-6-counters, gpu-7-counters)"}},
		{"mig, 16 GPUs", "sixteen-h100", inventory.ModeMIG, []string{"(gpu-0-counters, ", "(gpu-8-counters, "}},
		{"exclusive", "dgx-h100", inventory.ModeExclusive, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, o := range objects(t, tc.machine, inventory.Config{DefaultMode: tc.mode}) {
				if CounterOnly(o) {
					got = append(got, ExplainCounterOnly(o))
				} else if len(o.Spec.SharedCounters) > 0 {
					t.Errorf("slice %s has counters and devices", o.Name)
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d counter-only slices, want %d: %q", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], "DEVICES <none>") {
					t.Errorf("explanation %d = %q, want it to name %q and DEVICES <none>", i, got[i], w)
				}
			}
		})
	}
}

var stock = features.Stock("test")

func mustLayout(t *testing.T, s string) inventory.SlotLayout {
	t.Helper()
	l, err := inventory.ParseSlotLayout(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// balanced is mig-parted's all-balanced on every MIG GPU of a node, as NVML
// would list it.
func balanced(t *testing.T, node *nvmlgpu.Node) []nvmlgpu.MIGInstance {
	t.Helper()
	var out []nvmlgpu.MIGInstance
	for _, g := range node.GPUs {
		if !g.MIGCapable {
			continue
		}
		plan, err := miglayout.Plan("all-balanced", g.MIGProfiles)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range miglayout.Preview(g, plan) {
			in.UUID = fmt.Sprintf("MIG-%08d-0000-0000-0000-%012d", g.Index, in.GIID)
			out = append(out, in)
		}
	}
	return out
}

// TestStockPublishesOnlyWhatItKeeps renders every machine in every mode for
// a stock 1.35 cluster: a mode that needs an alpha gate is refused, naming
// it, and every other mode's slices carry no field the API server drops.
func TestStockPublishesOnlyWhatItKeeps(t *testing.T) {
	machines := []string{"dgx-a100-40gb", "dgx-a100-80gb", "dgx-a100-40gb+mig", "dgx-a100-80gb+mig", "dgx-h100", "dgx-h200", "l4x4", "sixteen-h100",
		"hgx-h100", "h100-nvl-pairs", "l40s-8", "gb200-nvl72-tray"}
	for _, machine := range machines {
		for _, mode := range inventory.Modes {
			t.Run(fmt.Sprintf("%s/%s", machine, mode), func(t *testing.T) {
				node := discoverDemo(t, machine)
				cfg := inventory.Config{Features: &stock, DefaultMode: mode, MIGInstances: balanced(t, node)}
				inv, err := inventory.Build(node, cfg)
				if needs := mode.Needs(); len(needs) > 0 {
					if err == nil || !strings.Contains(err.Error(), string(needs[0])) {
						t.Fatalf("mode %s on stock: error %v, want one naming %s", mode, err, needs[0])
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				objs := Objects(Resources(inv, "node-a"), "node-a")
				for _, err := range Dropped(objs, stock) {
					t.Error(err)
				}
				for _, err := range CheckLimits(objs) {
					t.Error(err)
				}
			})
		}
	}
}

// TestDroppedSeesEveryGatedField: the guard itself can fail.
func TestDroppedSeesEveryGatedField(t *testing.T) {
	for _, tc := range []struct {
		mode inventory.Mode
		want []string
	}{
		{inventory.ModeMIG, []string{"sharedCounters needs DRAPartitionableDevices", "device gpu-0: consumesCounters needs DRAPartitionableDevices"}},
		{inventory.ModeShared, []string{"device gpu-0: allowMultipleAllocations needs DRAConsumableCapacity", "capacity memory requestPolicy needs DRAConsumableCapacity"}},
	} {
		objs := objects(t, "dgx-h100", inventory.Config{DefaultMode: tc.mode})
		var got []string
		for _, err := range Dropped(objs, stock) {
			got = append(got, err.Error())
		}
		all := strings.Join(got, "\n")
		for _, w := range tc.want {
			if !strings.Contains(all, w) {
				t.Errorf("mode %s: %q not among\n%s", tc.mode, w, all)
			}
		}
		if errs := Dropped(objs, features.AllOn("test")); len(errs) > 0 {
			t.Errorf("mode %s with every gate: %v", tc.mode, errs)
		}
	}
}

// TestTaintedResources: every device of a tainted GPU carries the taint,
// no other does, the slices stay within the tainted limit, and the guard
// sees the taints on a cluster without DRADeviceTaints.
func TestTaintedResources(t *testing.T) {
	for _, tc := range []struct {
		machine string
		cfg     inventory.Config
	}{
		{"dgx-h100", inventory.Config{DefaultMode: inventory.ModeMIG}},
		// 128 slots fit one untainted slice; with a taint at most 64 may.
		{"sixteen-h100", inventory.Config{DefaultMode: inventory.ModeSlots, DefaultSlots: inventory.SlotLayout{{Count: 8}}}},
		{"dgx-h100", inventory.Config{DefaultMode: inventory.ModeShared}},
		{"sixteen-h100", inventory.Config{DefaultMode: inventory.ModeExclusive}},
	} {
		t.Run(tc.machine+"/"+string(tc.cfg.DefaultMode), func(t *testing.T) {
			node, err := sim.DiscoverMachine(filepath.Join("..", "..", "..", "demo", "machines", tc.machine+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			inv, err := inventory.Build(node, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			sick := inv.GPUs[len(inv.GPUs)/2+1]
			taint := resourceapi.DeviceTaint{Key: "gpu.facet.dev/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute}
			objs := Objects(TaintedResources(inv, "node-a", map[string]resourceapi.DeviceTaint{sick.UUID: taint}), "node-a")
			tainted := 0
			for _, s := range objs {
				limit := resourceapi.ResourceSliceMaxDevices
				for _, d := range s.Spec.Devices {
					if len(d.Taints) > 0 || len(d.ConsumesCounters) > 0 {
						limit = resourceapi.ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
					}
				}
				if n := len(s.Spec.Devices); n > limit {
					t.Errorf("slice %s: %d devices, limit %d", s.Name, n, limit)
				}
				for _, d := range s.Spec.Devices {
					dev, _ := inv.Device(d.Name)
					onSick := dev.GPU.UUID == sick.UUID
					if has := len(d.Taints) == 1 && d.Taints[0] == taint; has != onSick {
						t.Errorf("device %s (GPU %d): taints %v", d.Name, dev.GPU.Index, d.Taints)
					}
					if onSick {
						tainted++
					}
				}
			}
			if tainted != len(sick.Devices) {
				t.Errorf("%d devices tainted, GPU %d has %d", tainted, sick.Index, len(sick.Devices))
			}
			var got []string
			for _, err := range Dropped(objs, features.AllOn("test").Apply(features.Overrides{features.DeviceTaints: false})) {
				got = append(got, err.Error())
			}
			if !strings.Contains(strings.Join(got, "\n"), "taints needs DRADeviceTaints") {
				t.Errorf("Dropped did not see the taints: %v", got)
			}
		})
	}
}

// TestComputePartitioningAttribute: vGPU shares and slots, and only they,
// carry the node's default partitioning, so a DeviceClass's CEL can pick
// MPS-partitioned shares; a node that has not set it publishes none.
func TestComputePartitioningAttribute(t *testing.T) {
	node, err := sim.DiscoverMachine(filepath.Join("..", "..", "..", "demo", "machines", "dgx-h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	layout, err := inventory.ParseSlotLayout("1x40Gi/50+2")
	if err != nil {
		t.Fatal(err)
	}
	cfg := inventory.Config{DefaultMode: inventory.ModeExclusive, PerGPU: map[int]inventory.Mode{
		1: inventory.ModeDynamic, 2: inventory.ModeShared, 3: inventory.ModeSlots}, PerGPUSlots: map[int]inventory.SlotLayout{3: layout}}
	for _, value := range []string{"", names.PartitioningMPS, names.PartitioningTimeSliced} {
		inv, err := inventory.Build(node, cfg)
		if err != nil {
			t.Fatal(err)
		}
		inv.ComputePartitioning = value
		tagged := map[string]bool{}
		for _, s := range Objects(Resources(inv, "node-a"), "node-a") {
			for _, d := range s.Spec.Devices {
				if a, ok := d.Attributes[names.AttrComputePartitioning]; ok {
					if a.StringValue == nil || *a.StringValue != value {
						t.Errorf("%q: %s has %v", value, d.Name, a)
					}
					tagged[d.Name] = true
				}
			}
		}
		want := map[string]bool{}
		if value != "" {
			want = map[string]bool{"gpu-1": true, "gpu-2": true, "gpu-3-slot-0": true, "gpu-3-slot-1": true, "gpu-3-slot-2": true}
		}
		if fmt.Sprint(tagged) != fmt.Sprint(want) {
			t.Errorf("%q: tagged %v, want %v", value, tagged, want)
		}
	}
}

// TestVersionIsSemver: NVIDIA's versions become semantic versions the API
// server accepts; a leading zero (580.159.04) would get the slice rejected.
func TestVersionIsSemver(t *testing.T) {
	for in, want := range map[string]string{
		"13.0":       "13.0.0",
		"12.4":       "12.4.0",
		"9.0":        "9.0.0",
		"580.159.04": "580.159.4",
		"535.104.05": "535.104.5",
		"550.54.15":  "550.54.15",
	} {
		got := *Version(in).VersionValue
		if got != want {
			t.Errorf("Version(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStandardAttributes: the resource.kubernetes.io attributes of a GPU's
// PCI device, as deviceattribute's helpers would publish them: never a
// numaNode for numa_node -1, never a pciBusID that is not in BDF notation.
func TestStandardAttributes(t *testing.T) {
	for _, name := range []string{names.StandardPCIBusID, names.StandardNUMANode} {
		if !strings.HasPrefix(name, deviceattribute.StandardDeviceAttributePrefix) {
			t.Errorf("%s is not in %s", name, deviceattribute.StandardDeviceAttributePrefix)
		}
	}
	pcieRoot := string(deviceattribute.StandardDeviceAttributePCIeRoot)
	for _, tc := range []struct {
		name string
		gpu  nvmlgpu.GPU
		want map[string]string
	}{
		{"DGX: all three", nvmlgpu.GPU{PCIBusID: "0000:18:00.0", PCIeRoot: "pci0000:17", NUMANode: 0},
			map[string]string{pcieRoot: "pci0000:17", names.StandardPCIBusID: "0000:18:00.0", names.StandardNUMANode: "0"}},
		{"second socket", nvmlgpu.GPU{PCIBusID: "0000:c1:00.0", PCIeRoot: "pci0000:30", NUMANode: 1},
			map[string]string{pcieRoot: "pci0000:30", names.StandardPCIBusID: "0000:c1:00.0", names.StandardNUMANode: "1"}},
		{"VM: numa_node -1, no numaNode", nvmlgpu.GPU{PCIBusID: "0000:00:06.0", PCIeRoot: "pci0000:00", NUMANode: -1},
			map[string]string{pcieRoot: "pci0000:00", names.StandardPCIBusID: "0000:00:06.0"}},
		{"bus ID not in BDF notation", nvmlgpu.GPU{PCIBusID: "00000000:00:06.0", NUMANode: -1}, map[string]string{}},
		{"nothing known", nvmlgpu.GPU{NUMANode: -1}, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
			standardAttributes(attrs, &tc.gpu)
			got := map[string]string{}
			for n, a := range attrs {
				switch {
				case a.StringValue != nil:
					got[string(n)] = *a.StringValue
				case a.IntValue != nil:
					got[string(n)] = fmt.Sprint(*a.IntValue)
				default:
					t.Errorf("%s: neither a string nor an int", n)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTopologyAttributes: in every mode, each device of a GPU (whole, MIG,
// share, slot) carries the GPU's topology attributes and no others'; a
// GPU whose NVML does not support NVLink has no NVLink attribute, and one
// on a root port no pcieSwitch.
func TestTopologyAttributes(t *testing.T) {
	topo := []resourceapi.QualifiedName{names.AttrNVLinkDomain, names.AttrNVLinkLinks, names.AttrNVLinkBandwidth,
		names.AttrPCIeSwitch, names.AttrFabricCluster, names.AttrFabricClique}
	for _, tc := range []struct {
		machine string
		// want is GPU 0's topology attributes; "domain" stands for its
		// NVLink domain, which must be shared as wantShared says.
		want map[resourceapi.QualifiedName]string
		// wantShared lists, per GPU index, the GPUs in its domain.
		wantShared map[int][]int
	}{
		{"hgx-h100", map[resourceapi.QualifiedName]string{names.AttrNVLinkDomain: "domain", names.AttrNVLinkLinks: "18",
			names.AttrNVLinkBandwidth: "900", names.AttrPCIeSwitch: "0000:16:00.0"},
			map[int][]int{0: {0, 1, 2, 3, 4, 5, 6, 7}}},
		{"h100-nvl-pairs", map[resourceapi.QualifiedName]string{names.AttrNVLinkDomain: "domain", names.AttrNVLinkLinks: "12",
			names.AttrNVLinkBandwidth: "600"},
			map[int][]int{0: {0, 1}, 2: {2, 3}}},
		{"l40s-8", map[resourceapi.QualifiedName]string{names.AttrPCIeSwitch: "0000:16:00.0"}, nil},
		{"gb200-nvl72-tray", map[resourceapi.QualifiedName]string{names.AttrNVLinkDomain: "domain", names.AttrNVLinkLinks: "18",
			names.AttrNVLinkBandwidth: "1800", names.AttrFabricCluster: "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b", names.AttrFabricClique: "32766"},
			map[int][]int{0: {0, 1, 2, 3}}},
		{"dgx-h100", map[resourceapi.QualifiedName]string{names.AttrNVLinkDomain: "domain", names.AttrNVLinkLinks: "18",
			names.AttrNVLinkBandwidth: "900"},
			map[int][]int{0: {0, 1, 2, 3, 4, 5, 6, 7}}},
		{"l4x4", map[resourceapi.QualifiedName]string{}, nil},
	} {
		for _, mode := range inventory.Modes {
			t.Run(tc.machine+"/"+string(mode), func(t *testing.T) {
				byGPU := map[int64]map[resourceapi.QualifiedName]string{}
				for _, o := range objects(t, tc.machine, inventory.Config{DefaultMode: mode}) {
					for _, d := range o.Spec.Devices {
						idx := *d.Attributes[names.AttrIndex].IntValue
						got := map[resourceapi.QualifiedName]string{}
						for _, n := range topo {
							if a, ok := d.Attributes[n]; ok {
								if a.StringValue != nil {
									got[n] = *a.StringValue
								} else {
									got[n] = fmt.Sprint(*a.IntValue)
								}
							}
						}
						if prev, ok := byGPU[idx]; ok && fmt.Sprint(prev) != fmt.Sprint(got) {
							t.Errorf("%s: %v, but another device of GPU %d has %v", d.Name, got, idx, prev)
						}
						byGPU[idx] = got
					}
				}
				if len(byGPU) == 0 {
					t.Fatal("no devices")
				}
				g0 := byGPU[0]
				want := map[resourceapi.QualifiedName]string{}
				for n, v := range tc.want {
					want[n] = v
					if v == "domain" {
						want[n] = g0[n]
						if g0[n] == "" {
							t.Errorf("GPU 0 has no %s", n)
						}
					}
				}
				if fmt.Sprint(g0) != fmt.Sprint(want) {
					t.Errorf("GPU 0: %v, want %v", g0, want)
				}
				for i, members := range tc.wantShared {
					in := map[int64]bool{}
					for _, j := range members {
						in[int64(j)] = true
					}
					for j, attrs := range byGPU {
						same := attrs[names.AttrNVLinkDomain] == byGPU[int64(i)][names.AttrNVLinkDomain]
						if same != in[j] {
							t.Errorf("GPU %d in GPU %d's NVLink domain: %v, want %v", j, i, same, in[j])
						}
					}
				}
			})
		}
	}
}

// TestMIGModeFixedSlices: an A100's MIG mode is the admin's (Facet does
// not change it). In mig mode, an A100 node with MIG mode off publishes
// whole GPUs only, and one with MIG mode on MIG devices only; an H100 node
// both, whatever its MIG mode at boot.
func TestMIGModeFixedSlices(t *testing.T) {
	for _, tc := range []struct {
		machine    string
		whole, mig bool
	}{
		{"dgx-a100-80gb", true, false},
		{"dgx-a100-80gb+mig", false, true},
		{"dgx-h100", true, true},
		{"dgx-h100+mig", true, true},
	} {
		t.Run(tc.machine, func(t *testing.T) {
			types := map[string]int{}
			for _, s := range objects(t, tc.machine, inventory.Config{DefaultMode: inventory.ModeMIG}) {
				for _, d := range s.Spec.Devices {
					types[*d.Attributes[names.AttrType].StringValue]++
				}
			}
			if (types[names.KindGPU] == 8) != tc.whole || (types[names.KindMIG] > 0) != tc.mig || len(types) > 2 {
				t.Errorf("devices by type %v; want whole GPUs %v, MIG devices %v", types, tc.whole, tc.mig)
			}
		})
	}
}

// simChannels are the simulated driver's IMEX channels.
var simChannels = func() nvmlgpu.IMEXChannels {
	major, count := sim.SimulatedIMEXChannels()
	return nvmlgpu.IMEXChannels{Major: major, Count: count}
}()

// TestIMEXChannelDevice: a node publishes one imex-channel device, with
// its type and the GPUs' fabric clique and nothing else, where the driver
// offers channels and the GPUs are in one clique; in the last slice of
// the GPUs' devices, in every mode and order.
func TestIMEXChannelDevice(t *testing.T) {
	for _, tc := range []struct {
		machine  string
		channels *nvmlgpu.IMEXChannels
		want     bool
	}{
		{"gb200-nvl72-tray", &simChannels, true},
		// Compute domains off, or no channels from the driver.
		{"gb200-nvl72-tray", nil, false},
		// No multi-node fabric: the driver's channels are no use.
		{"dgx-h100", &simChannels, false},
		{"hgx-h100", &simChannels, false},
	} {
		for _, mode := range inventory.Modes {
			for _, order := range inventory.Orders {
				t.Run(fmt.Sprintf("%s/%v/%s/%s", tc.machine, tc.channels != nil, mode, order), func(t *testing.T) {
					objs := objects(t, tc.machine, inventory.Config{DefaultMode: mode, Order: order, IMEXChannels: tc.channels})
					var found []string
					for i, o := range objs {
						for _, d := range o.Spec.Devices {
							if d.Name != names.IMEXChannelDevice {
								continue
							}
							found = append(found, o.Name)
							if i != len(objs)-1 {
								t.Errorf("imex-channel in slice %d of %d, want the last", i, len(objs))
							}
							got := map[string]string{}
							for n, a := range d.Attributes {
								if a.StringValue != nil {
									got[string(n)] = *a.StringValue
								} else {
									got[string(n)] = fmt.Sprint(*a.IntValue)
								}
							}
							want := map[string]string{"type": "imex-channel", "fabricClusterUUID": "6f1a2b3c-4d5e-4f60-8a1b-2c3d4e5f6a7b", "fabricCliqueID": "32766"}
							if fmt.Sprint(got) != fmt.Sprint(want) || len(d.Capacity) > 0 || d.AllowMultipleAllocations != nil || len(d.ConsumesCounters) > 0 {
								t.Errorf("imex-channel device %+v, want attributes %v and nothing else", d, want)
							}
						}
					}
					if (len(found) == 1) != tc.want || len(found) > 1 {
						t.Errorf("imex-channel devices in slices %v, want %v", found, tc.want)
					}
				})
			}
		}
	}
}

// TestIMEXChannelPlacement: the channel joins the last device slice while
// it has room under that slice's limit, and takes a slice of its own
// otherwise.
func TestIMEXChannelPlacement(t *testing.T) {
	devs := func(n int, counters bool) []resourceapi.Device {
		out := make([]resourceapi.Device, n)
		for i := range out {
			out[i].Name = fmt.Sprintf("d-%d", i)
			if counters {
				out[i].ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "c"}}
			}
		}
		return out
	}
	ch := imexChannelDevice(&inventory.IMEXChannel{ClusterUUID: "u", CliqueID: 1})
	for _, tc := range []struct {
		name   string
		slices []resourceslice.Slice
		want   []int // devices per slice after
	}{
		{"room", []resourceslice.Slice{{Devices: devs(8, false)}}, []int{9}},
		{"plain slice full", []resourceslice.Slice{{Devices: devs(MaxDevicesPerSlice, false)}}, []int{MaxDevicesPerSlice, 1}},
		{"counter slice at 63", []resourceslice.Slice{{Devices: devs(MaxDevicesPerSliceCounters-1, true)}}, []int{MaxDevicesPerSliceCounters}},
		{"counter slice full", []resourceslice.Slice{{Devices: devs(MaxDevicesPerSliceCounters, true)}}, []int{MaxDevicesPerSliceCounters, 1}},
		{"counters only", []resourceslice.Slice{{SharedCounters: []resourceapi.CounterSet{{Name: "c"}}}}, []int{0, 1}},
		{"nothing", nil, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := withIMEXChannel(tc.slices, ch)
			var n []int
			for _, s := range got {
				n = append(n, len(s.Devices))
			}
			if fmt.Sprint(n) != fmt.Sprint(tc.want) {
				t.Errorf("devices per slice %v, want %v", n, tc.want)
			}
			last := got[len(got)-1].Devices
			if last[len(last)-1].Name != names.IMEXChannelDevice {
				t.Errorf("the last device is %s", last[len(last)-1].Name)
			}
		})
	}
}
