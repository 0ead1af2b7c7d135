// Package occtest builds the objects occupancy and fit tests run on: a
// node's ResourceSlices as the plugin renders them (facetctl's own
// rendering), and ResourceClaims with status.allocation set, as the
// scheduler leaves them.
package occtest

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
)

// Node describes a simulated node: n GPUs of a model, modes per GPU
// ("0=mig,1=shared" as the plugin's --gpu-modes), and MIG layouts for
// static-mig GPUs ("2=all-balanced" as --mig-layouts).
type Node struct {
	Name string
	// Machine, when set, is a machine file of demo/machines (without
	// .yaml), its topology included, instead of Model and GPUs.
	Machine string
	Model   string
	GPUs    int
	Modes   string
	Layout  string
	// Slots is the --gpu-slots value for slots GPUs; empty: four equal.
	Slots string
}

// Slices renders the node's ResourceSlices exactly as `facetctl slices`.
func Slices(t testing.TB, n Node) []*resourceapi.ResourceSlice {
	t.Helper()
	m := &sim.Machine{Name: n.Name, DriverVersion: "580.159.04", CUDADriverVersion: "13.0"}
	for range n.GPUs {
		m.GPUs = append(m.GPUs, sim.MachineGPU{Model: n.Model, MIGEnabled: true})
	}
	if n.Machine != "" {
		_, self, _, _ := runtime.Caller(0)
		var err error
		if m, err = sim.LoadMachine(filepath.Join(filepath.Dir(self), "..", "..", "..", "demo", "machines", n.Machine+".yaml")); err != nil {
			t.Fatal(err)
		}
	}
	node, err := sim.DiscoverSimulated(m)
	if err != nil {
		t.Fatal(err)
	}
	cfg := inventory.Config{DefaultMode: inventory.ModeExclusive}
	if n.Modes != "" {
		if cfg.PerGPU, err = inventory.ParsePerGPU(n.Modes, "mode", inventory.ParseMode); err != nil {
			t.Fatal(err)
		}
	}
	if n.Slots != "" {
		if cfg.PerGPUSlots, err = inventory.ParsePerGPU(n.Slots, "slots", inventory.ParseSlotLayout); err != nil {
			t.Fatal(err)
		}
	}
	var layouts map[int]string
	if n.Layout != "" {
		if layouts, err = inventory.ParsePerGPU(n.Layout, "layout", func(s string) (string, error) { return s, nil }); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := nodemodel.Build(node, cfg, nodemodel.Options{Layouts: layouts})
	if err != nil {
		t.Fatal(err)
	}
	// As a node whose facet-mps answers publishes its shares and slots.
	inv.ComputePartitioning = names.PartitioningMPS
	return resourceslices.Objects(resourceslices.Resources(inv, n.Name), n.Name)
}

// Result is one allocated device of a node's pool.
func Result(node, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: names.Driver, Pool: node, Device: device}
}

// Share is an allocated vGPU share of memory and cores (percent).
func Share(node, device, id, memory string, cores int64) resourceapi.DeviceRequestAllocationResult {
	r := Result(node, device)
	r.ShareID = ptr.To(types.UID(id))
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		"memory": resource.MustParse(memory),
		"cores":  *resource.NewQuantity(cores, resource.DecimalSI),
	}
	return r
}

// Allocated is a claim "ns/name" the scheduler allocated these results.
func Allocated(nsName string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	ns, name, ok := strings.Cut(nsName, "/")
	if !ok {
		panic(fmt.Sprintf("claim %q: want namespace/name", nsName))
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Results: results},
		}},
	}
}

// WithChannel adds the node's IMEX channel device (type imex-channel, the
// compute-domain design's) of a fabric clique to its first slice, as a
// GB200-class node's plugin publishes it; clique < 0: without fabric
// attributes.
func WithChannel(slices []*resourceapi.ResourceSlice, clusterUUID string, clique int64) []*resourceapi.ResourceSlice {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{names.AttrType: {StringValue: ptr.To("imex-channel")}}
	if clique >= 0 {
		attrs[names.AttrFabricCluster] = resourceapi.DeviceAttribute{StringValue: ptr.To(clusterUUID)}
		attrs[names.AttrFabricClique] = resourceapi.DeviceAttribute{IntValue: ptr.To(clique)}
	}
	slices[0].Spec.Devices = append(slices[0].Spec.Devices, resourceapi.Device{Name: "imex-channel", Attributes: attrs})
	return slices
}
