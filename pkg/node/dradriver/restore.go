package dradriver

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// restore brings back, at start, what the checkpoint records: it
// restores the prepared claims, rolls back claims whose preparation a
// crash interrupted (destroying the MIG instances they own), removes
// Facet CDI specs, temp files and HAMi-core regions that no record owns,
// and reports (or, with DestroyUnownedMIG, destroys) MIG instances no
// claim owns. Only an unreadable checkpoint directory fails it.
func (d *Driver) restore(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if removed, err := d.spec.cdi.SweepTemp(); err != nil {
		logger.Error(err, "Sweeping temporary CDI spec files")
	} else if len(removed) > 0 {
		logger.Info("Removed temporary CDI spec files left by a crash", "files", removed)
	}

	claims, corrupt, err := d.store.List()
	if err != nil {
		return err
	}
	known := map[types.UID]bool{}
	// owned is "<parent>/<gi>/<ci>" of MIG instances that records hold,
	// or may hold (unreadable records): never destroyed as unowned.
	owned := map[string]bool{}
	unknownDevices := false
	for uid, err := range corrupt {
		known[uid] = true
		if !d.restoreCorrupt(ctx, uid, err, owned) {
			unknownDevices = true
		}
	}
	for _, c := range claims {
		known[c.UID] = true
		d.restoreClaim(ctx, c, owned)
	}
	d.removeOrphans(ctx, "CDI spec", d.spec.cdi.ClaimSpecs, d.spec.cdi.RemoveClaim, known)
	if h, _ := d.sharing.HAMi(); h != nil {
		d.removeOrphans(ctx, "HAMi-core accounting region", h.ClaimCaches, h.Cleanup, known)
	}
	if d.mig != nil && anyMIGCapable(d.inv) {
		destroy := d.destroyUnowned
		if destroy && unknownDevices {
			logger.Info("Not destroying unowned MIG instances at this start: an unreadable checkpoint record may own some of them")
			destroy = false
		}
		d.reconcileMIG(ctx, owned, destroy)
	}
	d.mps.restore(ctx)
	d.reconcileLabel(ctx)
	return nil
}

// restoreCorrupt keeps what an unreadable record still names reserved
// (readErr is why it is unreadable), and says whether anything of it
// could be salvaged: false, and its devices are unknown.
func (d *Driver) restoreCorrupt(ctx context.Context, uid types.UID, readErr error, owned map[string]bool) bool {
	logger := klog.FromContext(ctx)
	rec, serr := d.store.Salvage(uid)
	if serr != nil {
		logger.Error(readErr, "Checkpoint record unreadable and its devices unknown; its claim fails to prepare until it is unprepared or the record is removed", "claimUID", uid)
		return false
	}
	// Fail closed: what the record names stays reserved, so no other
	// claim is prepared on it, and its MIG instances are not
	// destroyed as unowned.
	logger.Error(readErr, "Checkpoint record unreadable; its claim fails to prepare until it is unprepared, and the devices it names stay reserved", "claimUID", uid, "devices", deviceNames(rec))
	d.restoreUses(ctx, claimRef{uid, rec.Namespace, rec.Name}, rec, owned)
	return true
}

// restoreClaim reserves a prepared record's devices again, and rolls
// back one whose preparation a crash interrupted. A record of the last
// boot loses its MIG instances' IDs and HAMi-core region first: the
// reboot took both.
func (d *Driver) restoreClaim(ctx context.Context, c *checkpoint.Claim, owned map[string]bool) {
	logger := klog.FromContext(ctx)
	ref := claimRef{c.UID, c.Namespace, c.Name}
	if c.FromOtherBoot(d.bootID) {
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
		if h, _ := d.sharing.HAMi(); h != nil {
			if err := h.Cleanup(c.UID); err != nil {
				logger.Error(err, "Removing a HAMi-core region of the last boot", "claim", ref)
			}
		}
	}
	if c.State != checkpoint.StatePrepared && c.ComputeDomain != nil {
		// A channel claim waiting for its IMEX daemon has nothing to roll
		// back but its label, which keeps the daemon coming: kept, for
		// the kubelet's next retry or its unprepare.
		logger.Info("Channel claim waiting for its IMEX daemon kept", "claim", ref, "computeDomain", c.ComputeDomain.Namespace+"/"+c.ComputeDomain.Name)
		return
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
				d.held.markUnusable(ctx, dev.GPUUUID, fmt.Sprintf("rolling back the interrupted prepare of claim %s failed: %v", ref, err))
			}
		}
		return
	}
	d.restoreUses(ctx, ref, c, owned)
	logger.V(2).Info("Restored prepared claim", "claim", ref, "devices", len(c.Devices))
}

// removeOrphans removes what (a CDI spec, a HAMi-core region) each claim
// that list names has, unless the checkpoint knows the claim: a crash
// between writing it and recording the claim left it. Errors are logged:
// an orphan harms no claim.
func (d *Driver) removeOrphans(ctx context.Context, what string, list func() ([]types.UID, error), remove func(types.UID) error, known map[types.UID]bool) {
	logger := klog.FromContext(ctx)
	uids, err := list()
	if err != nil {
		logger.Error(err, "Listing "+what+"s for orphans")
		return
	}
	for _, uid := range uids {
		if !known[uid] {
			logger.Info("Removing orphaned "+what, "claimUID", uid)
			if err := remove(uid); err != nil {
				logger.Error(err, "Removing orphaned "+what, "claimUID", uid)
			}
		}
	}
}

// restoreUses reserves a record's devices again and notes the MIG
// instances it owns.
func (d *Driver) restoreUses(ctx context.Context, ref claimRef, c *checkpoint.Claim, owned map[string]bool) {
	d.held.restore(ctx, ref, c.Devices)
	for _, dev := range c.Devices {
		if dev.MIG != nil && dev.MIG.Created {
			owned[migKey(dev.GPUUUID, dev.MIG.GIID, dev.MIG.CIID)] = true
		}
	}
}

// reloadReservations rebuilds the reservations from the checkpoint records:
// those another process prepared are added, those it unprepared dropped. A
// record still Preparing belongs to a process that died mid-prepare (the
// lock was free): its devices stay reserved until the kubelet's retry of
// that claim rolls it back, as at start.
func (d *Driver) reloadReservations(ctx context.Context) error {
	claims, corrupt, err := d.store.List()
	if err != nil {
		return err
	}
	records := make([]heldRecord, 0, len(corrupt)+len(claims))
	for uid := range corrupt {
		if rec, err := d.store.Salvage(uid); err == nil {
			records = append(records, heldRecord{claimRef{uid, rec.Namespace, rec.Name}, rec.Devices})
		}
	}
	for _, c := range claims {
		records = append(records, heldRecord{claimRef{c.UID, c.Namespace, c.Name}, c.Devices})
	}
	d.held.reload(ctx, records)
	// The other process may have started or stopped MPS daemons for its
	// claims: the checkpoint says who holds which.
	d.mps.sync(ctx, claims)
	return nil
}

func migKey(parent string, gi, ci int) string { return fmt.Sprintf("%s/%d/%d", parent, gi, ci) }

func deviceNames(c *checkpoint.Claim) []string {
	var out []string
	for _, dev := range c.Devices {
		out = append(out, dev.Device)
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
			d.held.markUnusable(ctx, g.UUID, fmt.Sprintf("listing its MIG instances failed: %v", err))
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
					d.held.markUnusable(ctx, g.UUID, fmt.Sprintf("GPU instance %d (%s at memory slice %d) has no compute instance, as a crash while creating it leaves; destroy it (nvidia-smi mig -dgi -gi %d) or restart with --destroy-unowned-mig",
						in.GIID, in.Profile, in.Placement.Start, in.GIID))
				}
				continue
			}
			logger.Info("Destroying MIG instance not owned by any prepared claim", "gpu", in.ParentIndex, "profile", in.Profile, "placement", in.Placement.Start, "gi", in.GIID, "ci", in.CIID)
			if err := d.mig.DestroyMIG(in.ParentUUID, in.GIID, in.CIID); err != nil {
				d.held.markUnusable(ctx, g.UUID, fmt.Sprintf("destroying unowned MIG instance GI %d CI %d failed: %v", in.GIID, in.CIID, err))
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
