package resourceslices

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// CheckLimits checks a node's slices against the resource.k8s.io/v1 limits
// (types.go and the apiserver's validation) that Facet's layout must keep,
// and against the cross-references the allocator checks (every consumed
// counter exists). It returns every violation; none means publishable.
func CheckLimits(objs []*resourceapi.ResourceSlice) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	counters := map[string]map[string]bool{}
	devices := map[string]bool{}
	for _, o := range objs {
		if len(o.Spec.Devices) > 0 && len(o.Spec.SharedCounters) > 0 {
			fail("%s: devices and sharedCounters in one slice", o.Name)
		}
		if n := len(o.Spec.SharedCounters); n > resourceapi.ResourceSliceMaxCounterSets {
			fail("%s: %d counter sets", o.Name, n)
		}
		for _, cs := range o.Spec.SharedCounters {
			if len(cs.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
				fail("%s: counter set %s has %d counters", o.Name, cs.Name, len(cs.Counters))
			}
			if counters[cs.Name] != nil {
				fail("%s: counter set %s twice in the pool", o.Name, cs.Name)
			}
			counters[cs.Name] = map[string]bool{}
			for _, e := range validation.IsDNS1123Label(cs.Name) {
				fail("%s: counter set name %s: %s", o.Name, cs.Name, e)
			}
			for c := range cs.Counters {
				counters[cs.Name][c] = true
				for _, e := range validation.IsDNS1123Label(c) {
					fail("%s: counter name %s: %s", o.Name, c, e)
				}
			}
		}
		limit, anyCounters := resourceapi.ResourceSliceMaxDevices, false
		for _, d := range o.Spec.Devices {
			anyCounters = anyCounters || len(d.ConsumesCounters) > 0
		}
		if anyCounters {
			limit = MaxDevicesPerSliceCounters
		}
		if len(o.Spec.Devices) > limit {
			fail("%s: %d devices, limit %d", o.Name, len(o.Spec.Devices), limit)
		}
		if o.Spec.Pool.ResourceSliceCount != int64(len(objs)) {
			fail("%s: resourceSliceCount %d for %d slices", o.Name, o.Spec.Pool.ResourceSliceCount, len(objs))
		}
		for _, d := range o.Spec.Devices {
			errs = append(errs, checkDevice(o.Name, d)...)
			if devices[d.Name] {
				fail("%s: device %s twice in the pool", o.Name, d.Name)
			}
			devices[d.Name] = true
		}
	}
	for _, o := range objs {
		for _, d := range o.Spec.Devices {
			for _, cc := range d.ConsumesCounters {
				for c := range cc.Counters {
					if !counters[cc.CounterSet][c] {
						fail("%s: device %s consumes %s/%s, which no slice of the pool has", o.Name, d.Name, cc.CounterSet, c)
					}
				}
			}
		}
	}
	return errs
}

func checkDevice(slice string, d resourceapi.Device) []error {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: device %s: "+format, append([]any{slice, d.Name}, args...)...))
	}
	for _, e := range validation.IsDNS1123Label(d.Name) {
		fail("name: %s", e)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		fail("%d attributes and capacities", n)
	}
	if n := len(d.ConsumesCounters); n > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
		fail("%d consumesCounters entries", n)
	}
	for _, cc := range d.ConsumesCounters {
		if len(cc.Counters) > resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption {
			fail("consumes %d counters of %s", len(cc.Counters), cc.CounterSet)
		}
	}
	checkName := func(what string, name resourceapi.QualifiedName) {
		id := string(name)
		if i := strings.LastIndex(id, "/"); i >= 0 {
			for _, e := range validation.IsDNS1123Subdomain(id[:i]) {
				fail("%s %s: domain: %s", what, name, e)
			}
			id = id[i+1:]
		}
		if len(id) > resourceapi.DeviceMaxIDLength {
			fail("%s %s: longer than %d", what, name, resourceapi.DeviceMaxIDLength)
		}
		for _, e := range validation.IsCIdentifier(id) {
			fail("%s %s: %s", what, name, e)
		}
	}
	for name, a := range d.Attributes {
		checkName("attribute", name)
		if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
			fail("attribute %s: value longer than %d", name, resourceapi.DeviceAttributeMaxValueLength)
		}
	}
	multi := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
	for name, c := range d.Capacity {
		checkName("capacity", name)
		p := c.RequestPolicy
		if p == nil {
			continue
		}
		if !multi {
			fail("capacity %s: requestPolicy on a device without allowMultipleAllocations", name)
		}
		if p.ValidRange == nil || p.Default == nil || p.ValidRange.Min == nil {
			fail("capacity %s: requestPolicy without default and validRange.min", name)
			continue
		}
		r := p.ValidRange
		le := func(a, b resource.Quantity) bool { return a.Cmp(b) <= 0 }
		if r.Min.Sign() < 0 || !le(*r.Min, c.Value) || !le(*r.Min, *p.Default) {
			fail("capacity %s: min %s not within 0..value and <= default", name, r.Min.String())
		}
		if r.Max != nil && (!le(*r.Max, c.Value) || !le(*p.Default, *r.Max)) {
			fail("capacity %s: max %s above value or below default", name, r.Max.String())
		}
		if r.Step != nil {
			step := r.Step.Value()
			if step <= 0 || (r.Max != nil && r.Max.Value()%step != 0) || p.Default.Value()%step != 0 {
				fail("capacity %s: max and default must be multiples of step %s", name, r.Step.String())
			}
			sum := r.Min.DeepCopy()
			sum.Add(*r.Step)
			if !le(sum, c.Value) {
				fail("capacity %s: min+step above value", name)
			}
		}
	}
	return errs
}
