// Package slices renders an inventory as the ResourceSlices of the node's
// pool, in the exact shape the kubelet plugin publishes through
// k8s.io/dynamic-resource-allocation/resourceslice.
package slices

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/pkg/inventory"
)

// MaxDevicesPerSlice is the API's limit on devices in one slice (128), or 64
// when any device consumes counters (resource/v1 types.go).
const (
	MaxDevicesPerSlice         = resourceapi.ResourceSliceMaxDevices
	MaxDevicesPerSliceCounters = resourceapi.ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
)

// Resources builds the pool of one node: one pool named after the node,
// each GPU's devices kept together in one slice (the allocator takes the
// first device that fits, and slice names are random, so order is only
// reliable inside a slice).
func Resources(inv *inventory.Inventory, nodeName string) resourceslice.DriverResources {
	var slices []resourceslice.Slice
	var cur []resourceapi.Device
	for _, gpu := range inv.GPUs {
		devs := make([]resourceapi.Device, 0, len(gpu.Devices))
		for _, d := range gpu.Devices {
			devs = append(devs, device(inv, d))
		}
		if len(cur)+len(devs) > MaxDevicesPerSlice && len(cur) > 0 {
			slices = append(slices, resourceslice.Slice{Devices: cur})
			cur = nil
		}
		cur = append(cur, devs...)
	}
	if len(cur) > 0 || len(slices) == 0 {
		slices = append(slices, resourceslice.Slice{Devices: cur})
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: slices}},
	}
}

func device(inv *inventory.Inventory, d *inventory.Device) resourceapi.Device {
	g := d.GPU
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"type":                  str(string(d.Kind)),
		"index":                 {IntValue: ptr.To(int64(g.Index))},
		"uuid":                  str(g.UUID),
		"productName":           str(truncate(g.ProductName)),
		"architecture":          str(g.Architecture),
		"brand":                 str(g.Brand),
		"cudaComputeCapability": version(g.CUDAComputeCapability),
		"driverVersion":         version(inv.DriverVersion),
		"cudaDriverVersion":     version(inv.CUDADriverVersion),
		"migCapable":            {BoolValue: ptr.To(g.MIGCapable)},
		"mode":                  str(string(g.Mode)),
	}
	if g.NUMANode >= 0 {
		attrs["numaNode"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(g.NUMANode))}
	}
	if g.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = str(g.PCIeRoot)
	}
	return resourceapi.Device{
		Name:       d.Name,
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: *resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI)},
		},
	}
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

// version turns NVIDIA's "12.4" or "550.54.15" into semver ("12.4.0").
func version(v string) resourceapi.DeviceAttribute {
	if strings.Count(v, ".") == 1 {
		v += ".0"
	}
	return resourceapi.DeviceAttribute{VersionValue: &v}
}

// truncate keeps string attributes within the API's 64 characters.
func truncate(s string) string {
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
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", nodeName, inventory.DriverName, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver: inventory.DriverName,
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
