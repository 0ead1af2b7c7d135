package scale

import (
	"testing"

	facetslices "github.com/facet-gpu/facet/pkg/slices"
)

// TestShapes checks that every shape of the benchmark builds for the DGX
// H100, stays within the API's limits, and publishes the devices it says:
// 8 whole GPUs, 56 static 1g.10gb instances, or all MIG placements.
func TestShapes(t *testing.T) {
	shapes, err := Shapes("../../demo/machines/dgx-h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"exclusive": 8, "static-mig": 56, "shared": 8, "slots": 32, "mig": 208, "nvidia-mig": 208}
	for _, s := range shapes {
		objs := s.Node("node-0000")
		for _, err := range facetslices.CheckLimits(objs) {
			t.Errorf("%s: %v", s.Name, err)
		}
		devices := 0
		for _, o := range objs {
			devices += len(o.Spec.Devices)
		}
		if devices != want[s.Name] {
			t.Errorf("%s: %d devices, want %d", s.Name, devices, want[s.Name])
		}
		if s.Claim("c").Spec.Devices.Requests[0].Exactly == nil {
			t.Errorf("%s: claim without an exact request", s.Name)
		}
	}
}
