package dradriver

import (
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/hami"
	"github.com/facet-gpu/facet/pkg/node/nodemetrics"
)

// What a metrics scrape reads of the driver (nodemetrics.Collector): the
// GPUs and the claims, from a snapshot of the reservations, the claims'
// records and their HAMi-core regions. None of it may fail a scrape.

// GPUState implements nodemetrics.GPUSource: each inventory GPU with what the
// prepared claims hold of it.
func (d *Driver) GPUState() []nodemetrics.GPU {
	occ := d.held.snapshot()
	out := make([]nodemetrics.GPU, 0, len(d.inv.GPUs))
	for _, g := range d.inv.GPUs {
		s := nodemetrics.GPU{Index: g.Index, UUID: g.UUID, Product: g.ProductName, Mode: string(g.Mode), MemoryBytes: int64(g.MemoryBytes)}
		// A MIG instance's compute is its compute slices of the GPU's,
		// the largest profile's slice count.
		fullSlices := fullSlices(g)
		for _, u := range occ[g.UUID] {
			switch u.kind {
			case kindWhole:
				s.AllocatedMemoryBytes += int64(g.MemoryBytes)
				s.AllocatedComputePercent += 100
			case kindShare:
				s.AllocatedMemoryBytes += u.memory
				s.AllocatedComputePercent += u.cores
			case kindMIG:
				dev, ok := d.inv.Device(u.device)
				if !ok || dev.MIG == nil {
					continue
				}
				s.AllocatedMemoryBytes += int64(dev.MIG.MemoryBytes)
				if fullSlices > 0 {
					s.AllocatedComputePercent += int64(dev.MIG.SliceCount * 100 / fullSlices)
				}
				if s.MIGInUse == nil {
					s.MIGInUse = map[string]int{}
				}
				s.MIGInUse[dev.MIG.Name]++
			}
		}
		out = append(out, s)
	}
	return out
}

// PreparedClaims implements nodemetrics.GPUSource: the claims that hold
// devices (prepared, or admitted and being prepared).
func (d *Driver) PreparedClaims() int {
	seen := map[types.UID]bool{}
	for _, uses := range d.held.snapshot() {
		for _, u := range uses {
			seen[u.owner.uid] = true
		}
	}
	return len(seen)
}

var _ nodemetrics.GPUSource = (*Driver)(nil)

// ClaimState implements nodemetrics.ClaimSource: every device the prepared
// claims hold, from the reservations (what is held) and the claims'
// checkpoint records (a MIG device's instance IDs and UUID, the pods), and
// the memory and SM utilization in use of the claims with vGPU shares or
// slots, from their HAMi-core accounting regions. A record or region that cannot be read leaves its
// detail out of this scrape; it never fails it.
func (d *Driver) ClaimState() ([]nodemetrics.Claim, []nodemetrics.ClaimUsage) {
	type held struct {
		u   use
		gpu *inventory.GPU
	}
	var uses []held
	occ := d.held.snapshot()
	for _, g := range d.inv.GPUs {
		for _, u := range occ[g.UUID] {
			uses = append(uses, held{u, g})
		}
	}

	records := map[types.UID]map[string]checkpoint.Device{}
	pods := map[types.UID][]string{}
	record := func(uid types.UID, device string) (checkpoint.Device, bool) {
		if _, ok := records[uid]; !ok {
			records[uid] = map[string]checkpoint.Device{}
			if rec, err := d.store.Get(uid); err == nil && rec != nil {
				for _, dev := range rec.Devices {
					records[uid][dev.Device] = dev
				}
				pods[uid] = rec.Pods
			}
		}
		dev, ok := records[uid][device]
		return dev, ok
	}
	var out []nodemetrics.Claim
	shares := map[claimRef]bool{}
	for _, h := range uses {
		u, g := h.u, h.gpu
		c := nodemetrics.Claim{Namespace: u.owner.namespace, Name: u.owner.name, Device: u.device, GPUIndex: g.Index, GPUUUID: g.UUID, GIID: -1, Compute: "none"}
		switch u.kind {
		case kindWhole:
			c.Shape, c.MemoryBytes, c.ComputePercent = "whole", int64(g.MemoryBytes), 100
		case kindMIG:
			c.Shape, c.Compute = "mig", "mig"
			if dev, ok := d.inv.Device(u.device); ok && dev.MIG != nil {
				c.Profile, c.MemoryBytes = dev.MIG.Name, int64(dev.MIG.MemoryBytes)
				if full := fullSlices(g); full > 0 {
					c.ComputePercent = int64(dev.MIG.SliceCount * 100 / full)
				}
			}
			if rec, ok := record(u.owner.uid, u.device); ok && rec.MIG != nil && rec.MIG.Created {
				c.GIID, c.MIGUUID = rec.MIG.GIID, rec.MIG.UUID
			}
		case kindShare:
			c.Shape, c.MemoryBytes, c.ComputePercent = "share", u.memory, u.cores
			if u.slot {
				c.Shape = "slot"
			}
			if rec, ok := record(u.owner.uid, u.device); ok && rec.Share != nil {
				switch {
				case rec.Share.MPS:
					c.Compute = "mps"
				case rec.Share.Enforced && rec.Share.Cores > 0 && rec.Share.Cores < 100:
					c.Compute = "time-sliced"
				}
			}
			shares[u.owner] = true
		}
		record(u.owner.uid, u.device)
		c.Pods = pods[u.owner.uid]
		out = append(out, c)
	}
	var usage []nodemetrics.ClaimUsage
	if h, _ := d.sharing.HAMi(); h != nil {
		for ref := range shares {
			dir, err := h.CacheDir(ref.uid)
			if err != nil {
				continue
			}
			u, err := hami.ReadRegionUsage(filepath.Join(dir, hami.CacheFileName))
			if err != nil {
				// ErrNoRegion: no process yet. Anything else is the
				// region's to explain; the scrape goes on without it.
				continue
			}
			usage = append(usage, nodemetrics.ClaimUsage{Namespace: ref.namespace, Name: ref.name, UsedBytes: u.UsedBytes, ComputeUsedPercent: u.SMUtilPercent})
		}
	}
	return out, usage
}

// fullSlices is the compute slices of g's largest MIG profile: a MIG
// instance's share of the GPU's compute is its slices of these.
func fullSlices(g *inventory.GPU) int {
	n := 0
	for _, dev := range g.Devices {
		if dev.MIG != nil && dev.MIG.SliceCount > n {
			n = dev.MIG.SliceCount
		}
	}
	return n
}

var _ nodemetrics.ClaimSource = (*Driver)(nil)
