package scale

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
)

// NVIDIA's DRA driver for GPUs (github.com/NVIDIA/k8s-dra-driver-gpu,
// read at commit 22407113785e78c7763b4637689a201eb39c6199) publishes
// whole GPUs and pre-created MIG devices, without its DynamicMIG gate, as
// follows; NVIDIAGPUs and NVIDIAStaticMIG rebuild that layout from Facet's
// inventory of the same machine so that the scheduler sees what it would
// see with NVIDIA's driver on the node:
//
//   - cmd/gpu-kubelet-plugin/driver.go publishResources: every allocatable
//     device of the node in one ResourceSlice, pool = node name.
//   - cmd/gpu-kubelet-plugin/nvlib.go GetPerGpuAllocatableDevices: a GPU
//     with MIG disabled is one device; a GPU with MIG enabled publishes its
//     existing MIG devices and not itself.
//   - cmd/gpu-kubelet-plugin/deviceinfo.go GpuInfo.Attributes, GetDevice
//     and MigDeviceInfo.GetDevice, cmd/gpu-kubelet-plugin/mig.go
//     CommonAttributesMig, CommonCapacitiesMig and ToCanonicalName,
//     cmd/gpu-kubelet-plugin/partitions.go fullGpuCapacity: the names,
//     attributes and capacities below.
//   - deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml
//     and deviceclass-mig.yaml: the two DeviceClasses.
//
// Facet's discovery spells brand and architecture in lower case where
// NVIDIA's go-nvlib capitalises them; the scheduler's cost does not depend
// on the spelling.
const (
	// NVIDIADriver is NVIDIA's driver name and attribute domain.
	NVIDIADriver = "gpu.nvidia.com"
	// nvidiaPCIBusID is the standard attribute NVIDIA's driver sets from
	// deviceattribute.GetPCIBusIDAttribute (k8s.io/dynamic-resource-allocation
	// v0.36 and later; v0.35 has no constant for it).
	nvidiaPCIBusID = deviceattribute.StandardDeviceAttributePrefix + "pciBusID"
)

// NVIDIAClasses are NVIDIA's gpu.nvidia.com and mig.nvidia.com
// DeviceClasses (the chart's templates, resource.k8s.io/v1).
func NVIDIAClasses() []*resourceapi.DeviceClass {
	class := func(name, typ, extended string) *resourceapi.DeviceClass {
		dc := &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == '%s' && device.attributes['%s'].type == '%s'", NVIDIADriver, NVIDIADriver, typ),
			}}}},
		}
		if extended != "" {
			dc.Spec.ExtendedResourceName = &extended
		}
		return dc
	}
	return []*resourceapi.DeviceClass{class("gpu.nvidia.com", "gpu", "nvidia.com/gpu"), class("mig.nvidia.com", "mig", "")}
}

// NVIDIAGPUs is the node's slice as NVIDIA's driver publishes GPUs with MIG
// disabled: one device gpu-<minor> per GPU of inv (built in exclusive
// mode), all in one slice.
func NVIDIAGPUs(inv *inventory.Inventory, node string) []*resourceapi.ResourceSlice {
	var devs []resourceapi.Device
	for _, g := range inv.GPUs {
		attrs := nvidiaCommon(inv, g)
		attrs["type"] = str("gpu")
		attrs["uuid"] = str(g.UUID)
		devs = append(devs, resourceapi.Device{
			Name:       fmt.Sprintf("gpu-%d", g.Minor),
			Attributes: attrs,
			// NVIDIA's driver publishes NVML's (v1) total, reserved
			// memory included; Facet publishes the usable part.
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: bytesQ(g.TotalMemoryBytes)}},
		})
	}
	return nvidiaSlice(node, devs)
}

// NVIDIAStaticMIG is the node's slice as NVIDIA's driver publishes GPUs in
// MIG mode with instances already created: one device per existing MIG
// device of inv (built in static-mig mode), named
// gpu-<minor>-mig-<profile>-<profile ID>-<placement start>, with the
// profile's capacities and one memorySlice<k> capacity per memory slice.
func NVIDIAStaticMIG(inv *inventory.Inventory, node string) []*resourceapi.ResourceSlice {
	var devs []resourceapi.Device
	for _, g := range inv.GPUs {
		for _, d := range g.Devices {
			if d.Kind != inventory.KindMIG || d.Instance == nil {
				continue
			}
			p := d.MIG
			attrs := nvidiaCommon(inv, g)
			attrs["type"] = str("mig")
			attrs["parentUUID"] = str(g.UUID)
			attrs["profile"] = str(p.Name)
			attrs["uuid"] = str(d.Instance.UUID)
			capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"multiprocessors": {Value: count(p.Multiprocessors)},
				"copyEngines":     {Value: count(p.CopyEngines)},
				"decoders":        {Value: count(p.Decoders)},
				"encoders":        {Value: count(p.Encoders)},
				"jpegEngines":     {Value: count(p.JPEGs)},
				"ofaEngines":      {Value: count(p.OFAs)},
				"memory":          {Value: bytesQ(p.MemoryBytes)},
			}
			for k := d.Placement.Start; k < d.Placement.Start+d.Placement.Size; k++ {
				capacity[resourceapi.QualifiedName(fmt.Sprintf("memorySlice%d", k))] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(1, resource.BinarySI)}
			}
			name := strings.ToLower(strings.NewReplacer(".", "", "+", "-").Replace(p.Name))
			devs = append(devs, resourceapi.Device{
				Name:       fmt.Sprintf("gpu-%d-mig-%s-%d-%d", g.Minor, name, p.GIProfileID, d.Placement.Start),
				Attributes: attrs,
				Capacity:   capacity,
			})
		}
	}
	return nvidiaSlice(node, devs)
}

// nvidiaCommon are the attributes NVIDIA's driver gives a GPU and each of
// its MIG devices alike. Its versions are semver.MustParse(v).String(),
// which spells them as Facet's resourceslices.Version does ("9.0" becomes
// "9.0.0", "580.159.04" becomes "580.159.4").
func nvidiaCommon(inv *inventory.Inventory, g *inventory.GPU) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"productName":           str(g.ProductName),
		"brand":                 str(g.Brand),
		"architecture":          str(g.Architecture),
		"cudaComputeCapability": resourceslices.Version(g.CUDAComputeCapability),
		"driverVersion":         resourceslices.Version(inv.DriverVersion),
		"cudaDriverVersion":     resourceslices.Version(inv.CUDADriverVersion),
		nvidiaPCIBusID:          str(g.PCIBusID),
	}
	if g.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = str(g.PCIeRoot)
	}
	return attrs
}

// nvidiaSlice is the one ResourceSlice of a node's pool, named as
// pkg/model/resourceslices names Facet's.
func nvidiaSlice(node string, devs []resourceapi.Device) []*resourceapi.ResourceSlice {
	return []*resourceapi.ResourceSlice{{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + NVIDIADriver + "-0"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   NVIDIADriver,
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: &node,
			Devices:  devs,
		},
	}}
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func count(n int) resource.Quantity { return *resource.NewQuantity(int64(n), resource.DecimalSI) }

func bytesQ(n uint64) resource.Quantity { return *resource.NewQuantity(int64(n), resource.BinarySI) }
