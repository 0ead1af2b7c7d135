package features

import (
	"context"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// Sources of a detected gate value.
const (
	sourceSlice = "dry-run ResourceSlice"
	sourceClass = "dry-run DeviceClass"
	sourceRead  = "DeviceClass " + names.Driver
)

// Detect learns which gates the API server enforces, by server-side dry-run
// creates of probe objects: what the server drops from them is what it does
// not enforce. Nothing is persisted. It needs create on resourceslices (the
// plugin has it for its own node) and, for DRAExtendedResource, create or
// get on deviceclasses; without the latter that gate is reported off with
// the reason in its Source.
//
// nodeName is the node the probe slice claims to be for, so that the
// ValidatingAdmissionPolicy that lets a plugin write only its own node's
// slices admits the probe.
//
// An error means the server could not be asked at all (unreachable,
// forbidden); the caller decides whether to fail or assume Stock.
func Detect(ctx context.Context, client kubernetes.Interface, nodeName string) (Set, error) {
	s := Set{Enabled: map[Gate]bool{}, Source: map[Gate]string{}}
	v, err := client.Discovery().ServerVersion()
	if err != nil {
		return s, fmt.Errorf("server version: %w", err)
	}
	s.ServerVersion = v.GitVersion

	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	slices := client.ResourceV1().ResourceSlices()

	// Counters live in a slice of their own: a slice holds devices or
	// sharedCounters, never both.
	counters, err := slices.Create(ctx, probeCounterSlice(nodeName), dry)
	if err != nil {
		return s, fmt.Errorf("dry-run create of a probe ResourceSlice with sharedCounters: %w", err)
	}
	devices, err := slices.Create(ctx, probeDeviceSlice(nodeName), dry)
	if err != nil {
		return s, fmt.Errorf("dry-run create of a probe ResourceSlice with a shareable device: %w", err)
	}
	s.Enabled[PartitionableDevices] = len(counters.Spec.SharedCounters) > 0 &&
		len(devices.Spec.Devices) == 1 && len(devices.Spec.Devices[0].ConsumesCounters) > 0
	if len(devices.Spec.Devices) == 1 {
		d := devices.Spec.Devices[0]
		s.Enabled[ConsumableCapacity] = d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations &&
			d.Capacity[probeCapacity].RequestPolicy != nil
		s.Enabled[DeviceTaints] = len(d.Taints) > 0
	}
	for _, g := range []Gate{PartitionableDevices, ConsumableCapacity, DeviceTaints} {
		s.Source[g] = sourceSlice
	}

	s.Enabled[ExtendedResource], s.Source[ExtendedResource] = detectExtendedResource(ctx, client)
	return s, nil
}

// detectExtendedResource probes extendedResourceName: by a dry-run create
// of a DeviceClass where the caller may create classes (an admin's
// facetctl), else by reading Facet's own gpu.facet.dev class, which is
// shipped with extendedResourceName set: a server that enforces the field
// kept it.
func detectExtendedResource(ctx context.Context, client kubernetes.Interface) (bool, string) {
	classes := client.ResourceV1().DeviceClasses()
	probe := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "facet-probe-"},
		Spec:       resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To("example.com/facet-probe")},
	}
	got, err := classes.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil {
		return got.Spec.ExtendedResourceName != nil, sourceClass
	}
	if !apierrors.IsForbidden(err) {
		return false, fmt.Sprintf("not determined (dry-run DeviceClass: %v)", err)
	}
	class, err := classes.Get(ctx, names.Driver, metav1.GetOptions{})
	switch {
	case err == nil:
		return class.Spec.ExtendedResourceName != nil, sourceRead
	case apierrors.IsNotFound(err):
		return false, "not determined (DeviceClass " + names.Driver + " is not installed)"
	default:
		return false, fmt.Sprintf("not determined (%v)", errors.Unwrap(err))
	}
}

const probeCapacity resourceapi.QualifiedName = "memory"

func probeMeta(nodeName string) (metav1.ObjectMeta, resourceapi.ResourceSliceSpec) {
	return metav1.ObjectMeta{GenerateName: nodeName + "-" + names.Driver + "-probe-"},
		resourceapi.ResourceSliceSpec{
			Driver:   names.Driver,
			NodeName: ptr.To(nodeName),
			Pool:     resourceapi.ResourcePool{Name: nodeName + "-feature-probe", ResourceSliceCount: 1},
		}
}

func probeCounterSlice(nodeName string) *resourceapi.ResourceSlice {
	meta, spec := probeMeta(nodeName)
	spec.SharedCounters = []resourceapi.CounterSet{{
		Name:     "probe",
		Counters: map[string]resourceapi.Counter{"slice": {Value: resource.MustParse("1")}},
	}}
	return &resourceapi.ResourceSlice{ObjectMeta: meta, Spec: spec}
}

func probeDeviceSlice(nodeName string) *resourceapi.ResourceSlice {
	meta, spec := probeMeta(nodeName)
	gi := resource.MustParse("1Gi")
	spec.Devices = []resourceapi.Device{{
		Name:                     "probe",
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			probeCapacity: {
				Value: gi,
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    ptr.To(gi.DeepCopy()),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Mi"))},
				},
			},
		},
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
			CounterSet: "probe",
			Counters:   map[string]resourceapi.Counter{"slice": {Value: resource.MustParse("1")}},
		}},
		Taints: []resourceapi.DeviceTaint{{Key: names.Driver + "/probe", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
	}}
	return &resourceapi.ResourceSlice{ObjectMeta: meta, Spec: spec}
}
