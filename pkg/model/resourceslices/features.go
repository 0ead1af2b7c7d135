package resourceslices

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// Dropped lists every field of the slices that an API server enforcing
// only gates would drop, each naming the slice, the device and the gate.
// Empty means the cluster keeps the slices as published. The plugin refuses
// to publish slices with such fields: the scheduler would hand out what
// they no longer tell apart.
func Dropped(objs []*resourceapi.ResourceSlice, gates features.Set) []error {
	var errs []error
	need := func(g features.Gate, where, field string) {
		if !gates.Has(g) {
			errs = append(errs, fmt.Errorf("%s: %s needs %s", where, field, g))
		}
	}
	for _, o := range objs {
		if len(o.Spec.SharedCounters) > 0 {
			need(features.PartitionableDevices, o.Name, "sharedCounters")
		}
		for _, d := range o.Spec.Devices {
			where := o.Name + ": device " + d.Name
			if len(d.ConsumesCounters) > 0 {
				need(features.PartitionableDevices, where, "consumesCounters")
			}
			if d.AllowMultipleAllocations != nil {
				need(features.ConsumableCapacity, where, "allowMultipleAllocations")
			}
			for name, c := range d.Capacity {
				if c.RequestPolicy != nil {
					need(features.ConsumableCapacity, where, fmt.Sprintf("capacity %s requestPolicy", name))
				}
			}
			if len(d.Taints) > 0 {
				need(features.DeviceTaints, where, "taints")
			}
			if d.NodeName != nil || d.NodeSelector != nil || d.AllNodes != nil {
				need(features.PartitionableDevices, where, "per-device node selection")
			}
		}
	}
	return errs
}
