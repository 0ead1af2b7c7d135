package dradriver

import (
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
)

// What the driver tells the outside as it prepares and unprepares:
// metrics (package nodemetrics), Events on claims and pods, and claims'
// status.devices (package claimstatus). None of it may fail or slow down
// a prepare. What a metrics scrape reads of the driver is scrape.go's.

// observer is what the driver tells outside the node: metrics, Events
// and the status writer, each optional (nil: none).
type observer struct {
	metrics *nodemetrics.Metrics
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
// checkpoint records it (names.Kind*), nodemetrics.KindMixed when they differ,
// nodemetrics.KindUnknown when none can be resolved.
func claimKind(inv *inventory.Inventory, claim *resourceapi.ResourceClaim) string {
	if claim.Status.Allocation == nil {
		return nodemetrics.KindUnknown
	}
	kind := ""
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != names.Driver {
			continue
		}
		k := kindIMEXChannel
		if r.Device != names.IMEXChannelDevice {
			dev, ok := inv.Device(r.Device)
			if !ok {
				return nodemetrics.KindUnknown
			}
			k = deviceKind(dev, r.ShareID != nil)
		}
		if kind != "" && k != kind {
			return nodemetrics.KindMixed
		}
		kind = k
	}
	if kind == "" {
		return nodemetrics.KindUnknown
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

// heldKind is the metrics label of what a claim holds now (its uses), for
// unprepare.
func heldKind(uses []use) string {
	kind := ""
	for _, u := range uses {
		if kind != "" && u.recKind != kind {
			return nodemetrics.KindMixed
		}
		kind = u.recKind
	}
	if kind == "" {
		return nodemetrics.KindUnknown
	}
	return kind
}

// prepared records a prepare's latency (took) under its kind (claimKind),
// raises an Event if it failed (err), and queues the claim's status write
// if it succeeded.
func (o *observer) prepared(claim *resourceapi.ResourceClaim, kind string, took time.Duration, err error) {
	o.metrics.ObservePrepare(kind, took, err)
	var waiting *DaemonNotReadyError
	switch {
	case errors.As(err, &waiting):
		// Not a failure: the kubelet retries until the node's IMEX daemon
		// is ready (channel.go).
		o.claimEvent(claim, corev1.EventTypeNormal, ReasonWaitingForIMEXDaemon, err.Error())
	case err != nil:
		o.prepareFailed(claim, err)
	default:
		o.statusChanged(claim.Namespace, claim.Name, claim.UID)
	}
}

// unprepared records an unprepare's latency (took) under the kind the
// claim held (heldKind), and queues the removal of its status entries if
// it succeeded (err nil).
func (o *observer) unprepared(claim kubeletplugin.NamespacedObject, kind string, took time.Duration, err error) {
	o.metrics.ObserveUnprepare(kind, took, err)
	if err == nil {
		o.statusChanged(claim.Namespace, claim.Name, claim.UID)
	}
}

// nodeEvent raises an Event on the Node, as the kubelet refers to it.
func (o *observer) nodeEvent(node, eventType, reason, msg string) {
	if o.events != nil {
		o.events.Event(&corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}, eventType, reason, msg)
	}
}

// claimEvent raises an Event on the claim and on each pod it is reserved
// for, where a user looks first.
func (o *observer) claimEvent(claim *resourceapi.ResourceClaim, eventType, reason, msg string) {
	if o.events == nil {
		return
	}
	o.refEvent(claimRef{claim.UID, claim.Namespace, claim.Name}, eventType, reason, msg)
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			continue
		}
		o.events.Event(&corev1.ObjectReference{
			APIVersion: "v1", Kind: "Pod", Namespace: claim.Namespace, Name: r.Name, UID: r.UID,
		}, eventType, reason, "ResourceClaim "+claim.Name+": "+msg)
	}
}

// refEvent raises an Event on a claim known by its reservation (ref), not
// by its object: without its pods.
func (o *observer) refEvent(ref claimRef, eventType, reason, msg string) {
	if o.events == nil {
		return
	}
	o.events.Event(&corev1.ObjectReference{
		APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim",
		Namespace: ref.namespace, Name: ref.name, UID: ref.uid,
	}, eventType, reason, msg)
}
