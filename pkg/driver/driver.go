// Package driver is Facet's DRA kubelet plugin: it prepares and unprepares
// ResourceClaims for the kubelet (k8s.io/dynamic-resource-allocation/kubeletplugin)
// from the node's inventory: whole GPUs, MIG devices (carved at prepare,
// destroyed at unprepare) and vGPU shares (enforced by HAMi-core). Each
// claim gets one CDI spec, and every step is recorded in the checkpoint
// first, so a crash at any point is repaired at the next start or retry.
package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cdi"
	"github.com/facet-gpu/facet/pkg/checkpoint"
	"github.com/facet-gpu/facet/pkg/claimuid"
	"github.com/facet-gpu/facet/pkg/hami"
	"github.com/facet-gpu/facet/pkg/inventory"
	"github.com/facet-gpu/facet/pkg/names"
	"github.com/facet-gpu/facet/pkg/nvml"
)

// EditSource yields the NVIDIA driver's CDI edits (package nvml, via nvcdi).
type EditSource interface {
	// CommonEdits are what every GPU container needs: control device
	// nodes, driver libraries and binaries, hooks.
	CommonEdits() (*cdispec.ContainerEdits, error)
	// GPUEdits are one whole GPU's own edits (its /dev/nvidiaN).
	GPUEdits(uuid string) (*cdispec.ContainerEdits, error)
	// MIGEdits are one MIG device's edits (parent node, nvidia-caps nodes).
	MIGEdits(parentUUID string, giID, ciID int) (*cdispec.ContainerEdits, error)
}

// MIGManager creates and destroys MIG instances (package nvml).
type MIGManager interface {
	EnableMIG(parentUUID string) (bool, error)
	DisableMIG(parentUUID string) (bool, error)
	CreateMIG(parentUUID string, giProfileID, placementStart int) (nvml.MIGInstance, error)
	DestroyMIG(parentUUID string, giID, ciID int) error
	ListMIG() ([]nvml.MIGInstance, error)
	// ListMIGOn lists one GPU's instances, so an NVML error on one GPU
	// fails that GPU alone.
	ListMIGOn(parentUUID string) ([]nvml.MIGInstance, error)
}

// DefaultBootIDPath is where Linux publishes the current boot's ID.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	nodeName string
	inv      *inventory.Inventory
	store    *checkpoint.Store
	cdi      *cdi.Writer
	edits    EditSource
	mig      MIGManager
	hami     *hami.Editor
	// hamiErr says why hami is nil, for the claims that need it.
	hamiErr error
	fail    func(string)
	// bootID is this boot's ID; "" if it could not be read, in which case
	// records are verified, never judged to be from another boot.
	bootID string
	// destroyUnowned is --destroy-unowned-mig.
	destroyUnowned bool

	// common edits are the same for every claim; computed once.
	common *cdispec.ContainerEdits
	// gpus finds an inventory GPU by UUID.
	gpus map[string]*inventory.GPU
	// gpuEdits caches each whole GPU's edits, which depend only on the
	// GPU: nvcdi walks NVML and the driver root for them, which prepare
	// need not repeat. Filled on first use, so one GPU nvcdi cannot
	// describe fails only the claims on it. editsMu guards only the map:
	// each GPU's entry has its own lock, so a GPU whose nvcdi call hangs
	// holds up the claims on it alone.
	editsMu  sync.Mutex
	gpuEdits map[string]*gpuEditsEntry

	mu sync.Mutex
	// occ is what is prepared on each GPU. Held under mu only for
	// admission: NVML calls happen outside it, so claims on other GPUs
	// never wait for them.
	occ occupancy
	// busy marks claims being prepared or unprepared, so two calls for one
	// claim never interleave.
	busy map[types.UID]bool
	// unusable holds, by GPU UUID, why a GPU must not get new claims: a
	// start-up problem confined to it (a rollback that failed, a
	// half-made MIG instance, an NVML error).
	unusable map[string]string
}

type gpuEditsEntry struct {
	mu    sync.Mutex
	edits *cdispec.ContainerEdits
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
	Store     *checkpoint.Store
	CDI       *cdi.Writer
	Edits     EditSource
	// MIG is required when the inventory publishes MIG devices.
	MIG MIGManager
	// HAMi enforces vGPU shares; without it a claim for an enforced share
	// fails (a share that takes the whole GPU needs no HAMi-core).
	HAMi *hami.Editor
	// HAMiUnavailable, with HAMi nil, says why HAMi-core could not be set
	// up; claims for enforced shares fail with it, and nothing else does.
	HAMiUnavailable error
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
		nodeName:       o.NodeName,
		inv:            o.Inventory,
		store:          o.Store,
		cdi:            o.CDI,
		edits:          o.Edits,
		mig:            o.MIG,
		hami:           o.HAMi,
		hamiErr:        o.HAMiUnavailable,
		fail:           o.Failpoint,
		destroyUnowned: o.DestroyUnownedMIG,
		occ:            occupancy{},
		busy:           map[types.UID]bool{},
		gpus:           map[string]*inventory.GPU{},
		gpuEdits:       map[string]*gpuEditsEntry{},
		unusable:       map[string]string{},
	}
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
	d.common = common
	if removed, err := d.cdi.SweepTemp(); err != nil {
		logger.Error(err, "Sweeping temporary CDI spec files")
	} else if len(removed) > 0 {
		logger.Info("Removed temporary CDI spec files left by a crash", "files", removed)
	}

	claims, corrupt, err := d.store.List()
	if err != nil {
		return nil, err
	}
	known := map[types.UID]bool{}
	// owned is "<parent>/<gi>/<ci>" of MIG instances that records hold,
	// or may hold (unreadable records): never destroyed as unowned.
	owned := map[string]bool{}
	unknownDevices := false
	for uid, err := range corrupt {
		known[uid] = true
		rec, serr := d.store.Salvage(uid)
		if serr != nil {
			unknownDevices = true
			logger.Error(err, "Checkpoint record unreadable and its devices unknown; its claim fails to prepare until it is unprepared or the record is removed", "claimUID", uid)
			continue
		}
		// Fail closed: what the record names stays reserved, so no other
		// claim is prepared on it, and its MIG instances are not
		// destroyed as unowned.
		logger.Error(err, "Checkpoint record unreadable; its claim fails to prepare until it is unprepared, and the devices it names stay reserved", "claimUID", uid, "devices", deviceNames(rec))
		d.restoreUses(ctx, claimRef{uid, rec.Namespace, rec.Name}, rec, owned)
	}
	for _, c := range claims {
		known[c.UID] = true
		ref := claimRef{c.UID, c.Namespace, c.Name}
		if d.fromOtherBoot(c) {
			// The reboot took the MIG instances: their IDs are void, and
			// NVML may reuse them for instances that are not this
			// claim's. Forgotten durably, so no later step trusts them.
			if voidMIG(c) {
				if err := d.store.Put(c); err != nil {
					logger.Error(err, "Cannot record that a claim's MIG instances are gone after a reboot", "claim", ref)
				}
			}
			// No process of the last boot uses its HAMi-core region;
			// its accounting is stale, so the rebuild starts a fresh one.
			if d.hami != nil {
				if err := d.hami.Cleanup(c.UID); err != nil {
					logger.Error(err, "Removing a HAMi-core region of the last boot", "claim", ref)
				}
			}
		}
		if c.State != checkpoint.StatePrepared {
			logger.Info("Rolling back a claim whose preparation was interrupted", "claim", ref)
			if err := d.rollback(ctx, c.UID, c); err != nil {
				// Fail closed: the claim keeps its devices and record,
				// and its GPUs take no new claims until an operator or
				// a later unprepare has cleaned up.
				logger.Error(err, "Rolling back an interrupted prepare failed; its GPUs take no new claims", "claim", ref)
				d.restoreUses(ctx, ref, c, owned)
				for _, dev := range c.Devices {
					d.markUnusable(ctx, dev.GPUUUID, fmt.Sprintf("rolling back the interrupted prepare of claim %s failed: %v", ref, err))
				}
			}
			continue
		}
		d.restoreUses(ctx, ref, c, owned)
		logger.V(2).Info("Restored prepared claim", "claim", ref, "devices", len(c.Devices))
	}
	if specs, err := d.cdi.ClaimSpecs(); err != nil {
		logger.Error(err, "Listing CDI specs for orphans")
	} else {
		for _, uid := range specs {
			if !known[uid] {
				logger.Info("Removing orphaned CDI spec", "claimUID", uid)
				if err := d.cdi.RemoveClaim(uid); err != nil {
					logger.Error(err, "Removing orphaned CDI spec", "claimUID", uid)
				}
			}
		}
	}
	if d.hami != nil {
		if caches, err := d.hami.ClaimCaches(); err != nil {
			logger.Error(err, "Listing HAMi-core accounting regions for orphans")
		} else {
			for _, uid := range caches {
				if !known[uid] {
					logger.Info("Removing orphaned HAMi-core accounting region", "claimUID", uid)
					if err := d.hami.Cleanup(uid); err != nil {
						logger.Error(err, "Removing orphaned HAMi-core accounting region", "claimUID", uid)
					}
				}
			}
		}
	}
	if d.mig != nil && anyMIGCapable(d.inv) {
		destroy := o.DestroyUnownedMIG
		if destroy && unknownDevices {
			logger.Info("Not destroying unowned MIG instances at this start: an unreadable checkpoint record may own some of them")
			destroy = false
		}
		d.reconcileMIG(ctx, owned, destroy)
	}
	return d, nil
}

// restoreUses reserves a record's devices again and notes the MIG
// instances it owns.
func (d *Driver) restoreUses(ctx context.Context, ref claimRef, c *checkpoint.Claim, owned map[string]bool) {
	for _, dev := range c.Devices {
		if err := d.occ.admit(dev.GPUUUID, d.limits(dev.GPUUUID), useOf(ref, dev)); err != nil {
			// Two records overlap: do not guess which is right.
			klog.FromContext(ctx).Error(err, "Checkpoint records conflict", "claim", ref)
		}
		if dev.MIG != nil && dev.MIG.Created {
			owned[migKey(dev.GPUUUID, dev.MIG.GIID, dev.MIG.CIID)] = true
		}
	}
}

func migKey(parent string, gi, ci int) string { return fmt.Sprintf("%s/%d/%d", parent, gi, ci) }

func deviceNames(c *checkpoint.Claim) []string {
	var out []string
	for _, dev := range c.Devices {
		out = append(out, dev.Device)
	}
	return out
}

// fromOtherBoot tells whether a record was written before the last reboot.
// Records without a boot ID (earlier versions) and a node whose boot ID is
// unknown are not judged: their claims are verified on re-prepare instead.
func (d *Driver) fromOtherBoot(c *checkpoint.Claim) bool {
	return c.BootID != "" && d.bootID != "" && c.BootID != d.bootID
}

// voidMIG forgets the instance IDs of a record's MIG devices, reporting
// whether there were any.
func voidMIG(c *checkpoint.Claim) bool {
	changed := false
	for i := range c.Devices {
		if c.Devices[i].Kind == kindStaticMIG {
			continue // never Facet's to destroy; rebuild refreshes its IDs
		}
		if m := c.Devices[i].MIG; m != nil && (m.Created || m.UUID != "") {
			m.Created, m.GIID, m.CIID, m.UUID = false, 0, 0, ""
			changed = true
		}
	}
	return changed
}

func (d *Driver) markUnusable(ctx context.Context, gpuUUID, why string) {
	if gpuUUID == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.unusable[gpuUUID]; ok {
		return
	}
	d.unusable[gpuUUID] = why
	klog.FromContext(ctx).Error(nil, "GPU unusable: its claims fail until the plugin restarts with the problem fixed", "gpu", gpuUUID, "why", why)
}

// UnusableGPUs returns, by GPU UUID, why each GPU that a start-up problem
// confined to it must not be offered. The caller unpublishes them.
func (d *Driver) UnusableGPUs() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]string, len(d.unusable))
	for k, v := range d.unusable {
		out[k] = v
	}
	return out
}

// reconcileMIG reports (and, if asked, destroys) MIG instances on GPUs
// Facet manages that no prepared claim owns, GPU by GPU: a GPU NVML cannot
// list, or one left with a half-made instance, becomes unusable alone.
func (d *Driver) reconcileMIG(ctx context.Context, owned map[string]bool, destroy bool) {
	logger := klog.FromContext(ctx)
	for _, g := range d.inv.GPUs {
		if !g.MIGCapable {
			continue
		}
		if g.Mode == inventory.ModeStaticMIG {
			// Its instances are published as devices of their own: not
			// orphans, and never Facet's to destroy.
			continue
		}
		instances, err := d.mig.ListMIGOn(g.UUID)
		if err != nil {
			d.markUnusable(ctx, g.UUID, fmt.Sprintf("listing its MIG instances failed: %v", err))
			continue
		}
		for _, in := range instances {
			if owned[migKey(in.ParentUUID, in.GIID, in.CIID)] {
				continue
			}
			halfMade := in.CIID < 0
			if !destroy {
				logger.Info("MIG instance not owned by any prepared claim; it blocks overlapping placements (start with --destroy-unowned-mig to remove such instances)",
					"gpu", in.ParentIndex, "profile", in.Profile, "placement", in.Placement.Start, "gi", in.GIID, "ci", in.CIID)
				if halfMade {
					d.markUnusable(ctx, g.UUID, fmt.Sprintf("GPU instance %d (%s at memory slice %d) has no compute instance, as a crash while creating it leaves; destroy it (nvidia-smi mig -dgi -gi %d) or restart with --destroy-unowned-mig",
						in.GIID, in.Profile, in.Placement.Start, in.GIID))
				}
				continue
			}
			logger.Info("Destroying MIG instance not owned by any prepared claim", "gpu", in.ParentIndex, "profile", in.Profile, "placement", in.Placement.Start, "gi", in.GIID, "ci", in.CIID)
			if err := d.mig.DestroyMIG(in.ParentUUID, in.GIID, in.CIID); err != nil {
				d.markUnusable(ctx, g.UUID, fmt.Sprintf("destroying unowned MIG instance GI %d CI %d failed: %v", in.GIID, in.CIID, err))
			}
		}
	}
}

func anyMIGCapable(inv *inventory.Inventory) bool {
	for _, g := range inv.GPUs {
		if g.MIGCapable {
			return true
		}
	}
	return false
}

// limits are a GPU's capacities; zero for a GPU the inventory lacks (a
// record from before a GPU was removed), so nothing new fits on it.
func (d *Driver) limits(gpuUUID string) gpuLimits {
	if g := d.gpus[gpuUUID]; g != nil {
		return gpuLimits{memory: int64(g.MemoryBytes)}
	}
	return gpuLimits{}
}

// PrepareResourceClaims prepares each claim independently and concurrently:
// one claim's failure is reported for that claim alone.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, claim := range claims {
		wg.Go(func() {
			devices, err := d.prepareClaim(ctx, claim)
			if err != nil {
				err = fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
				klog.FromContext(ctx).Error(err, "Prepare failed", "claim", klog.KObj(claim))
			}
			mu.Lock()
			results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
			mu.Unlock()
		})
	}
	wg.Wait()
	return results, nil
}

// UnprepareResourceClaims undoes prepare; unknown claims succeed.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	results := make(map[types.UID]error, len(claims))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, claim := range claims {
		wg.Go(func() {
			err := d.unprepareClaim(ctx, claim)
			if err != nil {
				err = fmt.Errorf("claim %s: %w", claim.NamespacedName, err)
			}
			mu.Lock()
			results[claim.UID] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return results, nil
}

// HandleError logs background errors (ResourceSlice publishing). None of
// them is fatal: the slices are rebuilt from the inventory on every sync.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
}

// lock marks a claim busy; a second call for the same claim fails fast and
// the kubelet retries it.
func (d *Driver) lock(uid types.UID) error {
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

func (d *Driver) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if err := claimuid.Validate(claim.UID); err != nil {
		return nil, err
	}
	if err := d.lock(claim.UID); err != nil {
		return nil, err
	}
	defer d.unlock(claim.UID)

	rec, err := d.store.Get(claim.UID)
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.State == checkpoint.StatePrepared {
		// Idempotent: the kubelet asks again after its own restarts. But
		// what the record points at may be gone (a reboot, a lost or
		// truncated spec, a destroyed MIG instance): then it is rebuilt,
		// never handed out stale.
		stale := d.staleness(rec)
		if stale == "" {
			return resultDevices(rec), nil
		}
		klog.FromContext(ctx).Info("Rebuilding a prepared claim", "claim", klog.KObj(claim), "why", stale)
		if err := d.rebuild(ctx, claim, rec); err != nil {
			return nil, fmt.Errorf("rebuild (%s): %w", stale, err)
		}
		return resultDevices(rec), nil
	}
	if rec != nil {
		if err := d.rollback(ctx, claim.UID, rec); err != nil {
			return nil, err
		}
	}

	p, err := d.plan(claim)
	if err != nil {
		return nil, err
	}
	ref := claimRef{claim.UID, claim.Namespace, claim.Name}
	if err := d.admit(ref, p.devices); err != nil {
		return nil, err
	}
	rec = &checkpoint.Claim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.StatePreparing, Devices: p.devices, BootID: d.bootID}
	// Record the intent before any side effect: from here on a crash is
	// rolled back at the next start, so nothing outlives it unrecorded.
	if err := d.store.Put(rec); err != nil {
		d.release(ref)
		return nil, err
	}
	d.failpoint("prepare/recorded-intent")
	if err := d.carveMIG(ctx, rec); err != nil {
		return nil, errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	if err := d.leaveMIG(ctx, rec); err != nil {
		return nil, errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	d.failpoint("prepare/left-mig")
	if err := d.writeSpec(rec, p.vgpu, false); err != nil {
		return nil, errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	d.failpoint("prepare/wrote-spec")
	rec.State = checkpoint.StatePrepared
	if err := d.store.Put(rec); err != nil {
		return nil, errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	d.failpoint("prepare/recorded-prepared")
	klog.FromContext(ctx).V(2).Info("Prepared claim", "claim", klog.KObj(claim), "devices", len(rec.Devices))
	return resultDevices(rec), nil
}

// staleness says why a prepared record cannot be handed out as it is, or
// "" if it can: its spec must exist with the recorded content, its MIG
// instances with the recorded IDs, its HAMi-core region must exist, and
// none of it may date from before a reboot.
func (d *Driver) staleness(rec *checkpoint.Claim) string {
	if d.fromOtherBoot(rec) {
		return "the node rebooted since it was prepared"
	}
	if rec.CDISpecHash != "" {
		if err := d.cdi.Verify(rec.UID, rec.CDISpecHash); err != nil {
			return err.Error()
		}
	} else if _, err := os.Stat(filepath.Join(d.cdi.Dir(), rec.CDISpec)); rec.CDISpec == "" || err != nil {
		return fmt.Sprintf("CDI spec %q is missing", rec.CDISpec)
	}
	for _, dev := range rec.Devices {
		if dev.MIG == nil {
			continue
		}
		if dev.Kind == kindStaticMIG {
			// Not Facet's: it must still be there, with the same IDs.
			if _, ok, err := d.findOwnMIG(dev); err != nil || !ok {
				return fmt.Sprintf("device %s: its static MIG instance (GI %d, CI %d) is gone", dev.Device, dev.MIG.GIID, dev.MIG.CIID)
			}
			continue
		}
		if !dev.MIG.Created {
			return fmt.Sprintf("device %s: its MIG instance is not recorded", dev.Device)
		}
		if _, ok, err := d.findOwnMIG(dev); err != nil || !ok {
			return fmt.Sprintf("device %s: its MIG instance (GI %d, CI %d) is gone", dev.Device, dev.MIG.GIID, dev.MIG.CIID)
		}
	}
	if d.hami != nil && enforcedShares(rec) {
		if dir, err := d.hami.CacheDir(rec.UID); err != nil {
			return err.Error()
		} else if _, err := os.Stat(dir); err != nil {
			return "its HAMi-core accounting region is missing"
		}
	}
	return ""
}

func enforcedShares(rec *checkpoint.Claim) bool {
	for _, dev := range rec.Devices {
		if dev.Share != nil && dev.Share.Enforced {
			return true
		}
	}
	return false
}

// rebuild recreates what a prepared record points at and the record says
// is gone, in place: the claim stays Prepared and keeps its reservation
// throughout, so a failure (reported for this claim) or a crash leaves it
// for the next re-prepare or unprepare, never for another claim.
func (d *Driver) rebuild(ctx context.Context, claim *resourceapi.ResourceClaim, rec *checkpoint.Claim) error {
	p, err := d.plan(claim)
	if err != nil {
		return err
	}
	if err := d.checkUsable(rec.Devices); err != nil {
		return err
	}
	rebooted := d.fromOtherBoot(rec)
	if rebooted {
		// From here the record is this boot's: instance IDs recorded
		// below are real, and a crash must not void them again.
		voidMIG(rec)
		rec.BootID = d.bootID
	}
	// A static instance is whatever the inventory publishes under the
	// device's name now (re-carved by mig-parted or --mig-layouts after a
	// reboot, perhaps with new IDs); the plan read it from there.
	for i := range rec.Devices {
		if rec.Devices[i].Kind != kindStaticMIG {
			continue
		}
		for _, fresh := range p.devices {
			if fresh.Device == rec.Devices[i].Device && fresh.MIG != nil {
				m := *fresh.MIG
				rec.Devices[i].MIG = &m
			}
		}
	}
	for i := range rec.Devices {
		dev := &rec.Devices[i]
		if dev.MIG == nil || !dev.MIG.Created {
			continue
		}
		if _, ok, err := d.findOwnMIG(*dev); err != nil {
			return fmt.Errorf("device %s: %w", dev.Device, err)
		} else if !ok {
			dev.MIG.Created, dev.MIG.GIID, dev.MIG.CIID, dev.MIG.UUID = false, 0, 0, ""
		}
	}
	// The old spec is not trusted again, even where it survived (a CDI
	// directory that is no tmpfs): it may name the instances just voided.
	rec.CDISpec, rec.CDISpecHash = "", ""
	if err := d.store.Put(rec); err != nil {
		return err
	}
	d.failpoint("rebuild/recorded-intent")
	if err := d.carveMIG(ctx, rec); err != nil {
		return err
	}
	if err := d.leaveMIG(ctx, rec); err != nil {
		return err
	}
	// After a reboot no container uses the old accounting region.
	if err := d.writeSpec(rec, p.vgpu, !rebooted); err != nil {
		return err
	}
	rec.BootID = d.bootID
	if err := d.store.Put(rec); err != nil {
		return err
	}
	d.failpoint("rebuild/recorded")
	return nil
}

// plan is a claim's devices resolved against the inventory.
type plan struct {
	devices []checkpoint.Device
	// vgpu is the claim's effective VgpuConfig when it has enforced shares.
	vgpu *configapi.VgpuConfig
}

// plan resolves every result of this driver in the claim's allocation
// against the inventory, and rejects what this node cannot honour.
func (d *Driver) plan(claim *resourceapi.ResourceClaim) (*plan, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("not allocated")
	}
	configs := claim.Status.Allocation.Devices.Config
	p := &plan{}
	vgpuFrom := ""
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != names.Driver {
			continue
		}
		where := fmt.Sprintf("request %q: device %s/%s", r.Request, r.Pool, r.Device)
		if r.Pool != d.nodeName {
			return nil, fmt.Errorf("%s: pool %q is not this node's pool %q", where, r.Pool, d.nodeName)
		}
		dev, ok := d.inv.Device(r.Device)
		if !ok {
			return nil, fmt.Errorf("%s: no such device in this node's inventory", where)
		}
		rec := checkpoint.Device{
			Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID, GPUUUID: dev.GPU.UUID,
		}
		if r.ShareID != nil && !dev.Shareable {
			return nil, fmt.Errorf("%s: allocated as a share (shareID %s), but %s is not shareable in mode %s", where, *r.ShareID, r.Device, dev.GPU.Mode)
		}
		switch {
		case dev.Kind == inventory.KindMIG && dev.Instance != nil:
			// static-mig: the instance exists; prepare only hands it out.
			in := dev.Instance
			rec.Kind = kindStaticMIG
			rec.MIG = &checkpoint.MIG{Profile: dev.MIG.Name, GIProfileID: dev.MIG.GIProfileID, CIProfileID: dev.MIG.CIProfileID, Start: dev.Placement.Start, Size: dev.Placement.Size,
				GIID: in.GIID, CIID: in.CIID, UUID: in.UUID}
		case dev.Kind == inventory.KindMIG:
			rec.Kind = kindMIG
			rec.MIG = &checkpoint.MIG{Profile: dev.MIG.Name, GIProfileID: dev.MIG.GIProfileID, CIProfileID: dev.MIG.CIProfileID, Start: dev.Placement.Start, Size: dev.Placement.Size}
		case dev.Shareable || dev.Kind == inventory.KindSlot:
			share, err := shareOf(r, dev)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			rec.Kind, rec.Share = kindShare, share
			if dev.Kind == inventory.KindSlot {
				rec.Kind = kindSlot
			}
			if share.Enforced {
				cfg, err := configapi.EffectiveVgpuConfig(configs, r.Request)
				if err != nil {
					return nil, err
				}
				if p.vgpu != nil && !equalVgpu(p.vgpu, cfg) {
					return nil, fmt.Errorf("%s: its VgpuConfig differs from that of request %q; HAMi-core takes one configuration per container", where, vgpuFrom)
				}
				p.vgpu, vgpuFrom = cfg, r.Request
				share.Enforced = cfg.EnforcementEnabled()
				if share.MemoryBytes, share.Cores, err = cfg.Limit(share.MemoryBytes, share.Cores); err != nil {
					return nil, fmt.Errorf("%s: VgpuConfig: %w", where, err)
				}
			}
		default:
			rec.Kind = kindWhole
		}
		if rec.Kind != kindShare {
			// Strict decoding: a malformed or unknown config fails the
			// claim rather than being ignored.
			if _, err := configapi.EffectiveGpuConfig(configs, r.Request); err != nil {
				return nil, err
			}
		}
		p.devices = append(p.devices, rec)
	}
	if len(p.devices) == 0 {
		return nil, fmt.Errorf("allocation has no device of driver %s", names.Driver)
	}
	if p.vgpu != nil {
		for _, dev := range p.devices {
			if dev.Kind == kindMIG {
				return nil, fmt.Errorf("device %s: a claim cannot mix MIG devices with enforced vGPU shares (HAMi-core does not manage MIG devices)", dev.Device)
			}
		}
	}
	return p, nil
}

// shareOf reads a share's consumed capacity. The allocator records it in
// the result; a request that asked for nothing consumes the defaults (all
// memory, 100 % SM), which is the whole GPU and needs no enforcement.
//
// A vGPU slot's share is the slot's fixed size.
func shareOf(r resourceapi.DeviceRequestAllocationResult, dev *inventory.Device) (*checkpoint.Share, error) {
	total := int64(dev.GPU.MemoryBytes)
	if dev.Slot != nil {
		return &checkpoint.Share{MemoryBytes: dev.Slot.MemoryBytes, Cores: dev.Slot.Cores,
			Enforced: dev.Slot.MemoryBytes < total || dev.Slot.Cores < 100}, nil
	}
	s := &checkpoint.Share{MemoryBytes: total, Cores: 100}
	if q, ok := r.ConsumedCapacity[names.CapacityMemory]; ok {
		s.MemoryBytes = q.Value()
	}
	if q, ok := r.ConsumedCapacity[names.CapacityCores]; ok {
		s.Cores = q.Value()
	}
	switch {
	case s.MemoryBytes <= 0 || s.MemoryBytes > total:
		return nil, fmt.Errorf("consumed memory %d bytes is outside 1..%d", s.MemoryBytes, total)
	case s.Cores < 0 || s.Cores > 100:
		return nil, fmt.Errorf("consumed cores %d%% is outside 0..100", s.Cores)
	}
	s.Enforced = s.MemoryBytes < total || (s.Cores > 0 && s.Cores < 100)
	return s, nil
}

func equalVgpu(a, b *configapi.VgpuConfig) bool {
	return strings.Join(a.HAMiCoreEnv(), ",") == strings.Join(b.HAMiCoreEnv(), ",") && a.EnforcementEnabled() == b.EnforcementEnabled()
}

// admit reserves all of a claim's devices, or none, refusing conflicts with
// what other claims hold (see occupancy).
func (d *Driver) admit(ref claimRef, devices []checkpoint.Device) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkUsableLocked(devices); err != nil {
		return err
	}
	for _, dev := range devices {
		if err := d.occ.admit(dev.GPUUUID, d.limits(dev.GPUUUID), useOf(ref, dev)); err != nil {
			d.occ.release(ref)
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
	}
	return nil
}

func (d *Driver) checkUsable(devices []checkpoint.Device) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.checkUsableLocked(devices)
}

func (d *Driver) checkUsableLocked(devices []checkpoint.Device) error {
	for _, dev := range devices {
		if why, bad := d.unusable[dev.GPUUUID]; bad {
			return fmt.Errorf("device %s: GPU %s is unusable: %s", dev.Device, dev.GPUUUID, why)
		}
	}
	return nil
}

func (d *Driver) release(ref claimRef) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.occ.release(ref)
}

// carveMIG creates the claim's MIG instances, recording each in the
// checkpoint as soon as it exists.
func (d *Driver) carveMIG(ctx context.Context, rec *checkpoint.Claim) error {
	for i := range rec.Devices {
		dev := &rec.Devices[i]
		if dev.MIG == nil || dev.MIG.Created || dev.Kind == kindStaticMIG {
			continue
		}
		if d.mig == nil {
			return fmt.Errorf("device %s: MIG is not available on this node", dev.Device)
		}
		if _, err := d.mig.EnableMIG(dev.GPUUUID); err != nil {
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
		d.failpoint("prepare/enabled-mig")
		in, err := d.mig.CreateMIG(dev.GPUUUID, dev.MIG.GIProfileID, dev.MIG.Start)
		if err != nil {
			if nvml.IsInsufficientResources(err) {
				err = fmt.Errorf("%w (%s)", err, d.blockers(rec.UID, dev))
			}
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
		// The one window in which a crash leaves an instance the record
		// does not know: it is reported at the next start, not destroyed.
		d.failpoint("after-mig-create")
		dev.MIG.Created, dev.MIG.GIID, dev.MIG.CIID, dev.MIG.UUID = true, in.GIID, in.CIID, in.UUID
		if err := d.store.Put(rec); err != nil {
			// The instance exists and this process knows it: undo it
			// here, as the record cannot say it is ours.
			if derr := d.mig.DestroyMIG(dev.GPUUUID, in.GIID, in.CIID); derr != nil {
				klog.FromContext(ctx).Error(derr, "Destroying a MIG instance whose creation could not be recorded; it is left unowned", "device", dev.Device, "gi", in.GIID, "ci", in.CIID)
			}
			dev.MIG.Created, dev.MIG.GIID, dev.MIG.CIID, dev.MIG.UUID = false, 0, 0, ""
			return err
		}
		d.failpoint("prepare/recorded-mig")
	}
	return nil
}

// leaveMIG turns MIG mode off on the GPUs a claim uses whole or shares:
// with MIG mode on, CUDA sees no device there. Facet turns it on for the
// first MIG device and leaves it on, so a GPU whose MIG claims are gone
// comes back here. Occupancy guarantees no prepared claim holds a MIG
// instance on the GPU; an instance nobody owns makes NVML refuse, and the
// claim fails saying so.
func (d *Driver) leaveMIG(ctx context.Context, rec *checkpoint.Claim) error {
	if d.mig == nil {
		return nil
	}
	for _, dev := range rec.Devices {
		if g := d.gpus[dev.GPUUUID]; dev.MIG != nil || g == nil || !g.MIGCapable {
			continue
		}
		changed, err := d.mig.DisableMIG(dev.GPUUUID)
		if err != nil {
			if nvml.IsInUse(err) {
				return fmt.Errorf("device %s: the GPU still has MIG instances that no prepared claim owns (listed at plugin start; --destroy-unowned-mig removes them): %w", dev.Device, err)
			}
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
		if changed {
			klog.FromContext(ctx).Info("Turned MIG mode off for whole-GPU use", "device", dev.Device, "gpu", dev.GPUUUID)
		}
	}
	return nil
}

// blockers names the MIG instances no prepared claim owns that overlap a
// device's placement, for an error that says why it cannot be created.
func (d *Driver) blockers(uid types.UID, dev *checkpoint.Device) string {
	instances, err := d.mig.ListMIGOn(dev.GPUUUID)
	if err != nil {
		return "listing the GPU's MIG instances failed: " + err.Error()
	}
	var found []string
	for _, in := range instances {
		if in.Placement.Start < dev.MIG.Start+dev.MIG.Size && dev.MIG.Start < in.Placement.Start+in.Placement.Size && !d.ownedByOther(uid, in) {
			found = append(found, fmt.Sprintf("GI %d CI %d (%s at memory slice %d)", in.GIID, in.CIID, in.Profile, in.Placement.Start))
		}
	}
	if len(found) == 0 {
		return "no instance that no claim owns overlaps it"
	}
	return "MIG instances that no prepared claim owns overlap it: " + strings.Join(found, ", ") + "; --destroy-unowned-mig removes them at the next start"
}

// ownedByOther tells whether another claim's record holds an instance (by
// the reservations, which mirror the records).
func (d *Driver) ownedByOther(uid types.UID, in nvml.MIGInstance) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, u := range d.occ[in.ParentUUID] {
		if u.owner.uid != uid && u.kind == kindMIG && u.start == in.Placement.Start {
			return true
		}
	}
	return false
}

// wholeGPUEdits returns a whole GPU's edits, asking nvcdi only once per GPU
// (and again after a failure).
func (d *Driver) wholeGPUEdits(gpuUUID string) (*cdispec.ContainerEdits, error) {
	d.editsMu.Lock()
	entry, ok := d.gpuEdits[gpuUUID]
	if !ok {
		entry = &gpuEditsEntry{}
		d.gpuEdits[gpuUUID] = entry
	}
	d.editsMu.Unlock()
	entry.mu.Lock()
	defer entry.mu.Unlock()
	if entry.edits != nil {
		return entry.edits, nil
	}
	e, err := d.edits.GPUEdits(gpuUUID)
	if err != nil {
		return nil, err
	}
	entry.edits = e
	return e, nil
}

// writeSpec writes the claim's CDI spec. keepRegion rebuilds a prepared
// claim's spec without resetting the HAMi-core region its containers use.
func (d *Driver) writeSpec(rec *checkpoint.Claim, vgpu *configapi.VgpuConfig, keepRegion bool) error {
	devices := make([]cdi.Device, 0, len(rec.Devices))
	var names, uuids []string
	var shares []hami.Share
	seen := map[string]bool{}
	for _, dev := range rec.Devices {
		var edits *cdispec.ContainerEdits
		var err error
		switch {
		case seen[dev.Device]:
			// A second share of a GPU in this claim: the container
			// already gets the GPU's device node from the first, and
			// one node injected twice can fail the container's start.
			// A CDI device needs some edit; this one names the share.
			edits = &cdispec.ContainerEdits{Env: []string{fmt.Sprintf("FACET_SHARE_%d=%s", len(devices), dev.Device)}}
		case dev.MIG != nil:
			edits, err = d.edits.MIGEdits(dev.GPUUUID, dev.MIG.GIID, dev.MIG.CIID)
			uuids = append(uuids, dev.MIG.UUID)
		default:
			edits, err = d.wholeGPUEdits(dev.GPUUUID)
			uuids = append(uuids, dev.GPUUUID)
		}
		if err != nil {
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
		seen[dev.Device] = true
		devices = append(devices, cdi.Device{Name: dev.Device, Edits: edits})
		names = append(names, dev.Device)
		if dev.Share != nil || vgpu != nil {
			// Every GPU the container sees needs a HAMi-core limit, a
			// whole GPU's being all of it (unset means 0 to HAMi-core).
			s := hami.Share{Device: dev.Device, PCIBusID: d.gpus[dev.GPUUUID].PCIBusID, MemoryBytes: d.limits(dev.GPUUUID).memory, Cores: 100}
			if dev.Share != nil {
				s.MemoryBytes, s.Cores = dev.Share.MemoryBytes, dev.Share.Cores
			}
			shares = append(shares, s)
		}
	}
	common := *d.common
	// Claim-wide environment: which devices the container got, readable
	// by the workload and by an operator with kubectl exec. Not
	// NVIDIA_VISIBLE_DEVICES: nvcdi sets it to "void" to tell NVIDIA's
	// legacy hook that CDI did the work.
	common.Env = append(append([]string(nil), common.Env...),
		"FACET_CLAIM="+rec.Namespace+"/"+rec.Name,
		"FACET_DEVICES="+strings.Join(names, ","),
		"FACET_GPU_UUIDS="+strings.Join(uuids, ","),
	)
	if vgpu != nil && vgpu.EnforcementEnabled() {
		if d.hami == nil {
			if d.hamiErr != nil {
				return fmt.Errorf("vGPU shares need HAMi-core, which is unavailable: %w", d.hamiErr)
			}
			return fmt.Errorf("vGPU shares need HAMi-core, but the plugin runs without --hami-library")
		}
		editsFor := d.hami.Edits
		if keepRegion {
			editsFor = d.hami.RebuildEdits
		}
		edits, err := editsFor(rec.UID, shares, vgpu)
		if err != nil {
			return err
		}
		common.Env = append(common.Env, edits.Env...)
		common.Mounts = append(append([]*cdispec.Mount(nil), common.Mounts...), edits.Mounts...)
	}
	specName, ids, hash, err := d.cdi.WriteClaim(rec.UID, &common, devices)
	if err != nil {
		return err
	}
	rec.CDISpec, rec.CDISpecHash = specName, hash
	for i := range rec.Devices {
		rec.Devices[i].CDIDeviceIDs = []string{ids[i]}
	}
	return nil
}

// rollback removes whatever a claim's preparation left: MIG instances it
// owns, CDI spec, HAMi-core cache, checkpoint record, and only then the
// reservation. rec may be nil (no record). It is safe to repeat: a failure
// leaves the record and the reservation in place so the next unprepare or
// start tries again, and no other claim is admitted onto devices whose
// cleanup is unfinished. Each destroyed instance is recorded as gone
// before the next step, because NVML reuses GI/CI IDs: a retry must not
// destroy whatever got them next.
func (d *Driver) rollback(ctx context.Context, uid types.UID, rec *checkpoint.Claim) error {
	if rec != nil && d.fromOtherBoot(rec) {
		// Normally voided at start already; this covers a start that
		// could not write the voided record back.
		voidMIG(rec)
	}
	if rec != nil {
		for i := range rec.Devices {
			dev := &rec.Devices[i]
			if dev.MIG == nil || dev.Kind == kindStaticMIG {
				// A static instance outlives its claims: it is the device.
				continue
			}
			if !dev.MIG.Created {
				d.reportUnrecorded(ctx, rec, dev)
				continue
			}
			if err := d.destroyMIG(ctx, rec, dev); err != nil {
				return fmt.Errorf("device %s: %w", dev.Device, err)
			}
			d.failpoint("rollback/destroyed-mig")
			dev.MIG.Created, dev.MIG.GIID, dev.MIG.CIID, dev.MIG.UUID = false, 0, 0, ""
			if err := d.store.Put(rec); err != nil {
				return err
			}
			d.failpoint("rollback/recorded-mig-gone")
		}
	}
	if err := d.cdi.RemoveClaim(uid); err != nil {
		return err
	}
	d.failpoint("rollback/removed-spec")
	if d.hami != nil {
		if err := d.hami.Cleanup(uid); err != nil {
			return err
		}
	}
	d.failpoint("rollback/removed-cache")
	if err := d.store.Delete(uid); err != nil {
		return err
	}
	d.failpoint("rollback/deleted-record")
	d.release(claimRef{uid: uid})
	return nil
}

// reportUnrecorded logs an instance that may be what an interrupted
// CreateMIG left: at the device's profile and placement, made in this
// boot. It is not destroyed, because nothing proves it is the claim's: an
// admin or another tool may have made it (--destroy-unowned-mig).
func (d *Driver) reportUnrecorded(ctx context.Context, rec *checkpoint.Claim, dev *checkpoint.Device) {
	if d.mig == nil || d.fromOtherBoot(rec) {
		return
	}
	instances, err := d.mig.ListMIGOn(dev.GPUUUID)
	if err != nil {
		return
	}
	for _, in := range instances {
		if in.GIProfileID == dev.MIG.GIProfileID && in.Placement.Start == dev.MIG.Start {
			klog.FromContext(ctx).Info("MIG instance at the placement of an interrupted prepare, whose IDs were never recorded; not destroyed, as it may not be the claim's (--destroy-unowned-mig removes it at start)",
				"claim", rec.Namespace+"/"+rec.Name, "device", dev.Device, "gpu", dev.GPUUUID, "gi", in.GIID, "ci", in.CIID)
		}
	}
}

// findOwnMIG finds the instance a device's record holds: the recorded GI
// and CI, and the recorded profile, placement and (when known) UUID, so an
// instance that reused the IDs is not taken for it.
func (d *Driver) findOwnMIG(dev checkpoint.Device) (nvml.MIGInstance, bool, error) {
	if d.mig == nil {
		return nvml.MIGInstance{}, false, fmt.Errorf("MIG is not available on this node")
	}
	instances, err := d.mig.ListMIGOn(dev.GPUUUID)
	if err != nil {
		return nvml.MIGInstance{}, false, err
	}
	for _, in := range instances {
		if in.GIID == dev.MIG.GIID && in.CIID == dev.MIG.CIID && in.GIProfileID == dev.MIG.GIProfileID &&
			in.Placement.Start == dev.MIG.Start && (dev.MIG.UUID == "" || in.UUID == dev.MIG.UUID) {
			return in, true, nil
		}
	}
	return nvml.MIGInstance{}, false, nil
}

// destroyMIG destroys a claim's MIG instance if it is still there.
func (d *Driver) destroyMIG(ctx context.Context, rec *checkpoint.Claim, dev *checkpoint.Device) error {
	in, ok, err := d.findOwnMIG(*dev)
	if err != nil || !ok {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Destroying MIG instance", "claim", rec.Namespace+"/"+rec.Name, "device", dev.Device, "gi", in.GIID, "ci", in.CIID)
	return d.mig.DestroyMIG(in.ParentUUID, in.GIID, in.CIID)
}

func (d *Driver) unprepareClaim(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
	if err := claimuid.Validate(claim.UID); err != nil {
		return err
	}
	if err := d.lock(claim.UID); err != nil {
		return err
	}
	defer d.unlock(claim.UID)
	rec, err := d.store.Get(claim.UID)
	if err != nil && !errors.Is(err, checkpoint.ErrCorrupt) {
		return err
	}
	if err != nil {
		// The record is unreadable, but the spec and cache names derive
		// from the UID alone, so those are still cleaned up. Its MIG
		// instances, as far as the record can be read, are destroyed
		// only where the live instance matches it in every recorded
		// detail; anything else is reported at the next start.
		klog.FromContext(ctx).Error(err, "Unpreparing a claim whose checkpoint record is corrupt", "claim", claim.NamespacedName)
		rec, _ = d.store.Salvage(claim.UID)
		if rec != nil {
			// Rollback rewrites the record by its UID: never another's.
			rec.UID = claim.UID
			for i := range rec.Devices {
				if m := rec.Devices[i].MIG; m != nil && m.UUID == "" {
					m.Created = false
				}
			}
		}
	} else if rec == nil {
		return nil
	}
	if err := d.rollback(ctx, claim.UID, rec); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Unprepared claim", "claim", claim.NamespacedName)
	return nil
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
