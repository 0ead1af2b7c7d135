package dradriver

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

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
			if nvmlgpu.IsInsufficientResources(err) {
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
			if nvmlgpu.IsInUse(err) {
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
		if in.Placement.Start < dev.MIG.Start+dev.MIG.Size && dev.MIG.Start < in.Placement.Start+in.Placement.Size && !d.held.migHeldByOther(uid, in.ParentUUID, in.Placement.Start) {
			found = append(found, fmt.Sprintf("GI %d CI %d (%s at memory slice %d)", in.GIID, in.CIID, in.Profile, in.Placement.Start))
		}
	}
	if len(found) == 0 {
		return "no instance that no claim owns overlaps it"
	}
	return "MIG instances that no prepared claim owns overlap it: " + strings.Join(found, ", ") + "; --destroy-unowned-mig removes them at the next start"
}

// findOwnMIG finds the instance a device's record holds: the recorded GI
// and CI, and the recorded profile, placement and (when known) UUID, so an
// instance that reused the IDs is not taken for it.
func (d *Driver) findOwnMIG(dev checkpoint.Device) (nvmlgpu.MIGInstance, bool, error) {
	if d.mig == nil {
		return nvmlgpu.MIGInstance{}, false, fmt.Errorf("MIG is not available on this node")
	}
	instances, err := d.mig.ListMIGOn(dev.GPUUUID)
	if err != nil {
		return nvmlgpu.MIGInstance{}, false, err
	}
	for _, in := range instances {
		if in.GIID == dev.MIG.GIID && in.CIID == dev.MIG.CIID && in.GIProfileID == dev.MIG.GIProfileID &&
			in.Placement.Start == dev.MIG.Start && (dev.MIG.UUID == "" || in.UUID == dev.MIG.UUID) {
			return in, true, nil
		}
	}
	return nvmlgpu.MIGInstance{}, false, nil
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
