package driver

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/metrics"
)

// What an operator sees of the driver from outside the node: metrics
// (package metrics), Events on claims and pods, and claims' status.devices
// (package claimstatus). None of it may fail or slow down a prepare.

// observer is what the driver tells outside the node: metrics, Events
// and the status writer, each optional (nil: none).
type observer struct {
	metrics *metrics.Metrics
	events  EventRecorder
	status  ClaimStatus
}

// ReasonPrepareFailed is the reason of the Warning Event a failed prepare
// raises on its claim and on the claim's pods.
const ReasonPrepareFailed = "FacetPrepareFailed"

// EventRecorder is the part of client-go's record.EventRecorder the driver
// uses; record.FakeRecorder satisfies it in tests.
type EventRecorder interface {
	Event(object runtime.Object, eventtype, reason, message string)
}

// ClaimStatus is told when a claim's prepared state changed (prepared,
// re-prepared or unprepared), so that it can bring the claim's
// status.devices in line with the checkpoint, off the prepare path.
type ClaimStatus interface {
	Changed(namespace, name string, uid types.UID)
}

// prepareFailed raises a Warning Event on the claim and on each pod it is
// reserved for. The message is the prepare error, which names the field
// or the conflicting holder. The kubelet retries failed prepares; the
// broadcaster's correlator aggregates the repeats into one Event with a
// count.
func (o *observer) prepareFailed(claim *resourceapi.ResourceClaim, err error) {
	o.claimEvent(claim, corev1.EventTypeWarning, ReasonPrepareFailed, err.Error())
}

// statusChanged tells the status writer, if any.
func (o *observer) statusChanged(namespace, name string, uid types.UID) {
	if o.status != nil {
		o.status.Changed(namespace, name, uid)
	}
}

// claimKind is the metrics label of a claim's devices: their kind, as the
// checkpoint records it (names.Kind*), metrics.KindMixed when they differ,
// metrics.KindUnknown when none can be resolved.
func (d *Driver) claimKind(claim *resourceapi.ResourceClaim) string {
	if claim.Status.Allocation == nil {
		return metrics.KindUnknown
	}
	kind := ""
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != names.Driver {
			continue
		}
		dev, ok := d.inv.Device(r.Device)
		if !ok {
			return metrics.KindUnknown
		}
		k := deviceKind(dev, r.ShareID != nil)
		if kind != "" && k != kind {
			return metrics.KindMixed
		}
		kind = k
	}
	if kind == "" {
		return metrics.KindUnknown
	}
	return kind
}

// deviceKind is the kind prepare records for an inventory device (see plan).
func deviceKind(dev *inventory.Device, shared bool) string {
	switch {
	case dev.Kind == inventory.KindMIG && dev.Instance != nil:
		return kindStaticMIG
	case dev.Kind == inventory.KindMIG:
		return kindMIG
	case dev.Kind == inventory.KindSlot:
		return kindSlot
	case dev.Shareable && shared:
		return kindShare
	}
	return kindWhole
}

// heldKind is the metrics label of what a claim holds now, for unprepare.
func (d *Driver) heldKind(uid types.UID) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	kind := ""
	for _, uses := range d.occ {
		for _, u := range uses {
			if u.owner.uid != uid {
				continue
			}
			if kind != "" && u.recKind != kind {
				return metrics.KindMixed
			}
			kind = u.recKind
		}
	}
	if kind == "" {
		return metrics.KindUnknown
	}
	return kind
}

// observedPrepare prepares one claim, recording its latency, raising an
// Event if it fails, and queueing its status write if it succeeds.
func (d *Driver) observedPrepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	start := time.Now()
	devices, err := d.prepareClaim(ctx, claim)
	d.obs.metrics.ObservePrepare(d.claimKind(claim), time.Since(start), err)
	if err != nil {
		d.obs.prepareFailed(claim, err)
	} else {
		d.obs.statusChanged(claim.Namespace, claim.Name, claim.UID)
	}
	return devices, err
}

// observedUnprepare unprepares one claim, recording its latency and queueing
// the removal of its status entries.
func (d *Driver) observedUnprepare(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
	kind := d.heldKind(claim.UID)
	start := time.Now()
	err := d.unprepareClaim(ctx, claim)
	d.obs.metrics.ObserveUnprepare(kind, time.Since(start), err)
	if err == nil {
		d.obs.statusChanged(claim.Namespace, claim.Name, claim.UID)
	}
	return err
}

// GPUState implements metrics.GPUSource: each inventory GPU with what the
// prepared claims hold of it.
func (d *Driver) GPUState() []metrics.GPU {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]metrics.GPU, 0, len(d.inv.GPUs))
	for _, g := range d.inv.GPUs {
		s := metrics.GPU{Index: g.Index, UUID: g.UUID, Product: g.ProductName, Mode: string(g.Mode), MemoryBytes: int64(g.MemoryBytes)}
		// A MIG instance's compute is its compute slices of the GPU's,
		// the largest profile's slice count.
		fullSlices := 0
		for _, dev := range g.Devices {
			if dev.MIG != nil && dev.MIG.SliceCount > fullSlices {
				fullSlices = dev.MIG.SliceCount
			}
		}
		for _, u := range d.occ[g.UUID] {
			switch u.kind {
			case kindWhole:
				s.AllocatedMemoryBytes += int64(g.MemoryBytes)
				s.AllocatedComputePercent += 100
			case kindShare:
				s.AllocatedMemoryBytes += u.memory
				s.AllocatedComputePercent += u.cores
			case kindMIG:
				dev, ok := d.inv.Device(u.device)
				if !ok || dev.MIG == nil {
					continue
				}
				s.AllocatedMemoryBytes += int64(dev.MIG.MemoryBytes)
				if fullSlices > 0 {
					s.AllocatedComputePercent += int64(dev.MIG.SliceCount * 100 / fullSlices)
				}
				if s.MIGInUse == nil {
					s.MIGInUse = map[string]int{}
				}
				s.MIGInUse[dev.MIG.Name]++
			}
		}
		out = append(out, s)
	}
	return out
}

// PreparedClaims implements metrics.GPUSource: the claims that hold
// devices (prepared, or admitted and being prepared).
func (d *Driver) PreparedClaims() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := map[types.UID]bool{}
	for _, uses := range d.occ {
		for _, u := range uses {
			seen[u.owner.uid] = true
		}
	}
	return len(seen)
}

var _ metrics.GPUSource = (*Driver)(nil)
