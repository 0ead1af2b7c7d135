package dradriver

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

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
			profileID := dev.MIG.GIProfileInfoID
			// static-mig: the instance exists; prepare only hands it out.
			in := dev.Instance
			rec.Kind = kindStaticMIG
			rec.MIG = &checkpoint.MIG{Profile: dev.MIG.Name, GIProfileID: dev.MIG.GIProfileID, GIProfileInfoID: &profileID, CIProfileID: dev.MIG.CIProfileID, Start: dev.Placement.Start, Size: dev.Placement.Size,
				GIID: in.GIID, CIID: in.CIID, UUID: in.UUID}
		case dev.Kind == inventory.KindMIG:
			profileID := dev.MIG.GIProfileInfoID
			rec.Kind = kindMIG
			rec.MIG = &checkpoint.MIG{Profile: dev.MIG.Name, GIProfileID: dev.MIG.GIProfileID, GIProfileInfoID: &profileID, CIProfileID: dev.MIG.CIProfileID, Start: dev.Placement.Start, Size: dev.Placement.Size}
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
	return strings.Join(a.HAMiCoreEnv(), ",") == strings.Join(b.HAMiCoreEnv(), ",") && a.EnforcementEnabled() == b.EnforcementEnabled() &&
		a.PartitioningFor(true) == b.PartitioningFor(true)
}
