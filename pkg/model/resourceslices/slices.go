// Package resourceslices renders an inventory as the ResourceSlices of the node's
// pool, in the exact shape the kubelet plugin publishes through
// k8s.io/dynamic-resource-allocation/resourceslice.
package resourceslices

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// API limits this package lays slices out by (resource/v1 types.go).
const (
	// MaxDevicesPerSlice is the limit on devices in one slice (128), or 64
	// when any device consumes counters (or has taints).
	MaxDevicesPerSlice         = resourceapi.ResourceSliceMaxDevices
	MaxDevicesPerSliceCounters = inventory.MaxDevicesPerSliceCounters
	// MaxCounterSetsPerSlice is the limit on counter sets in one slice.
	MaxCounterSetsPerSlice = resourceapi.ResourceSliceMaxCounterSets
)

// Resources builds the pool of one node: one pool named after the node.
//
// Layout:
//   - Counter slices first: the GPUs' counter sets, at most 8 per slice (a
//     node with more MIG GPUs gets several).
//   - Then device slices: each GPU's devices stay together in one slice,
//     GPUs by index, as many GPUs per slice as the device limit allows (64
//     when any of them consumes counters, else 128).
//   - Inside a slice, inv.Order decides: binpack lists GPU after GPU,
//     spread interleaves them device by device.
//   - Except with OrderProfile: the dynamic MIG GPUs' devices go one slice
//     per profile across GPUs (profileSlices), the other GPUs' as above.
//
// The allocator takes the first device that fits, in slice order. The
// scheduler lists slices from an informer cache, whose order is that of a
// Go map (client-go tools/cache threadSafeMap.List): the order of the slices
// of a node is random on every scheduling cycle, so only the order inside a
// slice is policy. What binpack and spread then mean, measured with the
// upstream allocator (test/allocator TestMIGBinpackSpread): an 8×H100 node
// in mig mode has 26 devices per GPU, so two GPUs per device slice; sixteen
// 1g.10gb claims land on 3 GPUs (binpack) or 4 (spread) in slice order, and
// on 4.0 or 7.5 GPUs on average over random slice orders. Binpack fills one
// GPU of a pair before the other, spread alternates within the pair; which
// pair comes first is the scheduler's draw. In exclusive and shared mode
// all GPUs of an 8- or 16-GPU node share one slice, so the order holds
// node-wide; vGPU shares always go to the first GPU with room (spread
// cannot change that: each GPU is one device). OrderProfile packs equal MIG
// claims node-wide (TestMIGProfileOrderPacks), at the price of best fit
// across profiles.
func Resources(inv *inventory.Inventory, nodeName string) resourceslice.DriverResources {
	return TaintedResources(inv, nodeName, nil)
}

// TaintedResources is Resources with each GPU's taint, by GPU UUID, on
// every device of that GPU: the whole GPU, its MIG devices, its vGPU
// slots. It is how an unhealthy GPU leaves scheduling where
// DRADeviceTaints is enforced (on a cluster without it, the GPU is left
// out of the inventory instead). A tainted device counts against the
// smaller per-slice limit, like one that consumes counters.
func TaintedResources(inv *inventory.Inventory, nodeName string, taints map[string]resourceapi.DeviceTaint) resourceslice.DriverResources {
	var slices []resourceslice.Slice

	var sets []resourceapi.CounterSet
	for _, gpu := range inv.GPUs {
		if gpu.CounterSet == "" {
			continue
		}
		if len(sets) == MaxCounterSetsPerSlice {
			slices = append(slices, resourceslice.Slice{SharedCounters: sets})
			sets = nil
		}
		cs := resourceapi.CounterSet{Name: gpu.CounterSet, Counters: map[string]resourceapi.Counter{}}
		for _, c := range gpu.Counters {
			cs.Counters[c] = resourceapi.Counter{Value: one()}
		}
		sets = append(sets, cs)
	}
	if len(sets) > 0 {
		slices = append(slices, resourceslice.Slice{SharedCounters: sets})
	}

	gpus := inv.GPUs
	if inv.Order == inventory.OrderProfile {
		var byProfile []resourceslice.Slice
		byProfile, gpus = profileSlices(inv)
		for _, ps := range byProfile {
			taint(ps.Devices, inv, taints)
		}
		slices = append(slices, byProfile...)
	}
	var group []*inventory.GPU
	n, counters := 0, false
	flush := func() {
		if len(group) > 0 {
			devs := ordered(inv, group)
			taint(devs, inv, taints)
			slices = append(slices, resourceslice.Slice{Devices: devs})
		}
		group, n, counters = nil, 0, false
	}
	for _, gpu := range gpus {
		_, tainted := taints[gpu.UUID]
		hasCounters := gpu.CounterSet != "" || tainted
		limit := MaxDevicesPerSlice
		if counters || hasCounters {
			limit = MaxDevicesPerSliceCounters
		}
		if len(group) > 0 && n+len(gpu.Devices) > limit {
			flush()
		}
		group = append(group, gpu)
		n += len(gpu.Devices)
		counters = counters || hasCounters
	}
	flush()
	if inv.IMEXChannel != nil {
		slices = withIMEXChannel(slices, imexChannelDevice(inv.IMEXChannel))
	}
	if len(slices) == 0 {
		slices = append(slices, resourceslice.Slice{})
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: slices}},
	}
}

// withIMEXChannel adds the node's IMEX channel device to the last device
// slice where it has room (the limit of a slice whose devices consume
// counters or carry taints, or the plain one), else in a slice of its
// own: a node's slice count stays as it was wherever it can.
func withIMEXChannel(slices []resourceslice.Slice, dev resourceapi.Device) []resourceslice.Slice {
	if n := len(slices); n > 0 && len(slices[n-1].Devices) > 0 {
		last := &slices[n-1]
		limit := MaxDevicesPerSlice
		for _, d := range last.Devices {
			if len(d.ConsumesCounters) > 0 || len(d.Taints) > 0 {
				limit = MaxDevicesPerSliceCounters
			}
		}
		if len(last.Devices) < limit {
			last.Devices = append(last.Devices, dev)
			return slices
		}
	}
	return append(slices, resourceslice.Slice{Devices: []resourceapi.Device{dev}})
}

// imexChannelDevice is the node's IMEX channel device
// (names.IMEXChannelDevice): its type and the fabric clique a
// ComputeDomain's channel template selects on, and nothing a GPU has. No
// capacity: a claim gets the whole device, and prepare decides which
// channels (docs/design/compute-domains.md).
func imexChannelDevice(c *inventory.IMEXChannel) resourceapi.Device {
	return resourceapi.Device{
		Name: names.IMEXChannelDevice,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			names.AttrType:          str(names.KindIMEXChannel),
			names.AttrFabricCluster: str(c.ClusterUUID),
			names.AttrFabricClique:  intAttr(int(c.CliqueID)),
		},
	}
}

// profileSlices lays out the devices of the GPUs with counters (dynamic
// MIG) for OrderProfile: one slice per MIG profile (the whole-GPU devices
// count as one more), GPU after GPU, split between GPUs at the device
// limit; profiles in the order a GPU lists them. It returns the slices and the other GPUs.
//
// Why: the allocator takes the first device that fits, visiting a node's
// slices in the scheduler's random order. Only a claim whose candidates all
// lie in one slice meets them in a fixed order. One slice holds at most 64
// devices that consume counters, two H100s' worth of every profile, but
// eight H100s' worth of one profile (56 1g.10gb).
func profileSlices(inv *inventory.Inventory) ([]resourceslice.Slice, []*inventory.GPU) {
	var rest []*inventory.GPU
	var profiles []string
	byProfile := map[string][]*inventory.Device{}
	for _, gpu := range inv.GPUs {
		if gpu.CounterSet == "" {
			rest = append(rest, gpu)
			continue
		}
		for _, d := range gpu.Devices {
			key := ""
			if d.MIG != nil {
				key = d.MIG.Name
			}
			if _, ok := byProfile[key]; !ok {
				profiles = append(profiles, key)
			}
			byProfile[key] = append(byProfile[key], d)
		}
	}
	var out []resourceslice.Slice
	for _, p := range profiles {
		var slice []resourceapi.Device
		devs := byProfile[p]
		for len(devs) > 0 {
			// One GPU's devices of the profile stay in one slice.
			n := 1
			for n < len(devs) && devs[n].GPU == devs[0].GPU {
				n++
			}
			if len(slice)+n > MaxDevicesPerSliceCounters {
				out = append(out, resourceslice.Slice{Devices: slice})
				slice = nil
			}
			for _, d := range devs[:n] {
				slice = append(slice, device(inv, d))
			}
			devs = devs[n:]
		}
		out = append(out, resourceslice.Slice{Devices: slice})
	}
	return out, rest
}

// ordered renders the devices of GPUs sharing one slice in inv.Order.
func ordered(inv *inventory.Inventory, gpus []*inventory.GPU) []resourceapi.Device {
	var devs []*inventory.Device
	if inv.Order != inventory.OrderSpread {
		for _, gpu := range gpus {
			devs = append(devs, gpu.Devices...)
		}
	} else {
		for k := 0; ; k++ {
			more := false
			for _, gpu := range gpus {
				if k < len(gpu.Devices) {
					devs = append(devs, gpu.Devices[k])
					more = true
				}
			}
			if !more {
				break
			}
		}
	}
	smallestSlotsFirst(devs)
	out := make([]resourceapi.Device, len(devs))
	for i, d := range devs {
		out[i] = device(inv, d)
	}
	return out
}

// smallestSlotsFirst reorders the vGPU slots of a slice, in the places
// slots hold, smallest first (memory, then SM share), stable, so the
// allocator gives a request the smallest slot that fits even when GPUs of
// one slice have different layouts. Equal slots keep inv.Order. No other
// device moves: only slots match a slot request.
func smallestSlotsFirst(devs []*inventory.Device) {
	var at []int
	var slots []*inventory.Device
	for i, d := range devs {
		if d.Kind == inventory.KindSlot {
			at, slots = append(at, i), append(slots, d)
		}
	}
	sort.SliceStable(slots, func(i, j int) bool {
		a, b := slots[i].Slot, slots[j].Slot
		if a.MemoryBytes != b.MemoryBytes {
			return a.MemoryBytes < b.MemoryBytes
		}
		return a.Cores < b.Cores
	})
	for k, i := range at {
		devs[i] = slots[k]
	}
}

func device(inv *inventory.Inventory, d *inventory.Device) resourceapi.Device {
	g := d.GPU
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		names.AttrType:                  str(string(d.Kind)),
		names.AttrIndex:                 intAttr(g.Index),
		names.AttrProductName:           str(Truncate(g.ProductName)),
		names.AttrArchitecture:          str(g.Architecture),
		names.AttrBrand:                 str(g.Brand),
		names.AttrCUDAComputeCapability: Version(g.CUDAComputeCapability),
		names.AttrDriverVersion:         Version(inv.DriverVersion),
		names.AttrCUDADriverVersion:     Version(inv.CUDADriverVersion),
		names.AttrMode:                  str(string(g.Mode)),
	}
	if g.NUMANode >= 0 {
		attrs[names.AttrNUMANode] = intAttr(g.NUMANode)
	}
	if g.Mode == inventory.ModeMIG || g.Mode == inventory.ModeDynamic {
		// Always present on these GPUs, so a selector that reads it never
		// meets a missing key (a CEL error, not false).
		attrs[names.AttrMIGInUse] = resourceapi.DeviceAttribute{BoolValue: ptr.To(inv.MIGInUse[g.UUID])}
	}
	standardAttributes(attrs, &g.GPU)
	topologyAttributes(attrs, &g.GPU)
	out := resourceapi.Device{Name: d.Name, Attributes: attrs}
	if inv.ComputePartitioning != "" && (d.Shareable || d.Kind == inventory.KindSlot) {
		attrs[names.AttrComputePartitioning] = str(inv.ComputePartitioning)
	}
	switch d.Kind {
	case inventory.KindMIG:
		attrs[names.AttrProfile] = str(d.MIG.Name)
		attrs[names.AttrParentUUID] = str(g.UUID)
		attrs[names.AttrPlacementStart] = intAttr(d.Placement.Start)
		if d.Instance != nil && d.Instance.UUID != "" {
			// A static instance's own UUID, as nvidia-smi -L shows it.
			attrs[names.AttrMIGUUID] = str(d.Instance.UUID)
		}
		out.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			names.CapacityMemory:          {Value: bytesQ(d.MIG.MemoryBytes)},
			names.CapacityMultiprocessors: {Value: *resource.NewQuantity(int64(d.MIG.Multiprocessors), resource.DecimalSI)},
		}
	case inventory.KindSlot:
		attrs[names.AttrParentUUID] = str(g.UUID)
		attrs[names.AttrSlot] = intAttr(d.Slot.Index)
		out.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			names.CapacityMemory: {Value: *resource.NewQuantity(d.Slot.MemoryBytes, resource.BinarySI)},
			names.CapacityCores:  {Value: *resource.NewQuantity(d.Slot.Cores, resource.DecimalSI)},
		}
	default:
		attrs[names.AttrUUID] = str(g.UUID)
		attrs[names.AttrMIGCapable] = resourceapi.DeviceAttribute{BoolValue: ptr.To(g.MIGCapable)}
		if d.Shareable {
			out.AllowMultipleAllocations = ptr.To(true)
			out.Capacity = shareCapacity(uint64(g.ShareMemoryBytes))
		} else {
			out.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				names.CapacityMemory: {Value: bytesQ(g.MemoryBytes)},
			}
		}
	}
	if len(d.Counters) > 0 {
		counters := make(map[string]resourceapi.Counter, len(d.Counters))
		for _, c := range d.Counters {
			counters[c] = resourceapi.Counter{Value: one()}
		}
		out.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: g.CounterSet, Counters: counters}}
	}
	return out
}

// bdfPattern is the extended BDF notation that deviceattribute's
// GetPCIBusIDAttribute accepts (k8s.io/dynamic-resource-allocation v0.37.2,
// deviceattribute/pci_linux.go verifyPCIBDFFormat).
var bdfPattern = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$`)

// standardAttributes adds the resource.kubernetes.io attributes of g's PCI
// device to attrs, on every device of the GPU (a MIG instance or a vGPU
// slot sits where its GPU does): pcieRoot and pciBusID when known, and
// numaNode unless sysfs says -1. They are what
// k8s.io/dynamic-resource-allocation/deviceattribute's helpers publish for
// the same device: pcieRoot comes from GetPCIeRootAttributeByPCIBusID at
// discovery; GetPCIBusIDAttribute and GetNUMANodeAttribute are v0.37's, so
// their names are in package names and their checks here.
func standardAttributes(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, g *nvmlgpu.GPU) {
	if g.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = str(g.PCIeRoot)
	}
	if bdfPattern.MatchString(g.PCIBusID) {
		attrs[names.StandardPCIBusID] = str(g.PCIBusID)
	}
	if g.NUMANode >= 0 {
		attrs[names.StandardNUMANode] = intAttr(g.NUMANode)
	}
}

// topologyAttributes adds g's topology (names.AttrNVLinkDomain and the
// rest) to attrs, on every device of the GPU: a MIG device, share or slot
// is where its GPU is. Each is left out where NVML or sysfs does not say:
// the link count and bandwidth where NVML does not support NVLink on the
// GPU (and the bandwidth where it gives no link version), the domain
// without an active NVLink to a GPU or NVSwitch, the switch for a GPU on a
// root port, the fabric outside a multi-node NVLink fabric.
func topologyAttributes(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, g *nvmlgpu.GPU) {
	if g.NVLinkDomain != "" {
		attrs[names.AttrNVLinkDomain] = str(g.NVLinkDomain)
	}
	if g.NVLinkSupported {
		attrs[names.AttrNVLinkLinks] = intAttr(len(g.NVLinks))
		if len(g.NVLinks) == 0 || g.NVLinkBandwidthGBps > 0 {
			attrs[names.AttrNVLinkBandwidth] = intAttr(g.NVLinkBandwidthGBps)
		}
	}
	if g.PCIeSwitch != "" {
		attrs[names.AttrPCIeSwitch] = str(g.PCIeSwitch)
	}
	if g.Fabric != nil {
		attrs[names.AttrFabricCluster] = str(g.Fabric.ClusterUUID)
		attrs[names.AttrFabricClique] = intAttr(int(g.Fabric.CliqueID))
	}
}

// TopologyAttributes are the topology attributes every device of g
// carries, fully qualified (the driver's own under names.Driver): the
// standard pcieRoot, pciBusID and numaNode, and Facet's numaNode and
// topology attributes. facetctl topo prints them.
func TopologyAttributes(g *nvmlgpu.GPU) map[string]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	if g.NUMANode >= 0 {
		attrs[names.AttrNUMANode] = intAttr(g.NUMANode)
	}
	standardAttributes(attrs, g)
	topologyAttributes(attrs, g)
	out := make(map[string]resourceapi.DeviceAttribute, len(attrs))
	for n, a := range attrs {
		q := string(n)
		if !strings.Contains(q, "/") {
			q = names.Driver + "/" + q
		}
		out[q] = a
	}
	return out
}

// shareCapacity is the consumable capacity of a multi-allocatable gpu-<i>
// (KEP-5075; rounding in k8s.io/dynamic-resource-allocation
// structured/internal/experimental/consumable_capacity.go):
//
//   - memory: the GPU's memory in whole MiB. A request is rounded up to a
//     whole MiB (validRange min 1Mi, step 1Mi) and may not exceed all of
//     it; a request that names no memory takes all of it (default).
//   - cores: percent of SM time, 0-100 in steps of 1; a request that names
//     no cores takes 100 (default). 0 is best effort.
//   - clients: MPS clients, names.MPSMaxClients (48) of them; a request
//     that names none takes 1 (default), and may ask for up to all. So at
//     most 48 shares fit on a GPU, however small, which is what its MPS
//     control daemon serves (best-effort shares of 1 MiB would otherwise
//     fit by the thousand).
//
// So a claim that asks for nothing gets the whole GPU, and no other share
// fits beside it.
func shareCapacity(memoryBytes uint64) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	mem := bytesQ(memoryBytes &^ (1<<20 - 1))
	pct := func(v int64) resource.Quantity { return *resource.NewQuantity(v, resource.DecimalSI) }
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		names.CapacityMemory: {
			Value: mem,
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: ptr.To(mem.DeepCopy()),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  ptr.To(resource.MustParse("1Mi")),
					Max:  ptr.To(mem.DeepCopy()),
					Step: ptr.To(resource.MustParse("1Mi")),
				},
			},
		},
		names.CapacityCores: {
			Value: pct(100),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: ptr.To(pct(100)),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  ptr.To(pct(0)),
					Max:  ptr.To(pct(100)),
					Step: ptr.To(pct(1)),
				},
			},
		},
		names.CapacityClients: {
			Value: pct(names.MPSMaxClients),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: ptr.To(pct(1)),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  ptr.To(pct(1)),
					Max:  ptr.To(pct(names.MPSMaxClients)),
					Step: ptr.To(pct(1)),
				},
			},
		},
	}
}

func bytesQ(n uint64) resource.Quantity { return *resource.NewQuantity(int64(n), resource.BinarySI) }

func one() resource.Quantity { return *resource.NewQuantity(1, resource.DecimalSI) }

func intAttr(i int) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

// Version turns NVIDIA's "12.4" or "580.159.04" into semver ("12.4.0",
// "580.159.4"). Semantic versions forbid leading zeros, and NVIDIA's driver
// versions have them (580.159.04, 535.104.05): published as they are, the
// API server rejects the ResourceSlice and CEL cannot compare them. A part
// that is not a number is left alone (and the slice then fails validation
// with an error naming the attribute).
func Version(v string) resourceapi.DeviceAttribute {
	parts := strings.Split(v, ".")
	if len(parts) == 2 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		if n, err := strconv.ParseUint(p, 10, 64); err == nil {
			parts[i] = strconv.FormatUint(n, 10)
		}
	}
	v = strings.Join(parts, ".")
	return resourceapi.DeviceAttribute{VersionValue: &v}
}

// Truncate keeps a string attribute within the API's length
// (resourceapi.DeviceAttributeMaxValueLength), as Facet publishes it: a
// reader that keys on a published string (occupancy's MIG tables by
// productName) must cut it the same way.
func Truncate(s string) string {
	if len(s) > resourceapi.DeviceAttributeMaxValueLength {
		return s[:resourceapi.DeviceAttributeMaxValueLength]
	}
	return s
}

// Objects turns a pool into the ResourceSlice objects the resourceslice
// controller would create for it (same spec; names are deterministic here
// where the controller uses generateName).
func Objects(res resourceslice.DriverResources, nodeName string) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for poolName, pool := range res.Pools {
		for i, s := range pool.Slices {
			rs := &resourceapi.ResourceSlice{
				TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", nodeName, names.Driver, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver: names.Driver,
					Pool: resourceapi.ResourcePool{
						Name:               poolName,
						Generation:         max(pool.Generation, 1),
						ResourceSliceCount: int64(len(pool.Slices)),
					},
					Devices:        s.Devices,
					SharedCounters: s.SharedCounters,
				},
			}
			rs.Spec.NodeName = &nodeName
			out = append(out, rs)
		}
	}
	return out
}

func taint(devs []resourceapi.Device, inv *inventory.Inventory, taints map[string]resourceapi.DeviceTaint) {
	if len(taints) == 0 {
		return
	}
	for i := range devs {
		if d, ok := inv.Device(devs[i].Name); ok {
			if t, bad := taints[d.GPU.UUID]; bad {
				devs[i].Taints = append(devs[i].Taints, t)
			}
		}
	}
}
