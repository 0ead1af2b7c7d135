package inventory

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// MemorySliceCounter is the counter, of value 1, for memory slice k. A GPU
// instance owns the memory slices of its placement [Start, Start+Size);
// NVML refuses a placement that overlaps one in use.
func MemorySliceCounter(k int) string { return fmt.Sprintf("memory-slice-%d", k) }

// MIGModel is the counter encoding of one GPU's MIG tables: which
// placements fit together, in as few counters as say it exactly.
//
// NVIDIA's rules (MIG user guide, "Supported MIG profiles" and "placement";
// NVML nvmlDeviceCreateGpuInstanceWithPlacement) and how each is encoded:
//
//   - A GPU instance occupies the memory slices of its placement, and two
//     instances never share one: one counter per memory slice, consumed by
//     every placement that covers it. The GPU's slice count is the largest
//     placement end among its profiles. A slice's counter is left out when
//     every pair of placements that overlap on it also overlaps on a slice
//     whose counter is published: on the 8-slice GPUs (A100, H100, H200,
//     B200) every placement that covers slice 7 also covers slice 6, so
//     memory-slice-7 would only cost allocator time.
//   - Only one "+me" instance per GPU: names.CounterMediaExtensions.
//   - The GPU's compute slices and engines (copy engines, decoders,
//     encoders, JPEG, OFA) are as many as its largest (full-GPU) profile
//     has, and each instance takes its profile's. NewMIGModel checks that
//     no set of disjoint placements with at most one "+me" instance can take
//     more of any of them than the GPU has (a weighted interval schedule over
//     the memory slices), so none of them binds beyond the counters above
//     and none needs a counter of its own. A table where one could bind is
//     refused (the GPU falls back to a mode without MIG) rather than
//     mis-encoded.
//   - Per-profile instance limits (GpuInstanceProfileInfo.InstanceCount)
//     follow from the placements on NVIDIA's tables: a profile never has
//     more disjoint placements than its limit, except "+me" (limit 1),
//     which the media-extensions counter covers.
//
// The whole GPU (gpu-<i> in mig and dynamic mode) consumes every counter.
type MIGModel struct {
	// Profiles in publication (best-fit) order.
	Profiles []nvmlgpu.MIGProfile
	// MemorySlices is the GPU's number of memory slices.
	MemorySlices int
	// Counters names every counter of the set, in publication order.
	Counters []string
	hasME    bool
	// counted marks the memory slices that have a counter.
	counted []bool
}

// NewMIGModel derives the counter encoding from a GPU's discovered
// profiles.
func NewMIGModel(discovered []nvmlgpu.MIGProfile) (*MIGModel, error) {
	// Discovery lists profiles in best-fit order, which is the order
	// they are published in.
	m := &MIGModel{Profiles: append([]nvmlgpu.MIGProfile(nil), discovered...)}
	for _, p := range m.Profiles {
		if len(p.Placements) == 0 {
			return nil, fmt.Errorf("MIG profile %s has no placements", p.Name)
		}
		for _, pl := range p.Placements {
			if pl.Start < 0 || pl.Size < 1 {
				return nil, fmt.Errorf("MIG profile %s: placement %+v is not a slice range", p.Name, pl)
			}
			m.MemorySlices = max(m.MemorySlices, pl.Start+pl.Size)
		}
		m.hasME = m.hasME || IsMediaExtensions(p.Name)
	}
	if err := checkImplied(m.Profiles); err != nil {
		return nil, err
	}
	devices := 1
	for _, p := range m.Profiles {
		devices += len(p.Placements)
	}
	if devices > MaxDevicesPerSliceCounters {
		return nil, fmt.Errorf("%d devices for one GPU exceed the %d a slice may hold when they consume counters", devices, MaxDevicesPerSliceCounters)
	}
	m.counted = witnessSlices(m.Profiles, m.MemorySlices)
	for k, ok := range m.counted {
		if ok {
			m.Counters = append(m.Counters, MemorySliceCounter(k))
		}
	}
	if m.hasME {
		m.Counters = append(m.Counters, names.CounterMediaExtensions)
	}
	if len(m.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
		return nil, fmt.Errorf("%d counters exceed the API's %d per counter set", len(m.Counters), resourceapi.ResourceSliceMaxCountersPerCounterSet)
	}
	return m, nil
}

// Consumes lists the counters a MIG instance of profile p at placement pl
// consumes.
func (m *MIGModel) Consumes(p nvmlgpu.MIGProfile, pl nvmlgpu.Placement) []string {
	var out []string
	for k := pl.Start; k < pl.Start+pl.Size; k++ {
		if m.counted[k] {
			out = append(out, MemorySliceCounter(k))
		}
	}
	if IsMediaExtensions(p.Name) {
		out = append(out, names.CounterMediaExtensions)
	}
	return out
}

// IsMediaExtensions reports whether a profile, in NVIDIA's notation, takes
// the GPU's media extensions ("1g.10gb+me", Blackwell's "+me.all").
func IsMediaExtensions(profile string) bool { return strings.Contains(profile, "+me") }

// witnessSlices chooses the memory slices that get a counter: few enough,
// yet every two overlapping placements (of any profiles) must share one of
// them, because the counters, of value 1, let two devices coexist exactly
// when they share none. It starts from every slice and drops slices from the
// last one down while every overlapping pair keeps a common counted slice.
// Every placement keeps at least one counted slice, so gpu-<i>, which
// consumes all counters, excludes every MIG device of its GPU.
func witnessSlices(profiles []nvmlgpu.MIGProfile, n int) []bool {
	var pls []nvmlgpu.Placement
	for _, p := range profiles {
		pls = append(pls, p.Placements...)
	}
	counted := make([]bool, n)
	for k := range counted {
		counted[k] = true
	}
	witnessed := func(a, b nvmlgpu.Placement) bool {
		for k := max(a.Start, b.Start); k < min(a.Start+a.Size, b.Start+b.Size); k++ {
			if counted[k] {
				return true
			}
		}
		return false
	}
	for k := n - 1; k >= 0; k-- {
		counted[k] = false
		ok := true
		for i := 0; i < len(pls) && ok; i++ {
			for j := i; j < len(pls) && ok; j++ { // j == i: a placement overlaps itself
				a, b := pls[i], pls[j]
				if a.Start < b.Start+b.Size && b.Start < a.Start+a.Size {
					ok = witnessed(a, b)
				}
			}
		}
		counted[k] = !ok
	}
	return counted
}

// resources are what a GPU instance takes besides its memory slices.
var resources = []struct {
	name string
	of   func(nvmlgpu.MIGProfile) int
}{
	{"compute slices", func(p nvmlgpu.MIGProfile) int { return p.SliceCount }},
	{"copy engines", func(p nvmlgpu.MIGProfile) int { return p.CopyEngines }},
	{"decoders", func(p nvmlgpu.MIGProfile) int { return p.Decoders }},
	{"encoders", func(p nvmlgpu.MIGProfile) int { return p.Encoders }},
	{"JPEG engines", func(p nvmlgpu.MIGProfile) int { return p.JPEGs }},
	{"OFA engines", func(p nvmlgpu.MIGProfile) int { return p.OFAs }},
}

// checkImplied fails when some set of instances the counters allow (pairwise
// disjoint placements, at most one "+me") would take more compute slices or
// engines than the GPU's full profile has.
func checkImplied(profiles []nvmlgpu.MIGProfile) error {
	var full nvmlgpu.MIGProfile
	for _, p := range profiles {
		if p.SliceCount > full.SliceCount || (p.SliceCount == full.SliceCount && p.MemoryBytes > full.MemoryBytes) {
			full = p
		}
	}
	for _, r := range resources {
		if most, have := maxDisjoint(profiles, r.of), r.of(full); most > have {
			return fmt.Errorf("placements the memory slices allow together can take %d %s, more than the GPU's %d (profile %s): the model would over-commit them", most, r.name, have, full.Name)
		}
	}
	return nil
}

// maxDisjoint is the most of a resource (weight) that a set of pairwise
// disjoint placements with at most one "+me" instance can take: a weighted
// interval schedule over the memory slices (placements are half-open
// ranges), by dynamic programming over the slice boundary k and whether the
// "+me" instance is used.
func maxDisjoint(profiles []nvmlgpu.MIGProfile, weight func(nvmlgpu.MIGProfile) int) int {
	end := 0
	for _, p := range profiles {
		for _, pl := range p.Placements {
			end = max(end, pl.Start+pl.Size)
		}
	}
	// best[k][me]: the most within slices [0, k), with me "+me" instances.
	best := make([][2]int, end+1)
	for k := 1; k <= end; k++ {
		best[k] = best[k-1]
		for _, p := range profiles {
			me := IsMediaExtensions(p.Name)
			for _, pl := range p.Placements {
				if pl.Start+pl.Size != k {
					continue
				}
				w := weight(p)
				if me {
					best[k][1] = max(best[k][1], best[pl.Start][0]+w)
				} else {
					best[k][0] = max(best[k][0], best[pl.Start][0]+w)
					best[k][1] = max(best[k][1], best[pl.Start][1]+w)
				}
			}
		}
		best[k][1] = max(best[k][1], best[k][0])
	}
	return max(best[end][0], best[end][1])
}
