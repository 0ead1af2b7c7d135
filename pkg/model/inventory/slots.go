package inventory

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// Slot is one fixed-size vGPU slot: a share of a GPU that HAMi-core
// enforces, like an NVIDIA vGPU profile.
type Slot struct {
	// Index is the slot's number on its GPU, from 0, in publication order.
	Index int
	// MemoryBytes is the slot's framebuffer limit in bytes, a whole number
	// of MiB (HAMi-core's limits are in MiB).
	MemoryBytes int64
	// Cores is the slot's share of SM time in percent, 1-100. 100 means no
	// SM throttle.
	Cores int64
}

// SlotGroup is Count slots of one size.
type SlotGroup struct {
	Count int
	// Memory is each slot's memory; zero means an equal part of the GPU's
	// memory (rounded down to MiB).
	Memory resource.Quantity
	// Cores is each slot's SM share in percent; zero means an equal part of
	// 100 (rounded down).
	Cores int64
}

// SlotLayout is how a slots-mode GPU is split: groups of equal slots.
type SlotLayout []SlotGroup

// DefaultSlotLayout splits a GPU into four equal slots: a quarter of its
// memory and 25 % of its SM time each.
var DefaultSlotLayout = SlotLayout{{Count: 4}}

// ParseSlotLayout parses a layout: groups joined by "+", each COUNT, or
// COUNTxMEMORY/PERCENT with MEMORY a Kubernetes quantity (bytes; "20Gi",
// "2000Mi") and PERCENT the SM share. "4" is four equal slots;
// "4x20Gi/25" four slots of 20 GiB and 25 %; "2x10Gi/10+1x40Gi/50" mixes
// sizes.
func ParseSlotLayout(s string) (SlotLayout, error) {
	var out SlotLayout
	for _, part := range strings.Split(s, "+") {
		part = strings.TrimSpace(part)
		count, size, sized := strings.Cut(part, "x")
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("slot layout %q: %q: want COUNT or COUNTxMEMORY/PERCENT, e.g. 4x20Gi/25", s, part)
		}
		g := SlotGroup{Count: n}
		if sized {
			mem, pct, ok := strings.Cut(size, "/")
			if !ok {
				return nil, fmt.Errorf("slot layout %q: %q: want COUNTxMEMORY/PERCENT, e.g. 4x20Gi/25", s, part)
			}
			q, err := resource.ParseQuantity(mem)
			if err != nil || q.Sign() <= 0 {
				return nil, fmt.Errorf("slot layout %q: %q: memory %q is not a positive quantity such as 20Gi", s, part, mem)
			}
			c, err := strconv.ParseInt(pct, 10, 64)
			if err != nil || c < 1 || c > 100 {
				return nil, fmt.Errorf("slot layout %q: %q: SM share %q is not a percentage from 1 to 100", s, part, pct)
			}
			g.Memory, g.Cores = q, c
		}
		out = append(out, g)
	}
	return out, nil
}

// String is the layout in ParseSlotLayout's syntax.
func (l SlotLayout) String() string {
	parts := make([]string, len(l))
	for i, g := range l {
		parts[i] = strconv.Itoa(g.Count)
		if !g.Memory.IsZero() {
			parts[i] += fmt.Sprintf("x%s/%d", g.Memory.String(), g.Cores)
		}
	}
	return strings.Join(parts, "+")
}

// Slots sizes the layout for a GPU of memoryBytes. The slots together may
// not take more memory than the GPU has, nor more than 100 % of its SM
// time; equal parts share what sized groups leave. Slots come smallest
// first (memory, then cores), so the allocator, which takes the first
// device that fits, gives a request the smallest slot that holds it.
func (l SlotLayout) Slots(memoryBytes uint64) ([]Slot, error) {
	const mib = 1 << 20
	if len(l) == 0 {
		l = DefaultSlotLayout
	}
	memLeft, coresLeft := int64(memoryBytes&^(mib-1)), int64(100)
	equal := 0
	for _, g := range l {
		if g.Memory.IsZero() {
			equal += g.Count
			continue
		}
		memLeft -= int64(g.Count) * (g.Memory.Value() &^ (mib - 1))
		coresLeft -= int64(g.Count) * g.Cores
	}
	if memLeft < 0 || coresLeft < 0 {
		return nil, fmt.Errorf("slot layout %s takes more than the GPU has (%d MiB, 100 %% SM)", l, memoryBytes/mib)
	}
	if n := equal + l.sized(); n > names.MPSMaxClients {
		return nil, fmt.Errorf("slot layout %s has %d slots; at most %d fit on a GPU, the clients its MPS control daemon serves", l, n, names.MPSMaxClients)
	}
	var out []Slot
	for _, g := range l {
		mem, cores := g.Memory.Value()&^(mib-1), g.Cores
		if g.Memory.IsZero() {
			mem, cores = (memLeft/int64(equal))&^(mib-1), coresLeft/int64(equal)
		}
		if mem < mib || cores < 1 {
			return nil, fmt.Errorf("slot layout %s leaves slots of %d MiB and %d %% SM; each needs at least 1 MiB and 1 %%", l, mem/mib, cores)
		}
		for range g.Count {
			out = append(out, Slot{MemoryBytes: mem, Cores: cores})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].MemoryBytes != out[j].MemoryBytes {
			return out[i].MemoryBytes < out[j].MemoryBytes
		}
		return out[i].Cores < out[j].Cores
	})
	for i := range out {
		out[i].Index = i
	}
	return out, nil
}

// sized counts the slots of the groups with a size of their own.
func (l SlotLayout) sized() int {
	n := 0
	for _, g := range l {
		if !g.Memory.IsZero() {
			n += g.Count
		}
	}
	return n
}

// SlotDeviceName is the device name of slot k of GPU i: "gpu-3-slot-0".
func SlotDeviceName(i, k int) string { return fmt.Sprintf("gpu-%d-slot-%d", i, k) }

// buildSlots lays out a slots-mode GPU: its slots, smallest first. The
// whole GPU is not published: it is the slots.
func (gpu *GPU) buildSlots(layout SlotLayout) error {
	slots, err := layout.Slots(uint64(gpu.ShareMemoryBytes))
	if err != nil {
		if reserve := int64(gpu.MemoryBytes) - gpu.ShareMemoryBytes; reserve > 0 {
			return fmt.Errorf("%w: the GPU's %d MiB less the MPS server's %d MiB (docs/mps.md)", err, gpu.MemoryBytes>>20, reserve>>20)
		}
		return err
	}
	for _, s := range slots {
		gpu.Devices = append(gpu.Devices, &Device{Name: SlotDeviceName(gpu.Index, s.Index), Kind: KindSlot, GPU: gpu, Slot: &s})
	}
	return nil
}
