// Package scale measures scheduling through a real kube-apiserver and
// kube-scheduler with hundreds of bare Nodes, each publishing Facet's
// ResourceSlices, or NVIDIA's driver's, for a simulated machine
// (hack/scale runs it; `make bench-scale`). Nothing here is linked into
// the shipped binaries.
package scale

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
)

// domain is Facet's attribute and capacity domain.
const domain = "gpu.facet.dev"

// Shape is one way of publishing a machine's GPUs, with the claim each pod
// of the run makes.
type Shape struct {
	// Name is unique; Family is what the table compares across drivers
	// (exclusive, static-mig, mig, shared, slots), Driver is "Facet" or
	// "NVIDIA".
	Name, Family, Driver string
	// NA, when set, says why NVIDIA's driver has no equivalent of the
	// family: the shape is not run and the table says n/a.
	NA string
	// Gates says whether the cluster runs with Facet's DRA alpha gates on
	// ("on") or as stock Kubernetes 1.35 ("stock").
	Gates string
	// Node returns the ResourceSlices of one node.
	Node func(node string) []*resourceapi.ResourceSlice
	// Claim returns the claim of one pod.
	Claim func(name string) *resourceapi.ResourceClaim
	// PerNode is how many claims one node holds (bounds the pods of a run).
	PerNode int
	// Classes are DeviceClasses the shape needs besides Facet's.
	Classes []*resourceapi.DeviceClass
}

// GPUsPerNode is the number of GPUs of the DGX H100 machine file.
const GPUsPerNode = 8

// GatesOn is the feature-gate list for "on" (hack/cluster/up.sh's default).
const GatesOn = "DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRAExtendedResource=true,DRADeviceTaints=true"

// Shapes builds every shape for the machine file (demo/machines/dgx-h100.yaml).
func Shapes(machine string) ([]Shape, error) {
	node, err := sim.DiscoverMachine(machine)
	if err != nil {
		return nil, err
	}
	stock, on := features.Stock("scale"), features.AllOn("scale")
	// build is the node's inventory in one mode; a failure names the mode.
	var errs []error
	build := func(mode inventory.Mode, set *features.Set, layouts map[int]string) *inventory.Inventory {
		inv, err := nodemodel.Build(node, inventory.Config{DefaultMode: mode, Features: set}, nodemodel.Options{Layouts: layouts})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", mode, err))
		}
		return inv
	}
	allSmall := make(map[int]string, len(node.GPUs))
	for _, g := range node.GPUs {
		allSmall[g.Index] = "all-1g.10gb"
	}
	excl := build(inventory.ModeExclusive, &stock, nil)
	static := build(inventory.ModeStaticMIG, &stock, allSmall)
	mig := build(inventory.ModeMIG, &on, nil)
	shared := build(inventory.ModeShared, &on, nil)
	slots := build(inventory.ModeSlots, &stock, nil)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	gpus := len(node.GPUs)
	profile := func(name string) *resourceapi.ResourceClaim {
		return Claim(name, Request("mig", "mig.facet.dev", fmt.Sprintf(`device.attributes["%s"].profile == "1g.10gb"`, domain)))
	}
	nvidiaProfile := func(name string) *resourceapi.ResourceClaim {
		return Claim(name, Request("mig", "mig.nvidia.com", fmt.Sprintf(`device.attributes["%s"].profile == "1g.10gb"`, NVIDIADriver)))
	}
	return []Shape{
		{Name: "exclusive", Family: "exclusive", Driver: "Facet", Gates: "stock", Node: facet(excl), PerNode: gpus,
			Claim: func(n string) *resourceapi.ResourceClaim { return Claim(n, Request("gpu", "gpu.facet.dev")) }},
		{Name: "nvidia-exclusive", Family: "exclusive", Driver: "NVIDIA", Gates: "stock", PerNode: gpus, Classes: NVIDIAClasses(),
			Node:  func(n string) []*resourceapi.ResourceSlice { return NVIDIAGPUs(excl, n) },
			Claim: func(n string) *resourceapi.ResourceClaim { return Claim(n, Request("gpu", "gpu.nvidia.com")) }},
		{Name: "static-mig", Family: "static-mig", Driver: "Facet", Gates: "stock", Node: facet(static), PerNode: 7 * gpus, Claim: profile},
		{Name: "nvidia-static-mig", Family: "static-mig", Driver: "NVIDIA", Gates: "stock", PerNode: 7 * gpus, Classes: NVIDIAClasses(),
			Node: func(n string) []*resourceapi.ResourceSlice { return NVIDIAStaticMIG(static, n) }, Claim: nvidiaProfile},
		{Name: "mig", Family: "mig", Driver: "Facet", Gates: "on", Node: facet(mig), PerNode: 7 * gpus, Claim: profile},
		// NVIDIA's dynamic-MIG counters on Facet's devices (and classes).
		{Name: "nvidia-mig", Family: "mig", Driver: "NVIDIA", Gates: "on", Node: func(n string) []*resourceapi.ResourceSlice { return NVIDIAShape(mig, n) }, PerNode: 7 * gpus, Claim: profile},
		// 8Gi shares: as many as the memory holds (10 % cores each).
		{Name: "shared", Family: "shared", Driver: "Facet", Gates: "on", Node: facet(shared), PerNode: min(int(node.GPUs[0].MemoryBytes>>30)/8, 10) * gpus,
			Claim: func(n string) *resourceapi.ResourceClaim {
				r := Request("vgpu", "vgpu.facet.dev")
				r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse("8Gi"), "cores": resource.MustParse("10"),
				}}
				return Claim(n, r)
			}},
		{Name: "nvidia-shared", Family: "shared", Driver: "NVIDIA",
			NA: "no device with consumable capacity: NVIDIA shares a whole GPU by time-slicing or MPS in the claim's config, not in the slice"},
		{Name: "slots", Family: "slots", Driver: "Facet", Gates: "stock", Node: facet(slots), PerNode: 4 * gpus,
			Claim: func(n string) *resourceapi.ResourceClaim {
				return Claim(n, Request("vgpu", "vgpu-slot.facet.dev", fmt.Sprintf(`device.capacity["%s"].memory.compareTo(quantity("8Gi")) >= 0`, domain)))
			}},
		{Name: "nvidia-slots", Family: "slots", Driver: "NVIDIA",
			NA: "no share devices: NVIDIA publishes whole GPUs and MIG devices only"},
	}, nil
}

func facet(inv *inventory.Inventory) func(string) []*resourceapi.ResourceSlice {
	// As a node whose facet-mps answers publishes its shares and slots.
	inv = inv.WithComputePartitioning(names.PartitioningMPS)
	return func(node string) []*resourceapi.ResourceSlice {
		return resourceslices.Objects(resourceslices.Resources(inv, node), node)
	}
}

// Request is an exact request for one device of a class, with CEL selectors.
func Request(name, class string, selectors ...string) resourceapi.DeviceRequest {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: 1, AllocationMode: resourceapi.DeviceAllocationModeExactCount}
	for _, s := range selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return resourceapi.DeviceRequest{Name: name, Exactly: &req}
}

// Claim is a ResourceClaim of requests.
func Claim(name string, reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
	}
}

// NVIDIAShape rebuilds Facet's mig-mode pool (inv must be in mig mode) with
// the counter shape NVIDIA's DRA driver publishes for dynamic MIG: one
// counter slice with every GPU's set of 15 counters (memory,
// multiprocessors, five engine kinds, 8 memory slices), the same devices
// in the same device slices, each consuming what NVIDIA's driver has it
// consume. (Moved here from test/allocator, which uses it too.)
func NVIDIAShape(inv *inventory.Inventory, node string) []*resourceapi.ResourceSlice {
	objs := resourceslices.Objects(resourceslices.Resources(inv, node), node)
	q := func(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }
	counters := func(memory uint64, sms, ce, dec, enc, jpg, ofa int, start, size int) map[string]resourceapi.Counter {
		m := map[string]resourceapi.Counter{
			"memory":          {Value: *resource.NewQuantity(int64(memory), resource.BinarySI)},
			"multiprocessors": {Value: q(int64(sms))},
			"copy-engines":    {Value: q(int64(ce))},
			"decoders":        {Value: q(int64(dec))},
			"encoders":        {Value: q(int64(enc))},
			"jpeg-engines":    {Value: q(int64(jpg))},
			"ofa-engines":     {Value: q(int64(ofa))},
		}
		for k := start; k < start+size; k++ {
			m[fmt.Sprintf("memory-slice-%d", k)] = resourceapi.Counter{Value: q(1)}
		}
		return m
	}
	var sets []resourceapi.CounterSet
	full := map[string]map[string]resourceapi.Counter{}
	for _, g := range inv.GPUs {
		var top nvmlgpu.MIGProfile
		for _, p := range g.MIGProfiles {
			if p.SliceCount > top.SliceCount {
				top = p
			}
		}
		name := fmt.Sprintf("gpu-%d-counter-set", g.Index)
		full[name] = counters(g.MemoryBytes, top.Multiprocessors, top.CopyEngines, top.Decoders, top.Encoders, top.JPEGs, top.OFAs, 0, 8)
		sets = append(sets, resourceapi.CounterSet{Name: name, Counters: full[name]})
	}
	var out []*resourceapi.ResourceSlice
	for _, o := range objs {
		if len(o.Spec.SharedCounters) > 0 {
			continue
		}
		o = o.DeepCopy()
		for i := range o.Spec.Devices {
			d := &o.Spec.Devices[i]
			idx := int(*d.Attributes["index"].IntValue)
			set := fmt.Sprintf("gpu-%d-counter-set", idx)
			dev, _ := inv.Device(d.Name)
			c := maps.Clone(full[set])
			if dev.Kind == inventory.KindMIG {
				p := dev.MIG
				c = counters(p.MemoryBytes, p.Multiprocessors, p.CopyEngines, p.Decoders, p.Encoders, p.JPEGs, p.OFAs, dev.Placement.Start, dev.Placement.Size)
			}
			d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set, Counters: c}}
		}
		out = append(out, o)
	}
	counterSlice := objs[0].DeepCopy()
	counterSlice.Name = node + "-nvidia-counters"
	counterSlice.Spec.SharedCounters = sets
	counterSlice.Spec.Devices = nil
	out = slices.Insert(out, 0, counterSlice)
	for _, o := range out {
		o.Spec.Pool.ResourceSliceCount = int64(len(out))
	}
	return out
}
