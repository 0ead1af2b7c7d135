package dradriver

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
)

// Kinds of prepared device, as recorded in the checkpoint.
const (
	kindWhole = names.KindGPU
	kindMIG   = names.KindMIG
	kindShare = names.KindShare
	// kindStaticMIG is a MIG instance that existed before its claim
	// (static-mig mode): never carved nor destroyed by prepare.
	kindStaticMIG = names.KindStaticMIG
	// kindSlot is a fixed-size vGPU slot (slots mode): a share that holds
	// its device alone.
	kindSlot = names.KindSlot
	// kindIMEXChannel is a node's IMEX channel (channel.go): on no GPU,
	// so never in the reservations.
	kindIMEXChannel = names.KindIMEXChannel
)

// claimRef names the claim that holds a device.
type claimRef struct {
	uid       types.UID
	namespace string
	name      string
}

func (c claimRef) String() string { return c.namespace + "/" + c.name + " (" + string(c.uid) + ")" }

// use is one prepared device's hold on a physical GPU.
type use struct {
	owner  claimRef
	device string
	kind   string
	// MIG placement [start, start+size) in memory slices.
	start, size int
	// vGPU share consumption.
	memory, cores int64
	// slot is set for a vGPU slot, a share of kind kindShare that holds
	// its device exclusively.
	slot bool
	// recKind is the kind as recorded (kindStaticMIG, kindSlot), before
	// the folding above; for metrics.
	recKind string
}

func (u use) String() string {
	switch u.kind {
	case kindMIG:
		return fmt.Sprintf("MIG device %s (memory slices %d-%d) of claim %s", u.device, u.start, u.start+u.size-1, u.owner)
	case kindShare:
		return fmt.Sprintf("vGPU share of %s (%d MiB, %d%% SM) of claim %s", u.device, u.memory>>20, u.cores, u.owner)
	}
	return fmt.Sprintf("whole GPU %s of claim %s", u.device, u.owner)
}

// reservations are what is prepared on each physical GPU, by GPU UUID. It is the
// driver's last line of defense: the Kubernetes 1.35 allocator can
// double-book a GPU (kubernetes#139034: a MIG device after a saved vGPU
// share), so every device is admitted against it before anything is
// created, and a conflict fails the later claim only.
type reservations map[string][]use

// gpuLimits are a physical GPU's capacities that shares divide.
type gpuLimits struct {
	memory int64
}

// admit checks u against the GPU's current uses and adds it, or returns an
// error naming the holder. Rules, per GPU: a whole GPU excludes everything
// else; MIG devices exclude shares and overlapping MIG placements; shares
// exclude MIG devices and together fit in the GPU's memory and 100 % SM.
func (o reservations) admit(gpuUUID string, limits gpuLimits, u use) error {
	var memory, cores int64
	for _, h := range o[gpuUUID] {
		if h.owner.uid == u.owner.uid && h.device == u.device && h.kind == u.kind && u.kind != kindShare {
			return fmt.Errorf("allocated twice in one claim")
		}
		conflict := false
		switch {
		case u.slot && h.device == u.device:
			// A slot is one device for one claim; the API server on
			// stock 1.35 cannot share it.
			conflict = true
		case u.kind == kindWhole || h.kind == kindWhole:
			conflict = true
		case u.kind == kindMIG && h.kind == kindMIG:
			conflict = u.start < h.start+h.size && h.start < u.start+u.size
		case u.kind != h.kind: // a MIG device and a share
			conflict = true
		default: // two shares
			memory += h.memory
			cores += h.cores
		}
		if conflict {
			return fmt.Errorf("conflicts with %s, already prepared on GPU %s", h, gpuUUID)
		}
	}
	if u.kind == kindShare {
		if memory+u.memory > limits.memory {
			return fmt.Errorf("a share of %d MiB does not fit on GPU %s: shares already prepared there hold %d of %d MiB", u.memory>>20, gpuUUID, memory>>20, limits.memory>>20)
		}
		if cores+u.cores > 100 {
			return fmt.Errorf("a share of %d%% SM does not fit on GPU %s: shares already prepared there hold %d%%", u.cores, gpuUUID, cores)
		}
	}
	o[gpuUUID] = append(o[gpuUUID], u)
	return nil
}

// release drops every use of a claim.
func (o reservations) release(uid claimRef) {
	for gpu, uses := range o {
		kept := uses[:0]
		for _, u := range uses {
			if u.owner.uid != uid.uid {
				kept = append(kept, u)
			}
		}
		if len(kept) == 0 {
			delete(o, gpu)
		} else {
			o[gpu] = kept
		}
	}
}

// useOf turns a checkpointed device into a use.
func useOf(ref claimRef, d checkpoint.Device) use {
	u := use{owner: ref, device: d.Device, kind: d.Kind, recKind: d.Kind}
	switch u.kind {
	case "":
		u.kind, u.recKind = kindWhole, kindWhole // records written before kinds existed
	case kindStaticMIG:
		u.kind = kindMIG // excludes what a carved instance excludes
	case kindSlot:
		u.kind, u.slot = kindShare, true
	}
	if d.MIG != nil {
		u.start, u.size = d.MIG.Start, d.MIG.Size
	}
	if d.Share != nil {
		u.memory, u.cores = d.Share.MemoryBytes, d.Share.Cores
	}
	return u
}
