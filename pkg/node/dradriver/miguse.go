package dradriver

import (
	"maps"
)

// migInUse is the GPUs, by UUID, on which a claim that is prepared or
// being prepared holds a MIG instance carved at prepare (not a static
// one): what the migInUse attribute publishes, so that a claim can prefer
// a GPU already split to an untouched one that could still serve a whole
// GPU. A prepare reserves before it carves, and an unprepare or a failed
// prepare gives back.
func (o reservations) migInUse() map[string]bool {
	out := map[string]bool{}
	for gpu, uses := range o {
		for _, u := range uses {
			if u.kind == kindMIG && u.recKind == kindMIG {
				out[gpu] = true
			}
		}
	}
	return out
}

// migUse signals each change of the reservations' migInUse, so that the
// plugin republishes the slices.
type migUse struct {
	// seen is the set last signalled on ch (one pending signal,
	// coalesced).
	seen map[string]bool
	ch   chan struct{}
}

func newMIGUse() migUse { return migUse{ch: make(chan struct{}, 1)} }

// note signals ch if o's migInUse differs from the one last signalled. It
// never blocks: ch holds one pending signal, and the reader reads the
// current set.
func (m *migUse) note(o reservations) {
	now := o.migInUse()
	if maps.Equal(now, m.seen) {
		return
	}
	m.seen = now
	select {
	case m.ch <- struct{}{}:
	default:
	}
}
