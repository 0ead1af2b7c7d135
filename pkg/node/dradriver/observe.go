package dradriver

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
)

// What an operator sees of the driver from outside the node: metrics
// (package nodemetrics), Events on claims and pods, and claims' status.devices
// (package claimstatus). None of it may fail or slow down a prepare.

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
func (d *Driver) claimKind(claim *resourceapi.ResourceClaim) string {
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
			dev, ok := d.inv.Device(r.Device)
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
				return nodemetrics.KindMixed
			}
			kind = u.recKind
		}
	}
	if kind == "" {
		return nodemetrics.KindUnknown
	}
	return kind
}

// observedPrepare prepares one claim, recording its latency, raising an
// Event if it fails, and queueing its status write if it succeeds.
func (d *Driver) observedPrepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	start := time.Now()
	devices, err := d.prepareClaim(ctx, claim)
	d.obs.metrics.ObservePrepare(d.claimKind(claim), time.Since(start), err)
	var waiting *DaemonNotReadyError
	switch {
	case errors.As(err, &waiting):
		d.obs.claimEvent(claim, corev1.EventTypeNormal, ReasonWaitingForIMEXDaemon, err.Error())
	case err != nil:
		d.obs.prepareFailed(claim, err)
	default:
		d.obs.statusChanged(claim.Namespace, claim.Name, claim.UID)
	}
	return devices, err
}

// observedUnprepare unprepares one claim, recording its latency and queueing
// the removal of its status entries.
func (d *Driver) observedUnprepare(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
	kind := d.heldKind(claim.UID)
	if kind == nodemetrics.KindUnknown {
		// A channel claim holds no GPU: its record says.
		if rec, err := d.store.Get(claim.UID); err == nil && rec != nil && rec.ComputeDomain != nil {
			kind = kindIMEXChannel
		}
	}
	start := time.Now()
	err := d.unprepareClaim(ctx, claim)
	d.obs.metrics.ObserveUnprepare(kind, time.Since(start), err)
	if err == nil {
		d.obs.statusChanged(claim.Namespace, claim.Name, claim.UID)
	}
	return err
}

// GPUState implements nodemetrics.GPUSource: each inventory GPU with what the
// prepared claims hold of it.
func (d *Driver) GPUState() []nodemetrics.GPU {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]nodemetrics.GPU, 0, len(d.inv.GPUs))
	for _, g := range d.inv.GPUs {
		s := nodemetrics.GPU{Index: g.Index, UUID: g.UUID, Product: g.ProductName, Mode: string(g.Mode), MemoryBytes: int64(g.MemoryBytes)}
		// A MIG instance's compute is its compute slices of the GPU's,
		// the largest profile's slice count.
		fullSlices := fullSlices(g)
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

// PreparedClaims implements nodemetrics.GPUSource: the claims that hold
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

var _ nodemetrics.GPUSource = (*Driver)(nil)

// ClaimState implements nodemetrics.ClaimSource: every device the prepared
// claims hold, from the reservations (what is held) and the claims'
// checkpoint records (a MIG device's instance IDs and UUID, the pods), and
// the memory and SM utilization in use of the claims with vGPU shares or
// slots, from their HAMi-core accounting regions. A record or region that cannot be read leaves its
// detail out of this scrape; it never fails it.
func (d *Driver) ClaimState() ([]nodemetrics.Claim, []nodemetrics.ClaimUsage) {
	type held struct {
		u   use
		gpu *inventory.GPU
	}
	var uses []held
	d.mu.Lock()
	for _, g := range d.inv.GPUs {
		for _, u := range d.occ[g.UUID] {
			uses = append(uses, held{u, g})
		}
	}
	d.mu.Unlock()

	records := map[types.UID]map[string]checkpoint.Device{}
	pods := map[types.UID][]string{}
	record := func(uid types.UID, device string) (checkpoint.Device, bool) {
		if _, ok := records[uid]; !ok {
			records[uid] = map[string]checkpoint.Device{}
			if rec, err := d.store.Get(uid); err == nil && rec != nil {
				for _, dev := range rec.Devices {
					records[uid][dev.Device] = dev
				}
				pods[uid] = rec.Pods
			}
		}
		dev, ok := records[uid][device]
		return dev, ok
	}
	var out []nodemetrics.Claim
	shares := map[claimRef]bool{}
	for _, h := range uses {
		u, g := h.u, h.gpu
		c := nodemetrics.Claim{Namespace: u.owner.namespace, Name: u.owner.name, Device: u.device, GPUIndex: g.Index, GPUUUID: g.UUID, GIID: -1, Compute: "none"}
		switch u.kind {
		case kindWhole:
			c.Shape, c.MemoryBytes, c.ComputePercent = "whole", int64(g.MemoryBytes), 100
		case kindMIG:
			c.Shape, c.Compute = "mig", "mig"
			if dev, ok := d.inv.Device(u.device); ok && dev.MIG != nil {
				c.Profile, c.MemoryBytes = dev.MIG.Name, int64(dev.MIG.MemoryBytes)
				if full := fullSlices(g); full > 0 {
					c.ComputePercent = int64(dev.MIG.SliceCount * 100 / full)
				}
			}
			if rec, ok := record(u.owner.uid, u.device); ok && rec.MIG != nil && rec.MIG.Created {
				c.GIID, c.MIGUUID = rec.MIG.GIID, rec.MIG.UUID
			}
		case kindShare:
			c.Shape, c.MemoryBytes, c.ComputePercent = "share", u.memory, u.cores
			if u.slot {
				c.Shape = "slot"
			}
			if rec, ok := record(u.owner.uid, u.device); ok && rec.Share != nil {
				switch {
				case rec.Share.MPS:
					c.Compute = "mps"
				case rec.Share.Enforced && rec.Share.Cores > 0 && rec.Share.Cores < 100:
					c.Compute = "time-sliced"
				}
			}
			shares[u.owner] = true
		}
		record(u.owner.uid, u.device)
		c.Pods = pods[u.owner.uid]
		out = append(out, c)
	}
	var usage []nodemetrics.ClaimUsage
	if h, _ := d.sharing.HAMi(); h != nil {
		for ref := range shares {
			dir, err := h.CacheDir(ref.uid)
			if err != nil {
				continue
			}
			u, err := hami.ReadRegionUsage(filepath.Join(dir, hami.CacheFileName))
			if err != nil {
				// ErrNoRegion: no process yet. Anything else is the
				// region's to explain; the scrape goes on without it.
				continue
			}
			usage = append(usage, nodemetrics.ClaimUsage{Namespace: ref.namespace, Name: ref.name, UsedBytes: u.UsedBytes, ComputeUsedPercent: u.SMUtilPercent})
		}
	}
	return out, usage
}

// fullSlices is the compute slices of g's largest MIG profile: a MIG
// instance's share of the GPU's compute is its slices of these.
func fullSlices(g *inventory.GPU) int {
	n := 0
	for _, dev := range g.Devices {
		if dev.MIG != nil && dev.MIG.SliceCount > n {
			n = dev.MIG.SliceCount
		}
	}
	return n
}

var _ nodemetrics.ClaimSource = (*Driver)(nil)

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
	o.events.Event(&corev1.ObjectReference{
		APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID,
	}, eventType, reason, msg)
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			continue
		}
		o.events.Event(&corev1.ObjectReference{
			APIVersion: "v1", Kind: "Pod", Namespace: claim.Namespace, Name: r.Name, UID: r.UID,
		}, eventType, reason, "ResourceClaim "+claim.Name+": "+msg)
	}
}
