package slices

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/features"
	"github.com/facet-gpu/facet/pkg/inventory"
	"github.com/facet-gpu/facet/pkg/miglayout"
	"github.com/facet-gpu/facet/pkg/nvml"
	"github.com/facet-gpu/facet/pkg/nvml/sim"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func render(t *testing.T, machine string, cfg inventory.Config) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteYAML(&buf, objects(t, machine, cfg)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func objects(t *testing.T, machine string, cfg inventory.Config) []*resourceapi.ResourceSlice {
	t.Helper()
	node, err := sim.DiscoverMachine(filepath.Join("..", "..", "demo", "machines", machine+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
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
		{"l4x4", inventory.Config{}, "l4x4-exclusive.yaml"},
		{"l4x4", inventory.Config{DefaultMode: inventory.ModeMIG}, "l4x4-mig.yaml"}, // falls back to exclusive
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
	machines := []string{"dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "l4x4", "sixteen-h100"}
	for _, machine := range machines {
		for _, mode := range inventory.Modes {
			for _, order := range inventory.Orders {
				cfg := inventory.Config{DefaultMode: mode, Order: order}
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
func balanced(t *testing.T, node *nvml.Node) []nvml.MIGInstance {
	t.Helper()
	var out []nvml.MIGInstance
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
	machines := []string{"dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "l4x4", "sixteen-h100"}
	for _, machine := range machines {
		for _, mode := range inventory.Modes {
			t.Run(fmt.Sprintf("%s/%s", machine, mode), func(t *testing.T) {
				node, err := sim.DiscoverMachine(filepath.Join("..", "..", "demo", "machines", machine+".yaml"))
				if err != nil {
					t.Fatal(err)
				}
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
