package allocator

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// topoClaim is the claim of a demo/topology file, under its own name (a
// test allocates some twice).
func topoClaim(t testing.TB, file, name string) *resourceapi.ResourceClaim {
	c := demoClaim(t, "topology/"+file).DeepCopy()
	c.Name, c.UID = name, types.UID("uid-"+name)
	return c
}

// byIndex asks for one whole GPU by its index, to take it.
func byIndex(i int) step {
	return step{gpuClaim("take-"+itoa(i), 1, fmt.Sprintf(`device.attributes["gpu.facet.dev"].index == %d`, i)), []string{"gpu-" + itoa(i)}}
}

// TestTopologyClaims runs the topology examples (demo/topology) through the
// upstream allocator on the simulated topology machines, in exclusive mode
// (see demo/examples/pair-one-pcie-root.yaml for matchAttribute on 1.35 in
// mig and dynamic mode).
func TestTopologyClaims(t *testing.T) {
	four := func(n string) *resourceapi.ResourceClaim {
		return topoClaim(t, "four-gpus-one-nvlink-domain.yaml", "four-"+n)
	}
	two := func(n string) *resourceapi.ResourceClaim {
		return topoClaim(t, "two-gpus-one-nvlink-domain.yaml", "two-"+n)
	}
	pcieSwitch := func(n string) *resourceapi.ResourceClaim {
		return topoClaim(t, "pair-one-pcie-switch.yaml", "switch-"+n)
	}
	numa := topoClaim(t, "gpus-one-numa-node.yaml", "numa")
	eight := topoClaim(t, "four-gpus-one-nvlink-domain.yaml", "eight")
	eight.Spec.Devices.Requests[0].Exactly.Count = 8
	for _, tc := range []struct {
		name    string
		machine string
		steps   []step
	}{
		{"HGX H100: eight GPUs in one NVLink domain", "hgx-h100", []step{
			{eight, []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
		}},
		{"HGX H100: four in one domain, twice", "hgx-h100", []step{
			{four("1"), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}},
			{four("2"), []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
			{two("1"), nil},
		}},
		{"H100 NVL pairs: no domain of four, a pair fits", "h100-nvl-pairs", []step{
			{four("3"), nil},
			{two("2"), []string{"gpu-0", "gpu-1"}},
			{two("3"), []string{"gpu-2", "gpu-3"}},
			{two("4"), nil},
		}},
		{"H100 NVL pairs: the pair's other GPU taken", "h100-nvl-pairs", []step{
			byIndex(1),
			{two("5"), []string{"gpu-2", "gpu-3"}},
		}},
		{"L40S: no NVLink, pairs under PCIe switches", "l40s-8", []step{
			{two("6"), nil},
			byIndex(0),
			// gpu-1's switch partner is taken: the pair moves to the next switch.
			{pcieSwitch("1"), []string{"gpu-2", "gpu-3"}},
			{numa, []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
			{pcieSwitch("2"), nil},
			{gpuClaim("last", 1), []string{"gpu-1"}},
		}},
		{"HGX H100: NUMA node and PCIe switch", "hgx-h100", []step{
			byIndex(2),
			// NUMA node 0 has three GPUs left: node 1's four.
			{numa, []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
			{pcieSwitch("3"), []string{"gpu-0", "gpu-1"}},
			{pcieSwitch("4"), nil},
		}},
		{"GB200 NVL72 tray: the tray's four GPUs in one domain", "gb200-nvl72-tray", []step{
			{gpuClaim("clique", 4, `device.attributes["gpu.facet.dev"].fabricCliqueID == 32766`), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}},
		}},
		{"GB200 NVL72 tray: four in one domain", "gb200-nvl72-tray", []step{
			{four("4"), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}},
		}},
		{"DGX H100: all eight GPUs in one NVLink domain", "dgx-h100", []step{
			{four("5"), []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}},
			{four("6"), []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}},
			{two("8"), nil},
		}},
		{"L4 node without NVLink: no domain", "l4x4", []step{
			{two("7"), nil},
			{pcieSwitch("5"), nil},
		}},
	} {
		// Whole GPUs in exclusive mode: the same on a stock cluster's
		// allocator (the DRA alpha gates off) as with them on.
		for _, stock := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stock=%v", tc.name, stock), func(t *testing.T) {
				c := NewCluster(nodeSlices(t, tc.machine, "node-a", "--mode", "exclusive"), deviceClasses(t))
				if stock {
					c.Features = &StockFeatures
				}
				run(t, c, "node-a", tc.steps)
			})
		}
	}
}

// TestNVLinkPairGoesToAnotherNode: with one GPU of each H100 NVL pair taken
// on node-a, two of its GPUs are free but no NVLink pair is: the 2-GPU
// domain claim does not fit there and fits on node-b, while a claim
// without the constraint still fits on node-a.
func TestNVLinkPairGoesToAnotherNode(t *testing.T) {
	slices := append(nodeSlices(t, "h100-nvl-pairs", "node-a", "--mode", "exclusive"),
		nodeSlices(t, "h100-nvl-pairs", "node-b", "--mode", "exclusive")...)
	c := NewCluster(slices, deviceClasses(t))
	run(t, c, "node-a", []step{byIndex(0), byIndex(3)})
	two := topoClaim(t, "two-gpus-one-nvlink-domain.yaml", "two")
	ctx := context.Background()
	if res, err := c.Try(ctx, "node-a", two); err != nil || res != nil {
		t.Fatalf("node-a: %v, %v; want no fit (gpu-1 and gpu-2 are in different domains)", res, err)
	}
	res, err := c.Allocate(ctx, "node-b", two)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(Devices(res)); got != "[gpu-0 gpu-1]" {
		t.Errorf("node-b: %s, want [gpu-0 gpu-1]", got)
	}
	if res, err := c.Allocate(ctx, "node-a", gpuClaim("any-two", 2)); err != nil || fmt.Sprint(Devices(res)) != "[gpu-1 gpu-2]" {
		t.Errorf("node-a, no constraint: %v, %v; want [gpu-1 gpu-2]", Devices(res), err)
	}
}

// TestGPUAndNICOnOnePCIeRoot: demo/topology/gpu-and-nic.yaml through the
// upstream allocator on an HGX H100 node, beside a stand-in second DRA
// driver (nic.example.com) that publishes one NIC per PCIe root complex
// with the standard resource.kubernetes.io/pcieRoot: the GPU and the NIC
// the claim gets share a root; with the GPUs under the first root taken,
// they move to the next; where only one root has a NIC, the GPU follows it.
func TestGPUAndNICOnOnePCIeRoot(t *testing.T) {
	_, classes, claims, err := ReadFile(filepath.Join(repo, "demo", "topology", "gpu-and-nic.yaml"))
	if err != nil || len(classes) != 1 || len(claims) != 1 {
		t.Fatalf("demo file: %d classes, %d claims, %v", len(classes), len(claims), err)
	}
	nics := func(roots ...string) *resourceapi.ResourceSlice {
		s := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a-nic"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "nic.example.com", NodeName: ptrTo("node-a"),
				Pool: resourceapi.ResourcePool{Name: "node-a", ResourceSliceCount: 1}},
		}
		for i, r := range roots {
			s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("nic-%d", i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"resource.kubernetes.io/pcieRoot": {StringValue: ptrTo(r)},
			}})
		}
		return s
	}
	claim := func(n string) *resourceapi.ResourceClaim {
		c := claims[0].DeepCopy()
		c.Name, c.UID = "gpu-and-nic-"+n, types.UID("uid-gpu-and-nic-"+n)
		return c
	}
	gpus := nodeSlices(t, "hgx-h100", "node-a", "--mode", "exclusive")
	for _, tc := range []struct {
		name  string
		nics  []string
		steps []step
	}{
		{"a NIC per root: a GPU and the NIC of its root", []string{"pci0000:15", "pci0000:35", "pci0000:95", "pci0000:b5"}, []step{
			{claim("1"), []string{"gpu-0", "nic-0"}},
			// The first root's NIC is taken: the next root's GPU and NIC.
			{claim("2"), []string{"gpu-2", "nic-1"}},
			// The third root's GPUs taken: the fourth's.
			byIndex(4), byIndex(5),
			{claim("3"), []string{"gpu-6", "nic-3"}},
		}},
		{"one NIC, under the third root: the GPU follows it", []string{"pci0000:95"}, []step{
			{claim("4"), []string{"gpu-4", "nic-0"}},
		}},
		{"a NIC under no GPU's root: nothing fits", []string{"pci0000:f0"}, []step{
			{claim("5"), nil},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCluster(append(append([]*resourceapi.ResourceSlice(nil), gpus...), nics(tc.nics...)), append(deviceClasses(t), classes...))
			run(t, c, "node-a", tc.steps)
		})
	}
}
