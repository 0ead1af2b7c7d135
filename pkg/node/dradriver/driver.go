// Package dradriver is the DRA driver behind Facet's kubelet plugin (package
// nodeplugin runs the process around it): it prepares and unprepares
// ResourceClaims for the kubelet (k8s.io/dynamic-resource-allocation/kubeletplugin)
// from the node's inventory: whole GPUs, MIG devices (carved at prepare,
// destroyed at unprepare) and vGPU shares (enforced by HAMi-core). Each
// claim gets one CDI spec, and every step is recorded in the checkpoint
// first, so a crash at any point is repaired at the next start or retry.
package dradriver

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

// DefaultBootIDPath is where Linux publishes the current boot's ID.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// Options configure New.
type Options struct {
	NodeName  string
	Inventory *inventory.Inventory
	Store     Store
	CDI       SpecWriter
	Edits     EditSource
	// MIG is required when the inventory publishes MIG devices.
	MIG MIGManager
	// Sharing is the node's sharing mechanisms, which may arrive and go
	// while the driver runs (package sharing). Nil: the fixed ones below.
	Sharing *sharing.Set
	// HAMi enforces vGPU shares; without it a claim for an enforced share
	// fails (a share that takes the whole GPU needs no HAMi-core).
	// A nil *hami.Editor counts as none. Only without Sharing.
	HAMi sharing.ShareEditor
	// HAMiUnavailable, with HAMi nil, says why HAMi-core could not be set
	// up; claims for enforced shares fail with it, and nothing else does.
	HAMiUnavailable error
	// MPS partitions enforced shares and slots with a per-GPU MPS control
	// daemon (package mps). Nil (a nil *mps.Manager counts as none): a
	// claim whose shares ask for a compute limit fails unless it accepts
	// time-slicing (mpsClients.pick), with MPSUnavailable as the reason.
	// Only without Sharing.
	MPS            sharing.Partitioner
	MPSUnavailable error
	// Pods reads a claim's pods, for the Unix UID they run as: an MPS
	// control daemon serves one UID at a time (mps.UserConflictError).
	// Nil: no UID is known, and shares are time-sliced unless a claim
	// asks for MPS (then it fails).
	Pods PodGetter
	// BootIDPath is read for the boot ID; DefaultBootIDPath when empty.
	BootIDPath string
	// Failpoint, when set, is called at named points of prepare and
	// unprepare so tests can kill the plugin there ("after-mig-create":
	// the instance exists but the checkpoint does not know its IDs yet).
	// Only tests and binaries built with the facet_failpoints tag set it.
	Failpoint func(name string)
	// DestroyUnownedMIG destroys, at start, MIG instances that no prepared
	// claim owns. Off by default: they are only reported, because someone
	// else (an admin with nvidia-smi) may have made them.
	DestroyUnownedMIG bool
	// Metrics records prepare and unprepare latencies and errors.
	Metrics *nodemetrics.Metrics
	// Events, when set, gets a Warning Event on the claim and its pods
	// for each failed prepare.
	Events EventRecorder
	// Status, when set, is told of every prepared and unprepared claim, to
	// write its status.devices.
	Status ClaimStatus
	// NodeLock is the path of a lock file shared with the other plugin
	// processes on the node (a rolling update, where the kubelet may call
	// two instances at once). With it, the restore at start and every
	// prepare and unprepare run holding it, and the reservations are
	// reloaded from the checkpoint after another process changed it (see
	// nodeLock). Empty: this process is the node's only plugin.
	NodeLock string
	// Domains reads ComputeDomains and labels the node for IMEX channel
	// claims (package computedomain). Nil: channel claims fail, and the
	// label is never touched.
	Domains ComputeDomains
	// DaemonWait bounds how long a channel claim's prepare waits for the
	// node's IMEX daemon before it fails for the kubelet to retry;
	// DefaultDaemonWait when 0.
	DaemonWait time.Duration
}

// New restores the prepared claims from the checkpoint, rolls back claims
// whose preparation a crash interrupted (destroying the MIG instances
// they own), removes Facet CDI specs and temp files that no record owns,
// and reports MIG instances no claim owns.
//
// Problems are kept as small as they are: a record that cannot be read or
// rolled back fails its claim and keeps its devices reserved, and a GPU
// with an NVML error, a failed rollback or a half-made MIG instance is
// marked unusable (UnusableGPUs). Only what every claim needs (the
// driver's common CDI edits, the checkpoint directory) fails the start.
func New(ctx context.Context, o Options) (*Driver, error) {
	logger := klog.FromContext(ctx)
	d := &Driver{
		nodeName: o.NodeName,
		inv:      o.Inventory,
		gpus:     map[string]*inventory.GPU{},
		store:    o.Store,
		mig:      o.MIG,
		spec: &specs{
			cdi: o.CDI, edits: o.Edits,
			gpuEdits: map[string]*gpuEditsEntry{},
		},
		sharing:        o.Sharing,
		held:           newLedger(o.Inventory),
		obs:            &observer{metrics: o.Metrics, events: o.Events, status: o.Status},
		fail:           o.Failpoint,
		destroyUnowned: o.DestroyUnownedMIG,
		busy:           map[types.UID]bool{},
		domains:        o.Domains,
		daemonWait:     cmp.Or(o.DaemonWait, DefaultDaemonWait),
	}
	if d.sharing == nil {
		d.sharing = sharing.Fixed(o.HAMi, o.HAMiUnavailable, o.MPS, o.MPSUnavailable)
	}
	d.spec.sharing = d.sharing
	for _, g := range o.Inventory.GPUs {
		d.gpus[g.UUID] = g
	}
	d.health = gpuhealth.NewKubelet(o.NodeName, o.Inventory, d.held.unhealthy)
	bootIDPath := o.BootIDPath
	if bootIDPath == "" {
		bootIDPath = DefaultBootIDPath
	}
	if b, err := os.ReadFile(bootIDPath); err != nil {
		logger.Error(err, "Cannot read the boot ID; prepared claims are verified on re-prepare but a reboot cannot be recognised")
	} else {
		d.bootID = strings.TrimSpace(string(b))
	}
	d.mps = &mpsClients{sharing: d.sharing, pods: o.Pods, store: o.Store, held: d.held, obs: d.obs, bootID: d.bootID, failpoint: d.failpoint}
	common, err := o.Edits.CommonEdits()
	if err != nil {
		return nil, fmt.Errorf("NVIDIA driver CDI edits: %w", err)
	}
	d.spec.common = common
	if o.NodeLock != "" {
		d.nodeLock = &nodeLock{path: o.NodeLock, reload: d.reloadReservations}
		// An instance still serving may be mid-prepare: its Preparing
		// records are not for this restore to roll back.
		if err := d.nodeLock.acquire(ctx, true); err != nil {
			return nil, err
		}
		defer d.nodeLock.release(ctx, true)
	}
	if err := d.restore(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// PrepareResourceClaims prepares each claim independently and concurrently:
// one claim's failure is reported for that claim alone. Each prepare's
// latency is recorded, a failure raised as an Event, and a success queued
// for its status write (observer).
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	res := eachClaim(ctx, d, claims,
		func(claim *resourceapi.ResourceClaim) types.UID { return claim.UID },
		func(err error) kubeletplugin.PrepareResult { return kubeletplugin.PrepareResult{Err: err} },
		func(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
			start := time.Now()
			devices, err := d.prepareClaim(ctx, claim)
			d.obs.prepared(claim, claimKind(d.inv, claim), time.Since(start), err)
			if err != nil {
				// prepareClaim logged it.
				err = fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
			}
			return kubeletplugin.PrepareResult{Devices: devices, Err: err}
		})
	holdWhileChannelsWait(claims, res)
	return res, nil
}

// UnprepareResourceClaims undoes prepare; unknown claims succeed. Each
// unprepare's latency is recorded, and a success queued for the removal of
// the claim's status entries (observer).
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return eachClaim(ctx, d, claims,
		func(claim kubeletplugin.NamespacedObject) types.UID { return claim.UID },
		func(err error) error { return err },
		func(claim kubeletplugin.NamespacedObject) error {
			kind := heldKind(d.held.usesOf(claim.UID))
			if kind == nodemetrics.KindUnknown {
				// A channel claim holds no GPU: its record says.
				if rec, err := d.store.Get(claim.UID); err == nil && rec != nil && rec.ComputeDomain != nil {
					kind = kindIMEXChannel
				}
			}
			start := time.Now()
			err := d.unprepareClaim(ctx, claim)
			d.obs.unprepared(claim, kind, time.Since(start), err)
			if err != nil {
				err = fmt.Errorf("claim %s: %w", claim.NamespacedName, err)
			}
			return err
		}), nil
}

// eachClaim runs do for every claim at once, under the node lock, and
// returns each claim's result by UID; every claim gets refused(err) where
// the node lock cannot be had. No claims (the kubelet's health probe):
// an empty map at once, without waiting for the node lock.
func eachClaim[C, R any](ctx context.Context, d *Driver, claims []C, uid func(C) types.UID, refused func(error) R, do func(C) R) map[types.UID]R {
	results := make(map[types.UID]R, len(claims))
	if len(claims) == 0 {
		return results
	}
	if err := d.enter(ctx); err != nil {
		for _, claim := range claims {
			results[uid(claim)] = refused(err)
		}
		return results
	}
	defer d.leave(ctx)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, claim := range claims {
		wg.Go(func() {
			r := do(claim)
			mu.Lock()
			results[uid(claim)] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	return results
}

// HandleError logs background errors (ResourceSlice publishing). None of
// them is fatal: the slices are rebuilt from the inventory on every sync.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
}

// enter and leave bracket every prepare, unprepare and the restore when
// Options.NodeLock is set; otherwise they do nothing.
func (d *Driver) enter(ctx context.Context) error {
	if d.nodeLock == nil {
		return nil
	}
	return d.nodeLock.acquire(ctx, false)
}

func (d *Driver) leave(ctx context.Context) {
	if d.nodeLock != nil {
		d.nodeLock.release(ctx, true)
	}
}

// The kubelet plugin helper serves the health stream where the driver has
// it. No compile-time DRAPlugin check here: facetctl builds this package
// against k8s.io/dynamic-resource-allocation v0.37 too (test/allocator's
// matrix), whose DRAPlugin has methods v0.35's lacks.
var _ drahealthv1alpha1.DRAResourceHealthServer = (*Driver)(nil)

// What the plugin around the driver reads of it and tells it.

// BootID is the boot ID New read ("" if it could not), for the other
// records that must not outlive a reboot.
func (d *Driver) BootID() string { return d.bootID }

// UnusableGPUs returns, by GPU UUID, why each GPU that a start-up problem
// confined to it must not be offered. The caller unpublishes them.
func (d *Driver) UnusableGPUs() map[string]string { return d.held.unusableGPUs() }

// SetFaults replaces the GPUs' health faults (package gpuhealth). From
// then on prepare refuses claims on GPUs with a fatal fault, GPUHealth
// reports them, and the kubelet's health streams are told.
func (d *Driver) SetFaults(faults map[string]gpuhealth.Fault) {
	d.held.setFaults(faults)
	d.health.Changed()
}

// GPUHealth returns, by GPU UUID, why each unhealthy GPU is unhealthy: a
// start-up problem confined to it (UnusableGPUs) or a health fault. A GPU
// that is absent is healthy.
func (d *Driver) GPUHealth() map[string]string { return d.held.unhealthy() }

// NodeWatchResources streams the health of every device in the node's
// pool to the kubelet (gpuhealth.Kubelet): every device of a GPU that
// GPUHealth names is UNHEALTHY.
func (d *Driver) NodeWatchResources(_ *drahealthv1alpha1.NodeWatchResourcesRequest, stream grpc.ServerStreamingServer[drahealthv1alpha1.NodeWatchResourcesResponse]) error {
	return d.health.Watch(stream)
}

// MIGInUse returns the GPUs, by UUID, on which a claim that is prepared or
// being prepared holds a MIG instance carved at prepare (not a static
// one): what the migInUse attribute publishes, so that a claim can prefer
// a GPU already split to an untouched one that could still serve a whole
// GPU. It is read from the reservations, which a prepare takes before it
// carves and an unprepare or a failed prepare gives back.
func (d *Driver) MIGInUse() map[string]bool { return d.held.migInUse() }

// MIGUseChanges is signalled, coalesced, each time MIGInUse changes: the
// plugin republishes the slices then. The channel is never closed.
func (d *Driver) MIGUseChanges() <-chan struct{} { return d.held.migUseChanges() }

// CheckMPS restarts MPS control daemons that died and raises an Event on
// each claim whose daemon was restarted.
func (d *Driver) CheckMPS(ctx context.Context) { d.mps.check(ctx) }

// RestoreMPS hands the prepared claims' MPS holders to facet-mps: at
// start, and whenever facet-mps is adopted after it (sharing.Set.Refresh),
// so that it keeps the daemons they hold and stops the others.
func (d *Driver) RestoreMPS(ctx context.Context) { d.mps.restore(ctx) }
