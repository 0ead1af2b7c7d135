// Package miglayout turns a named MIG layout ("all-1g.10gb",
// "all-balanced", or a list of profiles) into the GPU instances to create on
// one GPU, for static-mig mode: Facet can carve an idle GPU itself at
// start, the way mig-parted would, with no drain.
//
// The layouts are mig-parted's familiar ones (NVIDIA/mig-parted,
// examples/config.yaml), expressed by compute slices so that one name
// serves every model:
//
//	all-<profile>  as many instances of that profile as fit, e.g.
//	               all-1g.10gb (H100 80GB: 7), all-1g.5gb (A100 40GB),
//	               all-1g.18gb (H200), all-3g.40gb (H100: 2)
//	all-balanced   2 × 1g, 1 × 2g, 1 × 3g on 7-slice GPUs (A100, H100,
//	               H200, B200); 2 × 1g, 1 × 2g on 4-slice GPUs (A30)
//	P1/P2/...      exactly these profiles, e.g. "3g.40gb/2g.20gb/1g.10gb/1g.10gb"
//
// Placements come from the GPU's own tables (nvmlgpu.MIGProfile.Placements,
// NVML's possible placements), chosen by a search that never overlaps two
// instances' memory slices and takes at most one "+me" profile; NVML still
// has the last word when the instances are created.
package miglayout

import (
	"fmt"
	"sort"
	"strings"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// Instance is one GPU instance of a layout: a profile at a placement.
type Instance struct {
	Profile   nvmlgpu.MIGProfile
	Placement nvmlgpu.Placement
}

// Plan resolves a layout for a GPU with these MIG profiles (in discovery's
// best-fit order) and places its instances. The result is sorted by
// placement start. Errors name the layout and the profile.
func Plan(layout string, profiles []nvmlgpu.MIGProfile) ([]Instance, error) {
	byName := map[string]nvmlgpu.MIGProfile{}
	for _, p := range profiles {
		byName[p.Name] = p
	}
	var want []nvmlgpu.MIGProfile
	fill := false
	switch {
	case layout == "all-balanced":
		slices := map[int]nvmlgpu.MIGProfile{}
		most := 0
		for _, p := range profiles {
			if strings.ContainsAny(p.Name, "+-") {
				continue // a variant (+me, -me, +gfx), not the plain profile
			}
			if _, ok := slices[p.SliceCount]; !ok {
				slices[p.SliceCount] = p
			}
			most = max(most, p.SliceCount)
		}
		counts := []int{1, 1, 2}
		if most >= 7 {
			counts = []int{1, 1, 2, 3}
		}
		for _, c := range counts {
			p, ok := slices[c]
			if !ok {
				return nil, fmt.Errorf("MIG layout all-balanced: the GPU has no plain %dg profile", c)
			}
			want = append(want, p)
		}
	case strings.HasPrefix(layout, "all-"):
		name := strings.TrimPrefix(layout, "all-")
		p, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("MIG layout %s: the GPU has no profile %q (it has %s)", layout, name, profileNames(profiles))
		}
		want, fill = []nvmlgpu.MIGProfile{p}, true
	default:
		for _, name := range strings.Split(layout, "/") {
			p, ok := byName[strings.TrimSpace(name)]
			if !ok {
				return nil, fmt.Errorf("MIG layout %s: the GPU has no profile %q (it has %s)", layout, name, profileNames(profiles))
			}
			want = append(want, p)
		}
	}
	if fill {
		// As many as fit: one more until the search fails.
		var best []Instance
		for n := 1; n <= 64; n++ {
			list := make([]nvmlgpu.MIGProfile, n)
			for i := range list {
				list[i] = want[0]
			}
			got, ok := place(list)
			if !ok {
				break
			}
			best = got
		}
		if best == nil {
			return nil, fmt.Errorf("MIG layout %s: no placement of %s", layout, want[0].Name)
		}
		return best, nil
	}
	got, ok := place(want)
	if !ok {
		return nil, fmt.Errorf("MIG layout %s: these profiles do not fit on the GPU together", layout)
	}
	return got, nil
}

// place finds non-overlapping placements for the profiles, at most one
// "+me", by depth-first search, largest profile first (so the small ones
// fill the gaps).
func place(want []nvmlgpu.MIGProfile) ([]Instance, bool) {
	order := append([]nvmlgpu.MIGProfile(nil), want...)
	sort.SliceStable(order, func(i, j int) bool { return order[i].MemorySlices > order[j].MemorySlices })
	var used []nvmlgpu.Placement
	var out []Instance
	me := false
	var dfs func(i int) bool
	dfs = func(i int) bool {
		if i == len(order) {
			return true
		}
		p := order[i]
		isME := strings.Contains(p.Name, "+me")
		if isME && me {
			return false
		}
		for _, pl := range p.Placements {
			if overlaps(pl, used) {
				continue
			}
			// Equal profiles in ascending placements only: the same set in
			// another order is no new answer.
			if i > 0 && order[i-1].GIProfileID == p.GIProfileID && pl.Start < out[len(out)-1].Placement.Start {
				continue
			}
			used, out = append(used, pl), append(out, Instance{Profile: p, Placement: pl})
			me = me || isME
			if dfs(i + 1) {
				return true
			}
			used, out = used[:len(used)-1], out[:len(out)-1]
			if isME {
				me = false
			}
		}
		return false
	}
	if !dfs(0) {
		return nil, false
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Placement.Start < out[j].Placement.Start })
	return out, true
}

func overlaps(pl nvmlgpu.Placement, used []nvmlgpu.Placement) bool {
	for _, u := range used {
		if pl.Start < u.Start+u.Size && u.Start < pl.Start+pl.Size {
			return true
		}
	}
	return false
}

func profileNames(profiles []nvmlgpu.MIGProfile) string {
	names := make([]string, len(profiles))
	for i, p := range profiles {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// Matches reports whether the instances that exist on a GPU are exactly a
// plan's (same profiles at the same placements, each with its compute
// instance), so a layout already in place is left alone.
func Matches(plan []Instance, existing []nvmlgpu.MIGInstance) bool {
	if len(plan) != len(existing) {
		return false
	}
	have := map[[2]int]bool{}
	for _, in := range existing {
		if in.CIID < 0 {
			return false
		}
		have[[2]int{in.GIProfileID, in.Placement.Start}] = true
	}
	for _, p := range plan {
		if !have[[2]int{p.Profile.GIProfileID, p.Placement.Start}] {
			return false
		}
	}
	return true
}

// Preview is the MIG instances NVML would list on gpu once plan is
// carved, for showing what a layout publishes without carving it (facetctl
// slices, tests). GI IDs are numbered from 1 in placement order; the
// instances have no UUIDs, which only NVML can give.
func Preview(gpu nvmlgpu.GPU, plan []Instance) []nvmlgpu.MIGInstance {
	out := make([]nvmlgpu.MIGInstance, len(plan))
	for i, p := range plan {
		out[i] = nvmlgpu.MIGInstance{
			ParentUUID: gpu.UUID, ParentIndex: gpu.Index, Profile: p.Profile.Name,
			GIProfileID: p.Profile.GIProfileID, CIProfileID: p.Profile.CIProfileID,
			Placement: p.Placement, GIID: i + 1, CIID: 0,
		}
	}
	return out
}
