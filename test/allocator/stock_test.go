package allocator

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/miglayout"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
)

var stockGates = features.Stock("test")

// stockNode is the dgx-h100 on a stock 1.35 cluster: GPUs 0-1 in
// static-mig with mig-parted's all-balanced, 2-3 with all-1g.10gb, GPUs 4-5
// in slots (4: "1x40Gi/50+2", 5: four equal), 6-7 whole GPUs.
func stockNode(t testing.TB, name string) []*resourceapi.ResourceSlice {
	t.Helper()
	node, err := sim.DiscoverMachine(repo + "/demo/machines/dgx-h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var instances []nvmlgpu.MIGInstance
	for i, layout := range []string{"all-balanced", "all-balanced", "all-1g.10gb", "all-1g.10gb"} {
		plan, err := miglayout.Plan(layout, node.GPUs[i].MIGProfiles)
		if err != nil {
			t.Fatal(err)
		}
		instances = append(instances, miglayout.Preview(node.GPUs[i], plan)...)
	}
	mixed, err := inventory.ParseSlotLayout("1x40Gi/50+2")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Build(node, inventory.Config{
		Features: &stockGates, DefaultMode: inventory.ModeExclusive,
		PerGPU:       map[int]inventory.Mode{0: inventory.ModeStaticMIG, 1: inventory.ModeStaticMIG, 2: inventory.ModeStaticMIG, 3: inventory.ModeStaticMIG, 4: inventory.ModeSlots, 5: inventory.ModeSlots},
		PerGPUSlots:  map[int]inventory.SlotLayout{4: mixed},
		MIGInstances: instances,
	})
	if err != nil {
		t.Fatal(err)
	}
	inv.ComputePartitioning = names.PartitioningMPS
	objs := resourceslices.Objects(resourceslices.Resources(inv, name), name)
	if errs := resourceslices.Dropped(objs, stockGates); len(errs) > 0 {
		t.Fatalf("stock slices with dropped fields: %v", errs)
	}
	return objs
}

func stockCluster(t testing.TB, nodes ...string) *Cluster {
	var all []*resourceapi.ResourceSlice
	for _, n := range nodes {
		all = append(all, stockNode(t, n)...)
	}
	c := NewCluster(all, deviceClasses(t))
	f := StockFeatures
	c.Features = &f
	return c
}

// slotClaim asks for count vGPU slots of at least memory and cores
// (either may be empty), as the extended-resource webhook writes for
// Volcano's and HAMi's resources.
func slotClaim(name string, count int64, memory, cores string, sameGPU bool) *resourceapi.ResourceClaim {
	var sel []string
	if memory != "" {
		sel = append(sel, fmt.Sprintf(`device.capacity["%s"].memory.compareTo(quantity(%q)) >= 0`, domain, memory))
	}
	if cores != "" {
		sel = append(sel, fmt.Sprintf(`device.capacity["%s"].cores.compareTo(quantity(%q)) >= 0`, domain, cores))
	}
	c := claim(name, request("vgpu", "vgpu-slot.facet.dev", count, sel...))
	if sameGPU {
		attr := resourceapi.FullyQualifiedName(domain + "/parentUUID")
		c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: &attr}}
	}
	return c
}

// TestStockShapes allocates, with the allocator of a stock 1.35 scheduler,
// the three GA shapes: the smallest static MIG instance and the smallest
// slot that fit each request, whole GPUs, and never one device twice.
func TestStockShapes(t *testing.T) {
	ctx := context.Background()
	c := stockCluster(t, "node-a")
	tests := []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string // "" = does not fit
	}{
		// A "3 GB" request: the smallest instance that holds it, a 1g.10gb.
		{"3gb-mig", migClaim("3gb", `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("3Gi")) >= 0`), "gpu-0-mig-1g10gb-3"},
		{"15gb-mig", migClaim("15gb", `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("15Gi")) >= 0`), "gpu-0-mig-2g20gb-0"},
		{"profile", profileClaim("p", "3g.40gb"), "gpu-0-mig-3g40gb-4"},
		// Volcano's 20 % / 2000 MiB and HAMi's 50 % / 3000 MiB.
		{"volcano", slotClaim("volcano", 1, "2000Mi", "20", false), "gpu-4-slot-0"},
		{"hami", slotClaim("hami", 1, "3000Mi", "50", false), "gpu-4-slot-2"},
		{"quarter", slotClaim("quarter", 1, "20059Mi", "25", false), "gpu-4-slot-1"}, // (81079 - 40960) / 2 MiB
		{"too-big", slotClaim("too-big", 1, "50Gi", "", false), ""},
		{"whole", gpuClaim("whole", 1), "gpu-6"},
	}
	for _, tc := range tests {
		res, err := c.Allocate(ctx, "node-a", tc.claim)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := ""
		if res != nil {
			got = Devices(res)[0]
		}
		if got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestStockNeverDoubleBooks creates a mix of claims until nothing fits,
// over random slice orders, and checks that no device, and so no piece of
// a GPU, is given twice: on stock 1.35 each published device is a disjoint
// piece of hardware, so device-level exclusivity is GPU-level safety.
func TestStockNeverDoubleBooks(t *testing.T) {
	ctx := context.Background()
	c := stockCluster(t, "node-a")
	c.Shuffle = rand.New(rand.NewSource(1))
	held := map[string]string{}
	makers := []func(int) *resourceapi.ResourceClaim{
		func(i int) *resourceapi.ResourceClaim { return gpuClaim(fmt.Sprint("g", i), 1) },
		func(i int) *resourceapi.ResourceClaim { return profileClaim(fmt.Sprint("m", i), "1g.10gb") },
		func(i int) *resourceapi.ResourceClaim { return migClaim(fmt.Sprint("M", i)) },
		func(i int) *resourceapi.ResourceClaim { return slotClaim(fmt.Sprint("s", i), 1, "1Gi", "", false) },
	}
	allocated := 0
	for i := 0; i < 200; i++ {
		cl := makers[i%len(makers)](i)
		res, err := c.Allocate(ctx, "node-a", cl)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range Devices(res) {
			if prev, dup := held[d]; dup {
				t.Fatalf("device %s given to %s and %s", d, prev, cl.Name)
			}
			held[d] = cl.Name
			allocated++
		}
	}
	// 4 + 4 + 7 + 7 instances, 3 + 4 slots, 2 whole GPUs.
	if allocated != 31 {
		t.Errorf("%d devices allocated, want all 31", allocated)
	}
}

// BenchmarkStockSlots times one node's Filter on a stock 1.35 scheduler
// for slot claims on a cluster of stock dgx-h100 nodes: one slot, and k
// slots of one GPU (count k with matchAttribute on parentUUID), which
// multi-slot workloads need and the allocator answers by backtracking.
//
// Run: go test ./test/allocator/ -run '^$' -bench StockSlots -benchtime 20x
func BenchmarkStockSlots(b *testing.B) {
	ctx := context.Background()
	for _, nodes := range []int{100, 500} {
		names := make([]string, nodes)
		for i := range names {
			names[i] = fmt.Sprintf("node-%d", i)
		}
		c := stockCluster(b, names...)
		for _, tc := range []struct {
			name  string
			claim func() *resourceapi.ResourceClaim
		}{
			{"one-slot", func() *resourceapi.ResourceClaim { return slotClaim("one", 1, "2000Mi", "20", false) }},
			{"two-slots-same-gpu", func() *resourceapi.ResourceClaim { return slotClaim("two", 2, "2000Mi", "20", true) }},
			{"four-slots-same-gpu", func() *resourceapi.ResourceClaim { return slotClaim("four", 4, "", "", true) }},
			{"static-mig-3gb", func() *resourceapi.ResourceClaim {
				return migClaim("mig", `device.capacity["gpu.facet.dev"].memory.compareTo(quantity("3Gi")) >= 0`)
			}},
			{"whole-gpu", func() *resourceapi.ResourceClaim { return gpuClaim("whole", 1) }},
		} {
			b.Run(fmt.Sprintf("%s/nodes=%d", tc.name, nodes), func(b *testing.B) {
				if res, err := c.Try(ctx, "node-0", tc.claim()); err != nil || res == nil {
					b.Fatalf("claim does not fit: %v", err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if res, err := c.Try(ctx, names[i%nodes], tc.claim()); err != nil || res == nil {
						b.Fatalf("claim does not fit: %v", err)
					}
				}
			})
		}
	}
}
