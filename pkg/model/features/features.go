// Package features knows which Dynamic Resource Allocation features a
// cluster enforces, so that Facet publishes only what the cluster can
// enforce.
//
// A stock Kubernetes 1.35 cluster runs with DRAPartitionableDevices,
// DRAConsumableCapacity, DRADeviceTaints and DRAExtendedResource off (alpha).
// Its API server then silently drops the fields those gates guard:
// sharedCounters and consumesCounters, allowMultipleAllocations and capacity
// requestPolicy, device taints, and a DeviceClass's extendedResourceName. A
// ResourceSlice that relies on them is published without them, and the
// scheduler hands out what it can no longer tell apart: a whole GPU and its
// MIG placements at once, or a vGPU share as the whole GPU.
//
// Detect asks the API server itself: a server-side dry-run create of probe
// objects shows exactly which fields survive (docs/design/resource-model.md,
// "Stock 1.35"). The kube-scheduler may run other gates than the API server;
// Overrides (the --feature-gates flag) then decide.
package features

import (
	"fmt"
	"sort"
	"strings"

	cliflag "k8s.io/component-base/cli/flag"
)

// Gate is a Kubernetes feature gate that changes what Facet may publish.
type Gate string

// The gates Facet cares about (k8s.io/kubernetes pkg/features). All four are
// alpha and off in 1.35, and beta and on by default in 1.36 (v1.36.3
// kube_features.go). In 1.37 (v1.37.2 kube_features.go) DRADeviceTaints and
// DRAExtendedResource are GA, DRAExtendedResource locked on, and the other
// two are still beta and on. Detect asks the API server in every version
// alike: a GA gate turned off (DRADeviceTaints can be, until 1.38) drops its
// field as an alpha one does.
const (
	// PartitionableDevices guards sharedCounters and consumesCounters: the
	// counters that make a whole GPU, its MIG placements and its shares
	// mutually exclusive (modes mig and dynamic).
	PartitionableDevices Gate = "DRAPartitionableDevices"
	// ConsumableCapacity guards allowMultipleAllocations, capacity
	// requestPolicy and a claim's capacity.requests: vGPU shares of one
	// device (modes shared and dynamic).
	ConsumableCapacity Gate = "DRAConsumableCapacity"
	// DeviceTaints guards device taints.
	DeviceTaints Gate = "DRADeviceTaints"
	// ExtendedResource guards a DeviceClass's extendedResourceName: pods
	// that ask for nvidia.com/gpu get a claim made by the scheduler.
	ExtendedResource Gate = "DRAExtendedResource"
)

// Gates lists the gates in a fixed order, for output.
var Gates = []Gate{PartitionableDevices, ConsumableCapacity, DeviceTaints, ExtendedResource}

// Set is what a cluster enforces.
type Set struct {
	// Enabled has an entry for every gate of Gates.
	Enabled map[Gate]bool
	// Source says, per gate, how its value was learnt: "dry-run
	// ResourceSlice", "--feature-gates", "not determined: ...".
	Source map[Gate]string
	// ServerVersion is the API server's gitVersion, e.g. "v1.35.4"; empty
	// when unknown.
	ServerVersion string
}

// Stock is a stock Kubernetes 1.35 cluster: every gate off.
func Stock(source string) Set { return uniform(false, source) }

// AllOn is a cluster with every gate on (1.35 with the gates, 1.36 or 1.37
// with their defaults).
func AllOn(source string) Set { return uniform(true, source) }

func uniform(on bool, source string) Set {
	s := Set{Enabled: map[Gate]bool{}, Source: map[Gate]string{}}
	for _, g := range Gates {
		s.Enabled[g], s.Source[g] = on, source
	}
	return s
}

// Has reports whether the cluster enforces g.
func (s Set) Has(g Gate) bool { return s.Enabled[g] }

// String is the set in the components' --feature-gates syntax, in Gates
// order: "DRAPartitionableDevices=false,DRAConsumableCapacity=false,...".
func (s Set) String() string {
	parts := make([]string, 0, len(Gates))
	for _, g := range Gates {
		parts = append(parts, fmt.Sprintf("%s=%t", g, s.Enabled[g]))
	}
	return strings.Join(parts, ",")
}

// Missing lists the gates of want that s lacks, in Gates order.
func (s Set) Missing(want ...Gate) []Gate {
	var out []Gate
	for _, g := range Gates {
		for _, w := range want {
			if g == w && !s.Enabled[g] {
				out = append(out, g)
			}
		}
	}
	return out
}

// Describe says in plain words what the set means for Facet, for a log
// line and an Event.
func (s Set) Describe() string {
	var on, off []string
	for _, g := range Gates {
		item := fmt.Sprintf("%s (%s)", g, s.Source[g])
		if s.Enabled[g] {
			on = append(on, item)
		} else {
			off = append(off, item)
		}
	}
	version := s.ServerVersion
	if version == "" {
		version = "unknown version"
	}
	msg := fmt.Sprintf("Kubernetes %s", version)
	if len(on) > 0 {
		msg += "; enforced: " + strings.Join(on, ", ")
	}
	if len(off) > 0 {
		msg += "; not enforced: " + strings.Join(off, ", ")
	}
	switch {
	case !s.Has(PartitionableDevices) && !s.Has(ConsumableCapacity):
		msg += ". Facet publishes whole GPUs, existing (static) MIG instances and fixed-size vGPU slots only; " +
			"dynamic MIG (modes mig, dynamic) and consumable vGPU shares (modes shared, dynamic) need the gates that are off here"
	case !s.Has(PartitionableDevices):
		msg += ". Dynamic MIG (modes mig, dynamic) is not available"
	case !s.Has(ConsumableCapacity):
		msg += ". Consumable vGPU shares (modes shared, dynamic) are not available"
	}
	return msg
}

// Overrides are gate values given on the command line, in the Kubernetes
// components' --feature-gates syntax. They win over detection, for
// clusters whose kube-scheduler runs other gates than the API server.
type Overrides map[Gate]bool

// ParseOverrides parses "DRAPartitionableDevices=false,DRAConsumableCapacity=true".
// An unknown gate or a value that is not a boolean is an error naming it.
func ParseOverrides(s string) (Overrides, error) {
	m := cliflag.NewMapStringBool(&map[string]bool{})
	if err := m.Set(s); err != nil {
		return nil, fmt.Errorf("--feature-gates: %w", err)
	}
	out := Overrides{}
	for name, v := range *m.Map {
		g := Gate(name)
		known := false
		for _, k := range Gates {
			known = known || k == g
		}
		if !known {
			names := make([]string, len(Gates))
			for i, k := range Gates {
				names[i] = string(k)
			}
			sort.Strings(names)
			return nil, fmt.Errorf("--feature-gates: unknown gate %q (known: %s)", name, strings.Join(names, ", "))
		}
		out[g] = v
	}
	return out, nil
}

// Apply returns s with the overrides in force.
func (s Set) Apply(o Overrides) Set {
	out := Set{Enabled: map[Gate]bool{}, Source: map[Gate]string{}, ServerVersion: s.ServerVersion}
	for _, g := range Gates {
		out.Enabled[g], out.Source[g] = s.Enabled[g], s.Source[g]
		if v, ok := o[g]; ok {
			out.Enabled[g], out.Source[g] = v, "--feature-gates"
		}
	}
	return out
}

// Equal reports whether two sets enforce the same gates.
func (s Set) Equal(o Set) bool {
	for _, g := range Gates {
		if s.Enabled[g] != o.Enabled[g] {
			return false
		}
	}
	return true
}
