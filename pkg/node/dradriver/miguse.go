package dradriver

import (
	"maps"
)

// MIGInUse returns the GPUs, by UUID, on which a claim that is prepared or
// being prepared holds a MIG instance carved at prepare (not a static
// one): what the migInUse attribute publishes, so that a claim can prefer
// a GPU already split to an untouched one that could still serve a whole
// GPU. It is read from the reservations, which a prepare takes before it
// carves and an unprepare or a failed prepare gives back.
func (d *Driver) MIGInUse() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.migInUseLocked())
}

// MIGUseChanges is signalled, coalesced, each time MIGInUse changes: the
// plugin republishes the slices then. The channel is never closed.
func (d *Driver) MIGUseChanges() <-chan struct{} { return d.migUseCh }

func (d *Driver) migInUseLocked() map[string]bool {
	out := map[string]bool{}
	for gpu, uses := range d.occ {
		for _, u := range uses {
			if u.kind == kindMIG && u.recKind == kindMIG {
				out[gpu] = true
			}
		}
	}
	return out
}

// noteMIGUseLocked signals MIGUseChanges if the set of GPUs in MIG use
// differs from the one last signalled. It never blocks: the channel holds
// one pending signal, and the reader reads the current set.
func (d *Driver) noteMIGUseLocked() {
	now := d.migInUseLocked()
	if maps.Equal(now, d.migUseSeen) {
		return
	}
	d.migUseSeen = now
	select {
	case d.migUseCh <- struct{}{}:
	default:
	}
}
