// Package driver is Facet's DRA kubelet plugin: it prepares and unprepares
// ResourceClaims for the kubelet (k8s.io/dynamic-resource-allocation/kubeletplugin)
// from the node's inventory, writing one CDI spec per claim and recording
// every step in the checkpoint.
package driver

import (
	"context"
	"errors"
	"fmt"
	"sort"
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
	"github.com/facet-gpu/facet/pkg/inventory"
)

// EditSource yields the NVIDIA driver's CDI edits (package nvml, via nvcdi).
type EditSource interface {
	// CommonEdits are what every GPU container needs: control device
	// nodes, driver libraries and binaries, hooks.
	CommonEdits() (*cdispec.ContainerEdits, error)
	// GPUEdits are one whole GPU's own edits (its /dev/nvidiaN).
	GPUEdits(uuid string) (*cdispec.ContainerEdits, error)
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	nodeName string
	inv      *inventory.Inventory
	store    *checkpoint.Store
	cdi      *cdi.Writer
	edits    EditSource

	// common edits are the same for every claim; computed once.
	common *cdispec.ContainerEdits

	mu sync.Mutex
	// owner maps a reserved exclusive device to the claim holding it.
	owner map[string]claimRef
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
}

// New restores the prepared claims from the checkpoint, rolls back claims
// whose preparation a crash interrupted, and removes Facet CDI specs that
// no record owns. Corrupt records are logged and left for an operator; the
// plugin still starts.
func New(ctx context.Context, o Options) (*Driver, error) {
	logger := klog.FromContext(ctx)
	d := &Driver{
		nodeName: o.NodeName,
		inv:      o.Inventory,
		store:    o.Store,
		cdi:      o.CDI,
		edits:    o.Edits,
		owner:    map[string]claimRef{},
		busy:     map[types.UID]bool{},
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
		logger.Error(err, "Checkpoint record unreadable; its claim fails to prepare until the record is removed", "claimUID", uid)
	}
	for _, c := range claims {
		known[c.UID] = true
		ref := claimRef{c.UID, c.Namespace, c.Name}
		if c.State != checkpoint.StatePrepared {
			logger.Info("Rolling back a claim whose preparation was interrupted", "claim", ref)
			if err := d.rollback(c.UID); err != nil {
				return nil, err
			}
			continue
		}
		for _, dev := range c.Devices {
			if prev, taken := d.owner[dev.Device]; taken {
				// Two records own one device: do not guess which is right.
				logger.Error(nil, "Device recorded as prepared for two claims", "device", dev.Device, "claim", ref, "other", prev)
				continue
			}
			d.owner[dev.Device] = ref
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
	return d, nil
}

// PrepareResourceClaims prepares each claim independently and concurrently:
// one claim's failure is reported for that claim alone.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, claim := range claims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			devices, err := d.prepareClaim(ctx, claim)
			if err != nil {
				err = fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
				klog.FromContext(ctx).Error(err, "Prepare failed", "claim", klog.KObj(claim))
			}
			mu.Lock()
			results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
			mu.Unlock()
		}()
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := d.unprepareClaim(ctx, claim)
			if err != nil {
				err = fmt.Errorf("claim %s: %w", claim.NamespacedName, err)
			}
			mu.Lock()
			results[claim.UID] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return results, nil
}

// HandleError logs background errors (ResourceSlice publishing). None of
// them is fatal: the slices are rebuilt from the inventory on every sync.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
}

// lock marks a claim busy; the second caller for one claim waits its turn
// by failing fast, and the kubelet retries.
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

// planned is one allocated device resolved against the inventory.
type planned struct {
	result resourceapi.DeviceRequestAllocationResult
	device *inventory.Device
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
		if err := d.rollback(claim.UID); err != nil {
			return nil, err
		}
	}

	plan, err := d.plan(claim)
	if err != nil {
		return nil, err
	}
	ref := claimRef{claim.UID, claim.Namespace, claim.Name}
	if err := d.reserve(ref, plan); err != nil {
		return nil, err
	}
	rec = &checkpoint.Claim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.StatePreparing}
	for _, p := range plan {
		rec.Devices = append(rec.Devices, checkpoint.Device{
			Requests: []string{p.result.Request},
			Pool:     p.result.Pool,
			Device:   p.result.Device,
			ShareID:  p.result.ShareID,
			GPUUUID:  p.device.GPU.UUID,
		})
	}
	// The Preparing record comes first: from here on a crash is rolled
	// back at the next start, so no side effect outlives it unrecorded.
	if err := d.store.Put(rec); err != nil {
		d.release(ref.uid)
		return nil, err
	}
	if err := d.writeSpec(rec); err != nil {
		return nil, errors.Join(err, d.rollback(claim.UID))
	}
	rec.State = checkpoint.StatePrepared
	if err := d.store.Put(rec); err != nil {
		return nil, errors.Join(err, d.rollback(claim.UID))
	}
	klog.FromContext(ctx).V(2).Info("Prepared claim", "claim", klog.KObj(claim), "devices", len(rec.Devices))
	return resultDevices(rec), nil
}

// plan resolves every result of this driver in the claim's allocation
// against the inventory, and rejects what this node cannot honour.
func (d *Driver) plan(claim *resourceapi.ResourceClaim) ([]planned, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("not allocated")
	}
	var plan []planned
	seen := map[string]bool{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != inventory.DriverName {
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
		if r.ShareID != nil {
			return nil, fmt.Errorf("%s: allocated as a share (shareID %s), but %s is not shareable in mode %s", where, *r.ShareID, r.Device, dev.GPU.Mode)
		}
		if seen[r.Device] {
			return nil, fmt.Errorf("%s: allocated twice in one claim", where)
		}
		// Strict decoding: a malformed or unknown config fails the claim
		// rather than being ignored.
		if _, err := configapi.EffectiveGpuConfig(claim.Status.Allocation.Devices.Config, r.Request); err != nil {
			return nil, err
		}
		seen[r.Device] = true
		plan = append(plan, planned{result: r, device: dev})
	}
	if len(plan) == 0 {
		return nil, fmt.Errorf("allocation has no device of driver %s", inventory.DriverName)
	}
	return plan, nil
}

// reserve claims exclusive devices for ref, or refuses naming the holder.
// This is the last line of defense the kubeletplugin contract asks for:
// the scheduler should never double-book, but if it does, the second claim
// fails and the first is untouched.
func (d *Driver) reserve(ref claimRef, plan []planned) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range plan {
		if holder, taken := d.owner[p.result.Device]; taken && holder.uid != ref.uid {
			return fmt.Errorf("device %s (GPU %s) is already prepared for claim %s", p.result.Device, p.device.GPU.UUID, holder)
		}
	}
	for _, p := range plan {
		d.owner[p.result.Device] = ref
	}
	return nil
}

func (d *Driver) release(uid types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for dev, holder := range d.owner {
		if holder.uid == uid {
			delete(d.owner, dev)
		}
	}
}

func (d *Driver) writeSpec(rec *checkpoint.Claim) error {
	devices := make([]cdi.Device, 0, len(rec.Devices))
	var names, uuids []string
	for _, dev := range rec.Devices {
		edits, err := d.edits.GPUEdits(dev.GPUUUID)
		if err != nil {
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
		devices = append(devices, cdi.Device{Name: dev.Device, Edits: edits})
		names = append(names, dev.Device)
		uuids = append(uuids, dev.GPUUUID)
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

// rollback removes whatever a claim's preparation left: CDI spec,
// reservations, checkpoint record. Safe on a claim with none of them.
func (d *Driver) rollback(uid types.UID) error {
	if err := d.cdi.RemoveClaim(uid); err != nil {
		return err
	}
	d.release(uid)
	return d.store.Delete(uid)
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
		// The record is unreadable, but the spec's name derives from the
		// UID alone, so the claim can still be cleaned up completely.
		klog.FromContext(ctx).Error(err, "Unpreparing a claim whose checkpoint record is corrupt", "claim", claim.NamespacedName)
	} else if rec == nil {
		return nil
	}
	if err := d.rollback(claim.UID); err != nil {
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

// Prepared lists the prepared claims' devices, for tests and facetctl.
func (d *Driver) Prepared() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]string{}
	keys := make([]string, 0, len(d.owner))
	for k := range d.owner {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out[k] = d.owner[k].String()
	}
	return out
}
