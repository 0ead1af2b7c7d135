package dradriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/hami"
)

// prepareClaim prepares one claim and logs exactly one line about it at
// default verbosity, on success and on failure: an operator reading the
// plugin's log sees every claim it served, its devices and what was made
// for them, without raising the verbosity.
func (d *Driver) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	rec, outcome, err := d.prepareRecord(ctx, claim)
	logger := klog.FromContext(ctx)
	if err != nil {
		var devs []string
		if rec != nil {
			devs = describeDevices(rec.Devices)
		} else {
			devs = allocatedDevices(claim)
		}
		logger.Error(err, "Prepare failed", "claim", klog.KObj(claim), "uid", claim.UID, "devices", devs)
		return nil, err
	}
	logger.Info("Prepared claim", "claim", klog.KObj(claim), "uid", claim.UID, "outcome", outcome, "devices", describeDevices(rec.Devices))
	return resultDevices(rec), nil
}

// resultDevices are a prepared record's devices as the kubelet takes them.
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

// prepareRecord does prepareClaim's work. It returns the prepared record
// and how it came to be ("prepared", "already prepared", or "rebuilt: "
// and why); on failure, the record as far as it got (nil before the plan).
func (d *Driver) prepareRecord(ctx context.Context, claim *resourceapi.ResourceClaim) (*checkpoint.Claim, string, error) {
	if err := d.lock(claim.UID); err != nil {
		return nil, "", err
	}
	defer d.unlock(claim.UID)

	rec, err := d.store.Get(claim.UID)
	if err != nil {
		return nil, "", err
	}
	if d.isChannelClaim(claim) || (rec != nil && rec.ComputeDomain != nil) {
		return d.prepareChannel(ctx, claim, rec)
	}
	if rec != nil && rec.State == checkpoint.StatePrepared {
		outcome, err := d.reprepare(ctx, claim, rec)
		return rec, outcome, err
	}
	if rec != nil {
		if err := d.rollback(ctx, claim.UID, rec); err != nil {
			return rec, "", err
		}
	}

	p, err := d.plan(claim)
	if err != nil {
		return nil, "", err
	}
	ref := claimRef{claim.UID, claim.Namespace, claim.Name}
	// No record, or one rolled back above: what this claim still holds is
	// an earlier attempt's, whose rollback could not finish (facet-mps
	// unreachable). It is this claim's to take again, not another's to
	// add to: counted twice, a 20 % share would be refused beside itself.
	d.held.release(ref)
	if err := d.held.admit(ref, p.devices); err != nil {
		return nil, "", err
	}
	rec = &checkpoint.Claim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.StatePreparing, Devices: p.devices, BootID: d.bootID, Pods: reservedPods(claim)}
	// Record the intent before a MIG instance is created: from there on a
	// crash is rolled back at the next start, and an instance is destroyed
	// only if a record says Facet made it. Claims without one skip it (one
	// fdatasync'd record write less): their only side effects, the CDI spec
	// and the HAMi-core region, are named after the claim, and a start
	// removes those that have no record.
	if carves(rec) {
		if err := d.store.Put(rec); err != nil {
			d.held.release(ref)
			return rec, "", err
		}
		d.failpoint("prepare/recorded-intent")
	}
	if err := d.carveMIG(ctx, rec); err != nil {
		return rec, "", errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	if err := d.leaveMIG(ctx, rec); err != nil {
		return rec, "", errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	d.failpoint("prepare/left-mig")
	if err := d.buildSpec(ctx, claim, rec, p.vgpu, false); err != nil {
		return rec, "", errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	d.failpoint("prepare/wrote-spec")
	rec.State = checkpoint.StatePrepared
	if err := d.store.Put(rec); err != nil {
		return rec, "", errors.Join(err, d.rollback(ctx, claim.UID, rec))
	}
	d.failpoint("prepare/recorded-prepared")
	return rec, "prepared", nil
}

// reprepare answers a prepare of a claim already prepared: idempotent,
// as the kubelet asks again after its own restarts. But what the record
// points at may be gone (a reboot, a lost or truncated spec, a destroyed
// MIG instance): then it is rebuilt, never handed out stale. Nor on a
// GPU with a fatal fault: a new pod on an old claim would land on a
// broken GPU. The outcome is prepareRecord's.
func (d *Driver) reprepare(ctx context.Context, claim *resourceapi.ResourceClaim, rec *checkpoint.Claim) (string, error) {
	if err := d.held.checkUsable(rec.Devices); err != nil {
		return "", err
	}
	stale := d.staleness(rec)
	if stale == "" {
		d.notePods(ctx, claim, rec)
		return "already prepared", nil
	}
	rec.Pods = reservedPods(claim)
	if err := d.rebuild(ctx, claim, rec); err != nil {
		return "", fmt.Errorf("rebuild (%s): %w", stale, err)
	}
	return "rebuilt: " + stale, nil
}

// notePods records the pods a prepared claim is reserved for now: another
// pod joining the claim on this node is named in the record, for the
// metrics. A failed write leaves the old names; the claim itself is
// prepared either way.
func (d *Driver) notePods(ctx context.Context, claim *resourceapi.ResourceClaim, rec *checkpoint.Claim) {
	if pods := reservedPods(claim); !slices.Equal(pods, rec.Pods) {
		rec.Pods = pods
		if err := d.store.Put(rec); err != nil {
			klog.FromContext(ctx).Error(err, "Recording the claim's pods", "claim", klog.KObj(claim))
		}
	}
}

// reservedPods are the names of the pods claim is reserved for, sorted.
func reservedPods(claim *resourceapi.ResourceClaim) []string {
	var pods []string
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			pods = append(pods, r.Name)
		}
	}
	slices.Sort(pods)
	return pods
}

// carves says whether preparing rec creates MIG instances (dynamic MIG).
func carves(rec *checkpoint.Claim) bool {
	for _, dev := range rec.Devices {
		if dev.MIG != nil && dev.Kind != kindStaticMIG {
			return true
		}
	}
	return false
}

// allocatedDevices names the claim's devices of this driver, for the log
// line of a prepare that failed before it had a record.
func allocatedDevices(claim *resourceapi.ResourceClaim) []string {
	if claim.Status.Allocation == nil {
		return nil
	}
	var devs []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == names.Driver {
			devs = append(devs, r.Pool+"/"+r.Device)
		}
	}
	return devs
}

// describeDevices says, one string per device, what a claim's record
// holds: each device's name and kind; for a MIG device its profile,
// placement (the memory slices it spans) and, once it exists, its GPU and
// compute instance IDs and MIG UUID; for a vGPU share or slot its memory in
// bytes, its SM share in percent (0: best effort) and whether HAMi-core
// enforces them; for a whole GPU its UUID.
func describeDevices(devs []checkpoint.Device) []string {
	out := make([]string, 0, len(devs))
	for _, dev := range devs {
		var b strings.Builder
		fmt.Fprintf(&b, "%s (%s", dev.Device, dev.Kind)
		switch {
		case dev.MIG != nil:
			m := dev.MIG
			fmt.Fprintf(&b, " %s", m.Profile)
			if m.GIProfileInfoID != nil {
				// nvidia-smi's number beside NVML's, which differ.
				fmt.Fprintf(&b, " (GI profile ID %d, NVML index %d)", *m.GIProfileInfoID, m.GIProfileID)
			}
			fmt.Fprintf(&b, ", memory slices %d-%d", m.Start, m.Start+m.Size-1)
			if m.UUID != "" {
				fmt.Fprintf(&b, ", GI %d, CI %d, %s", m.GIID, m.CIID, m.UUID)
			} else {
				b.WriteString(", no instance")
			}
			fmt.Fprintf(&b, " on %s", dev.GPUUUID)
		case dev.Share != nil:
			s := dev.Share
			fmt.Fprintf(&b, " of %s, memory %d bytes, ", dev.GPUUUID, s.MemoryBytes)
			if s.Cores == 0 {
				b.WriteString("SM best effort")
			} else {
				fmt.Fprintf(&b, "SM %d%%", s.Cores)
			}
			switch {
			case s.MPS:
				b.WriteString(", SMs partitioned by MPS, memory by HAMi-core")
			case s.Enforced:
				b.WriteString(", enforced by HAMi-core")
			default:
				b.WriteString(", not enforced")
			}
			if dev.ShareID != nil {
				fmt.Fprintf(&b, ", share %s", *dev.ShareID)
			}
		case dev.GPUUUID != "":
			fmt.Fprintf(&b, " %s", dev.GPUUUID)
		}
		b.WriteString(")")
		out = append(out, b.String())
	}
	return out
}

// staleness says why a prepared record cannot be handed out as it is, or
// "" if it can: its spec must exist with the recorded content, its MIG
// instances with the recorded IDs, its HAMi-core region must exist, and
// none of it may date from before a reboot.
func (d *Driver) staleness(rec *checkpoint.Claim) string {
	if rec.FromOtherBoot(d.bootID) {
		return "the node rebooted since it was prepared"
	}
	if rec.CDISpecHash != "" {
		if err := d.spec.cdi.Verify(rec.UID, rec.CDISpecHash); err != nil {
			return err.Error()
		}
	} else if _, err := os.Stat(filepath.Join(d.spec.cdi.Dir(), rec.CDISpec)); rec.CDISpec == "" || err != nil {
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
	mp, _ := d.sharing.MPS()
	for _, dev := range rec.Devices {
		if dev.Share != nil && dev.Share.MPS && (mp == nil || mp.Daemon(dev.GPUUUID) == nil) {
			return fmt.Sprintf("device %s: the MPS control daemon of its GPU is not running", dev.Device)
		}
	}
	if h, _ := d.sharing.HAMi(); h != nil && enforcedShares(rec) {
		if dir, err := h.CacheDir(rec.UID); err != nil {
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
	if err := d.held.checkUsable(rec.Devices); err != nil {
		return err
	}
	rebooted := rec.FromOtherBoot(d.bootID)
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
	if err := d.buildSpec(ctx, claim, rec, p.vgpu, !rebooted); err != nil {
		return err
	}
	rec.BootID = d.bootID
	if err := d.store.Put(rec); err != nil {
		return err
	}
	d.failpoint("rebuild/recorded")
	return nil
}

// buildSpec composes and writes the claim's CDI spec: its devices'
// edits, the claim-wide environment, the MPS partition its shares join
// and HAMi-core's limits. keepRegion rebuilds a prepared claim's spec
// without resetting the HAMi-core region its containers use.
func (d *Driver) buildSpec(ctx context.Context, claim *resourceapi.ResourceClaim, rec *checkpoint.Claim, vgpu *configapi.VgpuConfig, keepRegion bool) error {
	devs, err := d.spec.deviceEdits(rec)
	if err != nil {
		return err
	}
	common := d.spec.claimCommon(rec, devs)
	mpsEdits, err := d.mps.partition(ctx, claim, rec, vgpu)
	if err != nil {
		return err
	}
	if vgpu != nil && vgpu.EnforcementEnabled() {
		shares := d.hamiShares(rec, vgpu)
		if mpsEdits != nil {
			addEdits(&common, mpsEdits)
			// MPS holds the SM share; HAMi-core's token bucket would
			// only add its stalls on top (docs/mps.md), so it is off
			// (0: no throttle) and HAMi-core keeps the memory limit.
			for i := range shares {
				shares[i].Cores = 0
			}
		}
		edits, err := d.spec.hamiEdits(ctx, rec.UID, shares, vgpu, keepRegion)
		if err != nil {
			return err
		}
		addEdits(&common, edits)
	}
	return d.spec.writeSpec(rec, &common, devs.devices)
}

// hamiShares are the HAMi-core limits of a claim's devices: a share's
// memory (bytes) and cores (percent); with a VgpuConfig, a whole GPU's
// too, being all of it, as every GPU the container sees needs a limit
// (unset means 0 to HAMi-core).
func (d *Driver) hamiShares(rec *checkpoint.Claim, vgpu *configapi.VgpuConfig) []hami.Share {
	var shares []hami.Share
	for _, dev := range rec.Devices {
		if dev.Share == nil && vgpu == nil {
			continue
		}
		s := hami.Share{Device: dev.Device, PCIBusID: d.gpus[dev.GPUUUID].PCIBusID, MemoryBytes: d.gpus[dev.GPUUUID].ShareMemoryBytes, Cores: 100}
		if dev.Share != nil {
			s.MemoryBytes, s.Cores = dev.Share.MemoryBytes, dev.Share.Cores
		}
		shares = append(shares, s)
	}
	return shares
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
	if rec != nil && rec.FromOtherBoot(d.bootID) {
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
	if err := d.spec.cdi.RemoveClaim(uid); err != nil {
		return err
	}
	d.failpoint("rollback/removed-spec")
	if rec != nil && rec.ComputeDomain != nil {
		// Before the record goes: a failure leaves the record, so the
		// next unprepare or start tries again.
		if err := d.releaseNode(ctx, rec); err != nil {
			return err
		}
		d.failpoint("rollback/released-node")
	}
	if h, _ := d.sharing.HAMi(); h != nil {
		if err := h.Cleanup(uid); err != nil {
			return err
		}
	}
	d.failpoint("rollback/removed-cache")
	// Without facet-mps now, nothing to release: its daemons went with it,
	// and the one that comes back stops those no prepared record holds.
	if mp, _ := d.sharing.MPS(); mp != nil {
		// After the spec: no new container can join the daemon once it
		// may be stopped.
		if err := mp.Release(ctx, uid); err != nil {
			return err
		}
	}
	d.failpoint("rollback/released-mps")
	if err := d.store.Delete(uid); err != nil {
		return err
	}
	d.failpoint("rollback/deleted-record")
	d.held.release(claimRef{uid: uid})
	return nil
}

// reportUnrecorded logs an instance that may be what an interrupted
// CreateMIG left: at the device's profile and placement, made in this
// boot. It is not destroyed, because nothing proves it is the claim's: an
// admin or another tool may have made it (--destroy-unowned-mig).
func (d *Driver) reportUnrecorded(ctx context.Context, rec *checkpoint.Claim, dev *checkpoint.Device) {
	if d.mig == nil || rec.FromOtherBoot(d.bootID) {
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

// unprepareClaim unprepares one claim and, like prepareClaim, logs exactly
// one line about it at default verbosity, on success and on failure.
func (d *Driver) unprepareClaim(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
	rec, outcome, err := d.unprepareRecord(ctx, claim)
	var devs []string
	if rec != nil {
		devs = describeDevices(rec.Devices)
	}
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "Unprepare failed", "claim", claim.NamespacedName, "uid", claim.UID, "devices", devs)
		return err
	}
	if outcome == nothingRecorded {
		// Its own message: the kubelet may repeat an unprepare, and
		// "Unprepared claim" counts the claims actually undone.
		logger.Info("Nothing to unprepare: no record of the claim", "claim", claim.NamespacedName, "uid", claim.UID)
		return nil
	}
	logger.Info("Unprepared claim", "claim", claim.NamespacedName, "uid", claim.UID, "outcome", outcome, "devices", devs)
	return nil
}

// nothingRecorded is unprepareRecord's outcome for a claim without a record.
const nothingRecorded = "nothing recorded"

// unprepareRecord does unprepareClaim's work. It returns the record it
// undid, its devices as they were before the rollback cleared them (nil if
// none was readable), and how it went: "unprepared", nothingRecorded, or,
// for a corrupt record, "record corrupt (...), salvaged" or "..., nothing
// salvaged".
func (d *Driver) unprepareRecord(ctx context.Context, claim kubeletplugin.NamespacedObject) (*checkpoint.Claim, string, error) {
	if err := d.lock(claim.UID); err != nil {
		return nil, "", err
	}
	defer d.unlock(claim.UID)
	rec, err := d.store.Get(claim.UID)
	if err != nil && !errors.Is(err, checkpoint.ErrCorrupt) {
		return nil, "", err
	}
	outcome := "unprepared"
	if err != nil {
		// The record is unreadable, but the spec and cache names derive
		// from the UID alone, so those are still cleaned up. Its MIG
		// instances, as far as the record can be read, are destroyed
		// only where the live instance matches it in every recorded
		// detail; anything else is reported at the next start.
		outcome = fmt.Sprintf("record corrupt (%v), salvaged", err)
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
		if !d.held.holds(claim.UID) {
			return nil, nothingRecorded, nil
		}
		// A prepare that failed before its record (a share, whose
		// record is written once prepared) and whose rollback failed
		// too: its reservation and MPS holder are still here, and the
		// kubelet will not prepare this claim again. Seen live: a pod
		// deleted after facet-mps was back left its share's 20 % held,
		// and the next share did not fit.
		if err := d.rollback(ctx, claim.UID, nil); err != nil {
			return nil, "", fmt.Errorf("release the reservation of a failed prepare: %w", err)
		}
		return nil, "a failed prepare's reservation released", nil
	}
	// The rollback clears the MIG instances' IDs as it destroys them:
	// the log line names what was there.
	var before *checkpoint.Claim
	if rec != nil {
		c := *rec
		c.Devices = cloneDevices(rec.Devices)
		before = &c
	} else {
		outcome = strings.TrimSuffix(outcome, ", salvaged") + ", nothing salvaged"
	}
	if err := d.rollback(ctx, claim.UID, rec); err != nil {
		return before, "", err
	}
	return before, outcome, nil
}

// cloneDevices copies devices deep enough that a rollback's changes to
// their MIG records do not show in the copy.
func cloneDevices(devs []checkpoint.Device) []checkpoint.Device {
	out := append([]checkpoint.Device(nil), devs...)
	for i := range out {
		if m := out[i].MIG; m != nil {
			c := *m
			out[i].MIG = &c
		}
	}
	return out
}
