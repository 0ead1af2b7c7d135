package inventory

import (
	"fmt"
	"sort"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// buildStatic lays out a static-mig GPU: one device per existing MIG
// instance whose compute instance spans its whole GPU instance, named as
// the dynamic device of the same profile and placement would be, with the
// same attributes, so per-profile DeviceClasses and CEL selectors work
// unchanged. No counters: the instances are disjoint by construction.
//
// An instance that cannot be published exactly (a GPU instance without a
// compute instance, or with several or a partial one, or of a profile
// discovery does not know) is skipped; skipped says which and why.
func (gpu *GPU) buildStatic(instances []nvmlgpu.MIGInstance) (skipped []string, err error) {
	byProfile := map[int]int{} // GI profile ID -> index in best-fit order
	for i, p := range gpu.MIGProfiles {
		byProfile[p.GIProfileID] = i
	}
	perGI := map[int]int{}
	for _, in := range instances {
		perGI[in.GIID]++
	}
	type entry struct {
		rank int
		dev  *Device
	}
	var entries []entry
	for _, in := range instances {
		rank, known := byProfile[in.GIProfileID]
		var why string
		switch {
		case in.CIID < 0:
			why = "has no compute instance"
		case perGI[in.GIID] > 1:
			why = fmt.Sprintf("has %d compute instances; Facet publishes GPU instances with one compute instance spanning them", perGI[in.GIID])
		case !known:
			why = fmt.Sprintf("has GPU instance profile ID %d (NVML index %d), which discovery does not list", in.GIProfileInfoID, in.GIProfileID)
		case in.CIProfileID != gpu.MIGProfiles[rank].CIProfileID:
			why = fmt.Sprintf("has a compute instance of profile %d that does not span the GPU instance", in.CIProfileID)
		}
		if why != "" {
			skipped = append(skipped, fmt.Sprintf("static-mig: MIG instance GI %d CI %d (%s at memory slice %d) %s; not published", in.GIID, in.CIID, in.Profile, in.Placement.Start, why))
			continue
		}
		prof := gpu.MIGProfiles[rank]
		label, err := ProfileLabel(prof.Name)
		if err != nil {
			return nil, err
		}
		inst := in
		entries = append(entries, entry{rank, &Device{
			Name:      MIGDeviceName(gpu.Index, label, in.Placement.Start),
			Kind:      KindMIG,
			GPU:       gpu,
			MIG:       &prof,
			Placement: in.Placement,
			Instance:  &inst,
		}})
	}
	// Best fit, as for dynamic MIG: smallest profile first, then from the
	// end of the GPU.
	sort.SliceStable(entries, func(i, j int) bool {
		if entries[i].rank != entries[j].rank {
			return entries[i].rank < entries[j].rank
		}
		return entries[i].dev.Placement.Start > entries[j].dev.Placement.Start
	})
	for _, e := range entries {
		gpu.Devices = append(gpu.Devices, e.dev)
	}
	if len(entries) == 0 {
		skipped = append(skipped, "static-mig: the GPU has no MIG instance to publish; carve some (nvidia-smi mig, mig-parted) or give it a --mig-layouts entry")
	}
	return skipped, nil
}
