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

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/claimuid"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

// DefaultBootIDPath is where Linux publishes the current boot's ID.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// Driver implements kubeletplugin.DRAPlugin. It admits claims onto the
// node's devices and records them (this file, plan.go, reservations.go),
// carves their MIG instances (mig.go), restores them at start
// (restore.go), and composes what three smaller parts do: spec writing
// (specs), MPS joining (mpsJoiner) and what the outside sees (observer).
type Driver struct {
	nodeName string
	inv      *inventory.Inventory
	store    Store
	mig      MIGManager
	spec     *specs
	// sharing is the node's sharing mechanisms as they are now
	// (HAMi-core, MPS), adopted and dropped while the plugin runs. join
	// decides which claims join an MPS daemon.
	sharing *sharing.Set
	join    *mpsJoiner
	obs     *observer
	fail    func(string)
	// bootID is this boot's ID; "" if it could not be read, in which case
	// records are verified, never judged to be from another boot.
	bootID string
	// destroyUnowned is --destroy-unowned-mig.
	destroyUnowned bool

	// gpus finds an inventory GPU by UUID.
	gpus map[string]*inventory.GPU

	mu sync.Mutex
	// occ is what is prepared on each GPU. Held under mu only for
	// admission: NVML calls happen outside it, so claims on other GPUs
	// never wait for them.
	occ reservations
	// migUseSeen is the MIGInUse last signalled on migUseCh (one pending
	// signal, coalesced).
	migUseSeen map[string]bool
	migUseCh   chan struct{}
	// busy marks claims being prepared or unprepared, so two calls for one
	// claim never interleave.
	busy map[types.UID]bool
	// unusable holds, by GPU UUID, why a GPU must not get new claims: a
	// start-up problem confined to it (a rollback that failed, a
	// half-made MIG instance, an NVML error).
	unusable map[string]string
	// faults are the GPUs' health faults (SetFaults), by GPU UUID.
	faults map[string]gpuhealth.Fault
	// healthSubs are the kubelet's NodeWatchResources streams, woken on
	// every health change.
	healthSubs map[chan struct{}]struct{}
	drahealthv1alpha1.UnimplementedDRAResourceHealthServer
	// nodeLock is Options.NodeLock's; nil without one.
	nodeLock *nodeLock
	// domains is Options.Domains; cdMu serialises what decides the node's
	// compute-domain label from the checkpoint (channel.go).
	domains    ComputeDomains
	cdMu       sync.Mutex
	daemonWait time.Duration
}

type claimRef struct {
	uid       types.UID
	namespace string
	name      string
}

func (c claimRef) String() string { return c.namespace + "/" + c.name + " (" + string(c.uid) + ")" }

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
	// time-slicing (mpsJoiner.pick), with MPSUnavailable as the reason.
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
		store:    o.Store,
		mig:      o.MIG,
		spec: &specs{
			cdi: o.CDI, edits: o.Edits,
			gpuEdits: map[string]*gpuEditsEntry{},
		},
		sharing:        o.Sharing,
		obs:            &observer{metrics: o.Metrics, events: o.Events, status: o.Status},
		fail:           o.Failpoint,
		destroyUnowned: o.DestroyUnownedMIG,
		occ:            reservations{},
		busy:           map[types.UID]bool{},
		gpus:           map[string]*inventory.GPU{},
		unusable:       map[string]string{},
		faults:         map[string]gpuhealth.Fault{},
		healthSubs:     map[chan struct{}]struct{}{},
		migUseCh:       make(chan struct{}, 1),
		domains:        o.Domains,
		daemonWait:     cmp.Or(o.DaemonWait, DefaultDaemonWait),
	}
	if d.sharing == nil {
		d.sharing = sharing.Fixed(o.HAMi, o.HAMiUnavailable, o.MPS, o.MPSUnavailable)
	}
	d.spec.sharing = d.sharing
	d.join = &mpsJoiner{sharing: d.sharing, pods: o.Pods, holder: d.claimRefOf, obs: d.obs, failpoint: d.failpoint}
	for _, g := range o.Inventory.GPUs {
		d.gpus[g.UUID] = g
	}
	bootIDPath := o.BootIDPath
	if bootIDPath == "" {
		bootIDPath = DefaultBootIDPath
	}
	if b, err := os.ReadFile(bootIDPath); err != nil {
		logger.Error(err, "Cannot read the boot ID; prepared claims are verified on re-prepare but a reboot cannot be recognised")
	} else {
		d.bootID = strings.TrimSpace(string(b))
	}
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

// limits are a GPU's capacities; zero for a GPU the inventory lacks (a
// record from before a GPU was removed), so nothing new fits on it.
func (d *Driver) limits(gpuUUID string) gpuLimits {
	if g := d.gpus[gpuUUID]; g != nil {
		return gpuLimits{memory: g.ShareMemoryBytes}
	}
	return gpuLimits{}
}

// PrepareResourceClaims prepares each claim independently and concurrently:
// one claim's failure is reported for that claim alone.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	res := eachClaim(ctx, d, claims,
		func(claim *resourceapi.ResourceClaim) types.UID { return claim.UID },
		func(err error) kubeletplugin.PrepareResult { return kubeletplugin.PrepareResult{Err: err} },
		func(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
			devices, err := d.observedPrepare(ctx, claim)
			if err != nil {
				// prepareClaim logged it.
				err = fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
			}
			return kubeletplugin.PrepareResult{Devices: devices, Err: err}
		})
	holdWhileChannelsWait(claims, res)
	return res, nil
}

// UnprepareResourceClaims undoes prepare; unknown claims succeed.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return eachClaim(ctx, d, claims,
		func(claim kubeletplugin.NamespacedObject) types.UID { return claim.UID },
		func(err error) error { return err },
		func(claim kubeletplugin.NamespacedObject) error {
			err := d.observedUnprepare(ctx, claim)
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

// lock marks a claim busy; a second call for the same claim fails fast and
// the kubelet retries it. A UID that cannot name the claim's files
// (claimuid.Validate) is refused first.
func (d *Driver) lock(uid types.UID) error {
	if err := claimuid.Validate(uid); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.busy[uid] {
		return fmt.Errorf("another prepare or unprepare of this claim is in progress")
	}
	d.busy[uid] = true
	return nil
}

func (d *Driver) unlock(uid types.UID) {
	d.mu.Lock()
	delete(d.busy, uid)
	d.mu.Unlock()
}

// failpoint lets a test stop the plugin at a named step (Options.Failpoint).
func (d *Driver) failpoint(name string) {
	if d.fail != nil {
		d.fail(name)
	}
}

func resultDevices(rec *checkpoint.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(rec.Devices))
	for _, dev := range rec.Devices {
		out = append(out, kubeletplugin.Device{
			Requests:     dev.Requests,
			PoolName:     dev.Pool,
			DeviceName:   dev.Device,
			CDIDeviceIDs: dev.CDIDeviceIDs,
			ShareID:      dev.ShareID,
		})
	}
	return out
}
