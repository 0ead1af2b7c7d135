package allocator

import (
	"testing"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// TestComputePolicy: a share or slot that asks for a compute percentage
// never lands, through the shipped classes, on a GPU whose SMs are only
// time-sliced (computePartitioning "time-sliced": facet-mps down, or
// --mps=off), where HAMi-core's throttle does not hold it (a 20 % share
// ran GEMMs at 69 % of a real H200); a claim lands there only when it opts
// in through the best-effort classes. Under MPS both kinds of class land.
func TestComputePolicy(t *testing.T) {
	for _, tc := range []struct {
		name string
		mps  string // facetctl slices --mps
		// whether the claims of the plain and the best-effort class land
		plain, bestEffort bool
	}{
		{"MPS answers", "auto", true, true},
		{"facet-mps down", "down", false, true},
		{"MPS off", "off", false, true},
	} {
		t.Run(tc.name+"/share", func(t *testing.T) {
			c := NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", "shared", "--mps", tc.mps), deviceClasses(t))
			want := func(lands bool) []string {
				if lands {
					return []string{"gpu-0"}
				}
				return nil
			}
			run(t, c, "node-a", []step{
				{share("plain", "2000Mi", "20"), want(tc.plain)},
			})
			c = NewCluster(nodeSlices(t, "dgx-h100", "node-a", "--mode", "shared", "--mps", tc.mps), deviceClasses(t))
			run(t, c, "node-a", []step{
				{shareOfClass("opted-in", names.ClassVGPUBestEffort, "2000Mi", "20"), want(tc.bestEffort)},
			})
		})
		t.Run(tc.name+"/slot", func(t *testing.T) {
			slices := nodeSlices(t, "dgx-h100", "node-a", "--feature-gates", "", "--mode", "slots", "--mps", tc.mps)
			c := NewCluster(slices, deviceClasses(t))
			plain := slotClaim("plain", 1, "2000Mi", "20", false)
			res, err := c.Allocate(t.Context(), "node-a", plain)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(Devices(res)) == 1; got != tc.plain {
				t.Errorf("slot through vgpu-slot.facet.dev allocated %v, want landed %v", Devices(res), tc.plain)
			}
			opted := slotClaim("opted-in", 1, "2000Mi", "20", false)
			opted.Spec.Devices.Requests[0].Exactly.DeviceClassName = names.ClassVGPUSlotBestEffort
			res, err = c.Allocate(t.Context(), "node-a", opted)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(Devices(res)) == 1; got != tc.bestEffort {
				t.Errorf("slot through %s allocated %v, want landed %v", names.ClassVGPUSlotBestEffort, Devices(res), tc.bestEffort)
			}
		})
	}
}
