package allocator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
	"github.com/facet-gpu/facet/test/scale"
)

// BenchmarkAllocateOneMIG times the upstream allocator (v0.35.4, what a 1.35
// kube-scheduler runs) placing a claim for one MIG instance on one node of
// a cluster of simulated 8×H100 nodes: one op is one node's Filter, the
// Allocate call the scheduler makes per candidate node. The allocator
// gathers every node's counter slices on every call (pools_experimental.go
// GatherPools: slices with sharedCounters are kept whatever their node), so
// the cost per node grows with the cluster.
//
// Shapes:
//   - facet-mig: Facet's slices in mig mode (8 counters per GPU: 7 memory
//     slices and media-extensions).
//   - nvidia-15: the same devices with the counter shape NVIDIA's driver
//     publishes for dynamic MIG: 15 counters per GPU (memory,
//     multiprocessors, five engine kinds, 8 memory slices), all 8 counter
//     sets in a single counter slice per node, and every device consuming
//     its share of each.
//   - facet-exclusive: whole GPUs only, no counters (the floor).
//
// Run: go test ./test/allocator/ -run '^$' -bench AllocateOneMIG -benchtime 20x
func BenchmarkAllocateOneMIG(b *testing.B) {
	inv := benchInventory(b, inventory.ModeMIG)
	excl := benchInventory(b, inventory.ModeExclusive)
	shapes := []struct {
		name  string
		node  func(name string) []*resourceapi.ResourceSlice
		claim func() *resourceapi.ResourceClaim
	}{
		{"facet-mig", func(n string) []*resourceapi.ResourceSlice { return facetObjects(inv, n) }, func() *resourceapi.ResourceClaim { return profileClaim("one", "1g.10gb") }},
		{"nvidia-15", func(n string) []*resourceapi.ResourceSlice { return nvidiaShape(inv, n) }, func() *resourceapi.ResourceClaim { return profileClaim("one", "1g.10gb") }},
		{"facet-exclusive", func(n string) []*resourceapi.ResourceSlice { return facetObjects(excl, n) }, func() *resourceapi.ResourceClaim { return gpuClaim("one", 1) }},
	}
	classes := deviceClasses(b)
	for _, shape := range shapes {
		for _, nodes := range []int{100, 500} {
			b.Run(fmt.Sprintf("%s/nodes=%d", shape.name, nodes), func(b *testing.B) {
				var all []*resourceapi.ResourceSlice
				for i := 0; i < nodes; i++ {
					all = append(all, shape.node(fmt.Sprintf("node-%d", i))...)
				}
				perNode := shape.node("node-0")
				size := 0
				for _, s := range perNode {
					data, err := json.Marshal(s)
					if err != nil {
						b.Fatal(err)
					}
					size += len(data)
				}
				c := NewCluster(all, classes)
				ctx := context.Background()
				// Warm the CEL cache, and check the claim fits.
				if res, err := c.Try(ctx, "node-0", shape.claim()); err != nil || res == nil {
					b.Fatalf("claim does not fit: %v", err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					res, err := c.Try(ctx, fmt.Sprintf("node-%d", i%nodes), shape.claim())
					if err != nil || res == nil {
						b.Fatalf("claim does not fit: %v", err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(size), "slice-bytes/node")
				b.ReportMetric(float64(len(perNode)), "slices/node")
			})
		}
	}
}

func benchInventory(b testing.TB, mode inventory.Mode) *inventory.Inventory {
	b.Helper()
	node, err := sim.DiscoverMachine(repo + "/demo/machines/dgx-h100.yaml")
	if err != nil {
		b.Fatal(err)
	}
	inv, err := inventory.Build(node, inventory.Config{DefaultMode: mode})
	if err != nil {
		b.Fatal(err)
	}
	return inv
}

func facetObjects(inv *inventory.Inventory, node string) []*resourceapi.ResourceSlice {
	// As a node whose facet-mps answers publishes its shares and slots.
	inv = inv.WithComputePartitioning(names.PartitioningMPS)
	return resourceslices.Objects(resourceslices.Resources(inv, node), node)
}

// nvidiaShape is Facet's mig-mode pool with NVIDIA's counter shape
// (scale.NVIDIAShape, shared with the scale harness).
func nvidiaShape(inv *inventory.Inventory, node string) []*resourceapi.ResourceSlice {
	return scale.NVIDIAShape(inv, node)
}

// TestBenchmarkShapes keeps the benchmark's shapes honest: both publish
// the same devices, within the API's limits, and the NVIDIA shape has 15
// counters per GPU in one counter slice.
func TestBenchmarkShapes(t *testing.T) {
	node, err := sim.DiscoverMachine(repo + "/demo/machines/dgx-h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Build(node, inventory.Config{DefaultMode: inventory.ModeMIG})
	if err != nil {
		t.Fatal(err)
	}
	facet, nv := facetObjects(inv, "n"), nvidiaShape(inv, "n")
	for _, objs := range [][]*resourceapi.ResourceSlice{facet, nv} {
		for _, err := range resourceslices.CheckLimits(objs) {
			t.Error(err)
		}
	}
	count := func(objs []*resourceapi.ResourceSlice) (devices, counterSlices, counters int) {
		for _, o := range objs {
			devices += len(o.Spec.Devices)
			if len(o.Spec.SharedCounters) > 0 {
				counterSlices++
			}
			for _, cs := range o.Spec.SharedCounters {
				counters += len(cs.Counters)
			}
		}
		return
	}
	fd, fc, fn := count(facet)
	nd, nc, nn := count(nv)
	t.Logf("facet: %d devices, %d counter slices, %d counters; nvidia-15: %d devices, %d counter slices, %d counters", fd, fc, fn, nd, nc, nn)
	if fd != nd || nc != 1 || nn != 8*15 || fn != 8*8 {
		t.Errorf("shapes differ from what the benchmark claims")
	}
	// Both shapes allocate the same claim to the same device.
	for _, objs := range [][]*resourceapi.ResourceSlice{facet, nv} {
		c := NewCluster(objs, deviceClasses(t))
		run(t, c, "n", []step{
			{profileClaim("a", "1g.10gb"), []string{"gpu-0-mig-1g10gb-6"}},
			{profileClaim("b", "4g.40gb"), []string{"gpu-0-mig-4g40gb-0"}},
			{gpuClaim("w", 1, onGPU(0)), nil},
		})
	}
}

// TestDumpBenchShapes writes one node's slices of each benchmark shape as
// YAML to $FACET_BENCH_DUMP (skipped when unset), for running the same
// shapes through another allocator version in a separate module.
func TestDumpBenchShapes(t *testing.T) {
	dir := os.Getenv("FACET_BENCH_DUMP")
	if dir == "" {
		t.Skip("FACET_BENCH_DUMP not set")
	}
	mig, excl := benchInventory(t, inventory.ModeMIG), benchInventory(t, inventory.ModeExclusive)
	for name, objs := range map[string][]*resourceapi.ResourceSlice{
		"facet-mig": facetObjects(mig, "node-0"), "nvidia-15": nvidiaShape(mig, "node-0"), "facet-exclusive": facetObjects(excl, "node-0"),
	} {
		var buf bytes.Buffer
		if err := resourceslices.WriteYAML(&buf, objs, false); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkTopologyAligned times the upstream allocator's Filter on one
// node of a cluster of simulated HGX H100 nodes (demo/machines/hgx-h100:
// eight GPUs in one NVLink domain, two per PCIe switch), exclusive mode, for
// four whole GPUs with and without a topology constraint: what a
// matchAttribute on nvlinkDomain (all eight GPUs share it) and on
// pcieSwitch (four pairs: four GPUs cannot share one, so the allocator
// searches every combination before it gives up) cost the scheduler per
// node.
//
// Run: go test ./test/allocator/ -run '^$' -bench TopologyAligned -benchtime 20x
func BenchmarkTopologyAligned(b *testing.B) {
	node, err := sim.DiscoverMachine(repo + "/demo/machines/hgx-h100.yaml")
	if err != nil {
		b.Fatal(err)
	}
	inv, err := inventory.Build(node, inventory.Config{DefaultMode: inventory.ModeExclusive})
	if err != nil {
		b.Fatal(err)
	}
	aligned := func(attr string) func() *resourceapi.ResourceClaim {
		return func() *resourceapi.ResourceClaim {
			c := gpuClaim("four", 4)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptrTo(resourceapi.FullyQualifiedName(domain + "/" + attr))}}
			return c
		}
	}
	classes := deviceClasses(b)
	for _, shape := range []struct {
		name  string
		claim func() *resourceapi.ResourceClaim
		fits  bool
	}{
		{"unaligned", func() *resourceapi.ResourceClaim { return gpuClaim("four", 4) }, true},
		{"nvlinkDomain", aligned("nvlinkDomain"), true},
		{"pcieSwitch-no-fit", aligned("pcieSwitch"), false},
	} {
		for _, nodes := range []int{100, 500} {
			b.Run(fmt.Sprintf("%s/nodes=%d", shape.name, nodes), func(b *testing.B) {
				var all []*resourceapi.ResourceSlice
				for i := 0; i < nodes; i++ {
					all = append(all, facetObjects(inv, fmt.Sprintf("node-%d", i))...)
				}
				c := NewCluster(all, classes)
				ctx := context.Background()
				if res, err := c.Try(ctx, "node-0", shape.claim()); err != nil || (res != nil) != shape.fits {
					b.Fatalf("fits %v, want %v: %v", res != nil, shape.fits, err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := c.Try(ctx, fmt.Sprintf("node-%d", i%nodes), shape.claim()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
