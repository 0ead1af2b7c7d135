package dradriver

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/gpuhealth"
)

// ledger is what the node's GPUs hold and whether they take new claims:
// the reservations of the claims prepared or being prepared, the GPUs a
// start-up problem made unusable, and the GPUs' health faults. One mutex
// guards them, held only for admission and reads: NVML calls happen
// outside it, so claims on other GPUs never wait for them. Each change of
// the reservations is signalled to the MIG use's reader (migUse).
type ledger struct {
	// limits are each GPU's capacities, by GPU UUID; a GPU the inventory
	// lacks (a record from before it was removed) has none, so nothing
	// new fits on it.
	limits map[string]gpuLimits

	mu  sync.Mutex
	occ reservations
	// unusable holds, by GPU UUID, why a GPU must not get new claims: a
	// start-up problem confined to it (a rollback that failed, a
	// half-made MIG instance, an NVML error).
	unusable map[string]string
	// faults are the GPUs' health faults (setFaults), by GPU UUID.
	faults map[string]gpuhealth.Fault
	migUse migUse
}

func newLedger(inv *inventory.Inventory) *ledger {
	l := &ledger{
		limits:   map[string]gpuLimits{},
		occ:      reservations{},
		unusable: map[string]string{},
		faults:   map[string]gpuhealth.Fault{},
		migUse:   newMIGUse(),
	}
	for _, g := range inv.GPUs {
		l.limits[g.UUID] = gpuLimits{memory: g.ShareMemoryBytes}
	}
	return l
}

// admit reserves all of a claim's devices, or none, refusing conflicts with
// what other claims hold (see reservations) and GPUs that take no claim
// (checkUsable).
func (l *ledger) admit(ref claimRef, devices []checkpoint.Device) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkUsableLocked(devices); err != nil {
		return err
	}
	for _, dev := range devices {
		if dev.Kind == kindIMEXChannel {
			continue // on no GPU
		}
		if err := l.occ.admit(dev.GPUUUID, l.limits[dev.GPUUUID], useOf(ref, dev)); err != nil {
			l.occ.release(ref)
			return fmt.Errorf("device %s: %w", dev.Device, err)
		}
	}
	l.migUse.note(l.occ)
	return nil
}

// checkUsable fails, naming the device and why, if a device's GPU is
// unusable or has a fatal fault.
func (l *ledger) checkUsable(devices []checkpoint.Device) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkUsableLocked(devices)
}

func (l *ledger) checkUsableLocked(devices []checkpoint.Device) error {
	for _, dev := range devices {
		if why, bad := l.unusable[dev.GPUUUID]; bad {
			return fmt.Errorf("device %s: GPU %s is unusable: %s", dev.Device, dev.GPUUUID, why)
		}
		// A recoverable fault (NoSchedule) keeps what is already
		// allocated; a fatal one (NoExecute) refuses it too.
		if f, bad := l.faults[dev.GPUUUID]; bad && f.Fatal {
			return fmt.Errorf("device %s: GPU %s is unhealthy: %s; it serves no claim until an operator recovers it", dev.Device, dev.GPUUUID, f)
		}
	}
	return nil
}

// release gives back every device a claim holds.
func (l *ledger) release(ref claimRef) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.occ.release(ref)
	l.migUse.note(l.occ)
}

// restore reserves a record's devices again, as the checkpoint has them:
// no usability check, and a conflict between two records is logged, not
// resolved (which is right is not guessed).
func (l *ledger) restore(ctx context.Context, ref claimRef, devices []checkpoint.Device) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.restoreLocked(ctx, ref, devices)
}

func (l *ledger) restoreLocked(ctx context.Context, ref claimRef, devices []checkpoint.Device) {
	for _, dev := range devices {
		if err := l.occ.admit(dev.GPUUUID, l.limits[dev.GPUUUID], useOf(ref, dev)); err != nil {
			klog.FromContext(ctx).Error(err, "Checkpoint records conflict", "claim", ref)
		}
	}
}

// heldRecord is a checkpoint record's claim and devices, for reload.
type heldRecord struct {
	ref     claimRef
	devices []checkpoint.Device
}

// reload replaces the reservations with the records', in one step: no
// reader sees them half rebuilt.
func (l *ledger) reload(ctx context.Context, records []heldRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.occ = reservations{}
	for _, r := range records {
		l.restoreLocked(ctx, r.ref, r.devices)
	}
	l.migUse.note(l.occ)
}

// holds says whether a claim has devices reserved.
func (l *ledger) holds(uid types.UID) bool {
	_, ok := l.owner(uid)
	return ok
}

// owner finds a claim that holds devices by its UID.
func (l *ledger) owner(uid types.UID) (claimRef, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, uses := range l.occ {
		for _, u := range uses {
			if u.owner.uid == uid {
				return u.owner, true
			}
		}
	}
	return claimRef{}, false
}

// usesOf are the devices a claim holds.
func (l *ledger) usesOf(uid types.UID) []use {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []use
	for _, uses := range l.occ {
		for _, u := range uses {
			if u.owner.uid == uid {
				out = append(out, u)
			}
		}
	}
	return out
}

// migHeldByOther tells whether a claim other than uid holds the MIG
// placement at start on GPU gpu.
func (l *ledger) migHeldByOther(uid types.UID, gpu string, start int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, u := range l.occ[gpu] {
		if u.owner.uid != uid && u.kind == kindMIG && u.start == start {
			return true
		}
	}
	return false
}

// snapshot is a copy of the reservations, for readers that take their
// time (a metrics scrape).
func (l *ledger) snapshot() reservations {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(reservations, len(l.occ))
	for gpu, uses := range l.occ {
		out[gpu] = append([]use(nil), uses...)
	}
	return out
}

// migInUse is the reservations' migInUse now.
func (l *ledger) migInUse() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.occ.migInUse()
}

// migUseChanges is signalled, coalesced, each time migInUse changes.
func (l *ledger) migUseChanges() <-chan struct{} { return l.migUse.ch }

// markUnusable keeps a GPU from new claims until the plugin restarts,
// keeping the first reason it was given.
func (l *ledger) markUnusable(ctx context.Context, gpuUUID, why string) {
	if gpuUUID == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.unusable[gpuUUID]; ok {
		return
	}
	l.unusable[gpuUUID] = why
	klog.FromContext(ctx).Error(nil, "GPU unusable: its claims fail until the plugin restarts with the problem fixed", "gpu", gpuUUID, "why", why)
}

// unusableGPUs is a copy of the unusable GPUs, by UUID, with why.
func (l *ledger) unusableGPUs() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.unusable))
	for k, v := range l.unusable {
		out[k] = v
	}
	return out
}

// setFaults replaces the GPUs' health faults with a copy of faults.
func (l *ledger) setFaults(faults map[string]gpuhealth.Fault) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.faults = make(map[string]gpuhealth.Fault, len(faults))
	for k, v := range faults {
		l.faults[k] = v
	}
}

// unhealthy is, by GPU UUID, why each GPU that is unusable or has a
// fault is unhealthy; the unusable reason wins.
func (l *ledger) unhealthy() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.unusable)+len(l.faults))
	for k, f := range l.faults {
		out[k] = f.String()
	}
	for k, v := range l.unusable {
		out[k] = v
	}
	return out
}
