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
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	nodeName string
	inv      *inventory.Inventory
	store    *checkpoint.Store
	cdi      *cdi.Writer
	edits    EditSource
	mig      MIGManager
	hami     *hami.Editor
	fail     func(string)

	// common edits are the same for every claim; computed once.
	common *cdispec.ContainerEdits
	// gpus finds an inventory GPU by UUID.
	gpus map[string]*inventory.GPU
	// gpuEdits caches each whole GPU's edits, which depend only on the
	// GPU: nvcdi walks NVML and the driver root for them, which prepare
	// need not repeat. Filled on first use, so one GPU nvcdi cannot
	// describe fails only the claims on it.
	editsMu  sync.Mutex
	gpuEdits map[string]*cdispec.ContainerEdits

	mu sync.Mutex
	// occ is what is prepared on each GPU. Held under mu only for
	// admission: NVML calls happen outside it, so claims on other GPUs
	// never wait for them.
	occ occupancy
	// busy marks claims being prepared or unprepared, so two calls for one
	// claim never interleave.
	busy map[types.UID]bool
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
	// Failpoint, when set, is called at named points of prepare so tests
	// can kill the plugin there ("after-mig-create": the instance exists
	// but the checkpoint does not know its IDs yet).
	Failpoint func(name string)
	// DestroyUnownedMIG destroys, at start, MIG instances that no prepared
	// claim owns. Off by default: they are only reported, because someone
	// else (an admin with nvidia-smi) may have made them.
	DestroyUnownedMIG bool
}

// New restores the prepared claims from the checkpoint, rolls back claims
// whose preparation a crash interrupted (destroying their MIG instances),
// removes Facet CDI specs that no record owns, and reports MIG instances no
// claim owns. Corrupt records are logged and left for an operator; the
// plugin still starts.
func New(ctx context.Context, o Options) (*Driver, error) {
	logger := klog.FromContext(ctx)
	d := &Driver{
		nodeName: o.NodeName,
		inv:      o.Inventory,
		store:    o.Store,
		cdi:      o.CDI,
		edits:    o.Edits,
		mig:      o.MIG,
		hami:     o.HAMi,
		fail:     o.Failpoint,
		occ:      occupancy{},
		busy:     map[types.UID]bool{},
		gpus:     map[string]*inventory.GPU{},
		gpuEdits: map[string]*cdispec.ContainerEdits{},
	}
	for _, g := range o.Inventory.GPUs {
		d.gpus[g.UUID] = g
	}
	common, err := o.Edits.CommonEdits()
	if err != nil {
		return nil, fmt.Errorf("NVIDIA driver CDI edits: %w", err)
	}
	d.common = common

	claims, corrupt, err := d.store.List()
	if err != nil {
		return nil, err
	}
	known := map[types.UID]bool{}
	for uid, err := range corrupt {
		known[uid] = true
		logger.Error(err, "Checkpoint record unreadable; its claim fails to prepare until it is unprepared or the record is removed", "claimUID", uid)
	}
	owned := map[string]bool{} // "<parent>/<gi>/<ci>" of MIG instances prepared claims hold
	for _, c := range claims {
		known[c.UID] = true
		ref := claimRef{c.UID, c.Namespace, c.Name}
		if c.State != checkpoint.StatePrepared {
			logger.Info("Rolling back a claim whose preparation was interrupted", "claim", ref)
			if err := d.rollback(ctx, c.UID, c); err != nil {
				return nil, fmt.Errorf("roll back claim %s: %w", ref, err)
			}
			continue
		}
		for _, dev := range c.Devices {
			if err := d.occ.admit(dev.GPUUUID, d.limits(dev.GPUUUID), useOf(ref, dev)); err != nil {
				// Two records overlap: do not guess which is right.
				logger.Error(err, "Checkpoint records conflict", "claim", ref)
			}
			if dev.MIG != nil && dev.MIG.Created {
				owned[fmt.Sprintf("%s/%d/%d", dev.GPUUUID, dev.MIG.GIID, dev.MIG.CIID)] = true
			}
		}
		logger.V(2).Info("Restored prepared claim", "claim", ref, "devices", len(c.Devices))
	}
	specs, err := d.cdi.ClaimSpecs()
	if err != nil {
		return nil, err
	}
	for _, uid := range specs {
		if !known[uid] {
			logger.Info("Removing orphaned CDI spec", "claimUID", uid)
			if err := d.cdi.RemoveClaim(uid); err != nil {
				return nil, err
			}
		}
	}
	if d.hami != nil {
		caches, err := d.hami.ClaimCaches()
		if err != nil {
			return nil, err
		}
		for _, uid := range caches {
			if !known[uid] {
				logger.Info("Removing orphaned HAMi-core accounting region", "claimUID", uid)
				if err := d.hami.Cleanup(uid); err != nil {
					return nil, err
				}
			}
		}
	}
	if d.mig != nil && anyMIGCapable(d.inv) {
		if err := d.reconcileMIG(ctx, owned, o.DestroyUnownedMIG); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// reconcileMIG reports (and, if asked, destroys) MIG instances on GPUs
// Facet manages that no prepared claim owns.
func (d *Driver) reconcileMIG(ctx context.Context, owned map[string]bool, destroy bool) error {
	logger := klog.FromContext(ctx)
	instances, err := d.mig.ListMIG()
	if err != nil {
		return fmt.Errorf("list MIG instances: %w", err)
	}
	for _, in := range instances {
		if owned[fmt.Sprintf("%s/%d/%d", in.ParentUUID, in.GIID, in.CIID)] {
			continue
		}
		if g := d.gpus[in.ParentUUID]; g != nil && g.Mode == inventory.ModeStaticMIG {
			continue // published as a device of its own: not an orphan
		}
		if !destroy {
			logger.Info("MIG instance not owned by any prepared claim; it blocks overlapping placements (start with --destroy-unowned-mig to remove such instances)",
				"gpu", in.ParentIndex, "profile", in.Profile, "placement", in.Placement.Start, "gi", in.GIID, "ci", in.CIID)
			continue
		}
		logger.Info("Destroying MIG instance not owned by any prepared claim", "gpu", in.ParentIndex, "profile", in.Profile, "placement", in.Placement.Start, "gi", in.GIID, "ci", in.CIID)
		if err := d.mig.DestroyMIG(in.ParentUUID, in.GIID, in.CIID); err != nil {
			return err
		}
	}
	return nil
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

func (d *Driver) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if err := d.lock(claim.UID); err != nil {
		return nil, err
	}
	defer d.unlock(claim.UID)

	rec, err := d.store.Get(claim.UID)
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.State == checkpoint.StatePrepared {
		// Idempotent: the kubelet asks again after its own restarts.
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
	rec = &checkpoint.Claim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.StatePreparing, Devices: p.devices}
	// Record the intent before any side effect: from here on a crash is
	// rolled back at the next start, so nothing outlives it unrecorded.
	if err := d.store.Put(rec); err != nil {
		d.release(ref)
		return nil, err
	}
	if err := d.carveMIG(rec); err != nil {
		return nil, errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	if err := d.leaveMIG(ctx, rec); err != nil {
		return nil, errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	if err := d.writeSpec(rec, p.vgpu); err != nil {
		return nil, errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	rec.State = checkpoint.StatePrepared
	if err := d.store.Put(rec); err != nil {
		return nil, errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	klog.FromContext(ctx).V(2).Info("Prepared claim", "claim", klog.KObj(claim), "devices", len(rec.Devices))
	return resultDevices(rec), nil
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
	for _, dev := range devices {
		if err := d.occ.admit(dev.GPUUUID, d.limits(dev.GPUUUID), useOf(ref, dev)); err != nil {
			d.occ.release(ref)
			return fmt.Errorf("device %s: %w", dev.Device, err)
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
func (d *Driver) carveMIG(rec *checkpoint.Claim) error {
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
		in, err := d.mig.CreateMIG(dev.GPUUUID, dev.MIG.GIProfileID, dev.MIG.Start)
		if err != nil {
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
		if d.fail != nil {
			d.fail("after-mig-create")
		}
		dev.MIG.Created, dev.MIG.GIID, dev.MIG.CIID, dev.MIG.UUID = true, in.GIID, in.CIID, in.UUID
		if err := d.store.Put(rec); err != nil {
			return err
		}
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

// wholeGPUEdits returns a whole GPU's edits, asking nvcdi only once per GPU.
func (d *Driver) wholeGPUEdits(gpuUUID string) (*cdispec.ContainerEdits, error) {
	d.editsMu.Lock()
	defer d.editsMu.Unlock()
	if e, ok := d.gpuEdits[gpuUUID]; ok {
		return e, nil
	}
	e, err := d.edits.GPUEdits(gpuUUID)
	if err != nil {
		return nil, err
	}
	d.gpuEdits[gpuUUID] = e
	return e, nil
}

func (d *Driver) writeSpec(rec *checkpoint.Claim, vgpu *configapi.VgpuConfig) error {
	devices := make([]cdi.Device, 0, len(rec.Devices))
	var names, uuids []string
	var shares []hami.Share
	for _, dev := range rec.Devices {
		var edits *cdispec.ContainerEdits
		var err error
		if dev.MIG != nil {
			edits, err = d.edits.MIGEdits(dev.GPUUUID, dev.MIG.GIID, dev.MIG.CIID)
			uuids = append(uuids, dev.MIG.UUID)
		} else {
			edits, err = d.wholeGPUEdits(dev.GPUUUID)
			uuids = append(uuids, dev.GPUUUID)
		}
		if err != nil {
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
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
			return fmt.Errorf("vGPU shares need HAMi-core, but the plugin runs without --hami-library")
		}
		edits, err := d.hami.Edits(rec.UID, shares, vgpu)
		if err != nil {
			return err
		}
		common.Env = append(common.Env, edits.Env...)
		common.Mounts = append(append([]*cdispec.Mount(nil), common.Mounts...), edits.Mounts...)
	}
	specName, ids, err := d.cdi.WriteClaim(rec.UID, &common, devices)
	if err != nil {
		return err
	}
	rec.CDISpec = specName
	for i := range rec.Devices {
		rec.Devices[i].CDIDeviceIDs = []string{ids[i]}
	}
	return nil
}

// rollback removes whatever a claim's preparation left: MIG instances, CDI
// spec, HAMi-core cache, reservations, checkpoint record. rec may be nil
// (no or an unreadable record). It is safe to repeat: a failure leaves the
// record in place so the next unprepare or start tries again.
func (d *Driver) rollback(ctx context.Context, uid types.UID, rec *checkpoint.Claim) error {
	if rec != nil {
		for i := range rec.Devices {
			dev := &rec.Devices[i]
			if dev.MIG == nil || dev.Kind == kindStaticMIG {
				// A static instance outlives its claims: it is the device.
				continue
			}
			if err := d.destroyMIG(ctx, rec, dev); err != nil {
				return fmt.Errorf("device %s: %w", dev.Device, err)
			}
		}
	}
	if err := d.cdi.RemoveClaim(uid); err != nil {
		return err
	}
	if d.hami != nil {
		if err := d.hami.Cleanup(uid); err != nil {
			return err
		}
	}
	d.release(claimRef{uid: uid})
	return d.store.Delete(uid)
}

// destroyMIG destroys a claim's MIG instance. An instance whose creation
// was never recorded (a crash between CreateMIG and the checkpoint write)
// is found by its profile and placement, which no other claim can hold.
func (d *Driver) destroyMIG(ctx context.Context, rec *checkpoint.Claim, dev *checkpoint.Device) error {
	if d.mig == nil {
		return fmt.Errorf("MIG is not available on this node")
	}
	if dev.MIG.Created {
		return d.mig.DestroyMIG(dev.GPUUUID, dev.MIG.GIID, dev.MIG.CIID)
	}
	instances, err := d.mig.ListMIG()
	if err != nil {
		return err
	}
	for _, in := range instances {
		if in.ParentUUID == dev.GPUUUID && in.GIProfileID == dev.MIG.GIProfileID && in.Placement.Start == dev.MIG.Start {
			klog.FromContext(ctx).Info("Destroying MIG instance of an interrupted prepare", "claim", rec.Namespace+"/"+rec.Name, "device", dev.Device, "gi", in.GIID, "ci", in.CIID)
			return d.mig.DestroyMIG(in.ParentUUID, in.GIID, in.CIID)
		}
	}
	return nil
}

func (d *Driver) unprepareClaim(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
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
		// from the UID alone, so those are still cleaned up. A MIG
		// instance it may have held is reported at the next start.
		klog.FromContext(ctx).Error(err, "Unpreparing a claim whose checkpoint record is corrupt", "claim", claim.NamespacedName)
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
