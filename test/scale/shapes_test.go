package scale

import (
	"context"
	"slices"
	"testing"

	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
)

// TestShapes checks that every shape of the benchmark builds for the DGX
// H100, stays within the API's limits, publishes the devices it says (8
// whole GPUs, 56 static 1g.10gb instances, or all MIG placements), and
// that the upstream allocator, with the features of the shape's cluster,
// places exactly PerNode of its claims on one node: a shape whose claims
// match nothing, or that holds fewer claims than the run creates, fails.
func TestShapes(t *testing.T) {
	shapes, err := Shapes("../../demo/machines/dgx-h100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, classes, _, err := fit.ReadFile("../../deployments/deviceclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ devices, slices int }{
		"exclusive": {8, 1}, "nvidia-exclusive": {8, 1},
		"static-mig": {56, 1}, "nvidia-static-mig": {56, 1},
		"mig": {208, 5}, "nvidia-mig": {208, 5},
		"shared": {8, 1}, "slots": {32, 1},
	}
	var families []string
	for _, s := range shapes {
		families = append(families, s.Family+"/"+s.Driver)
		if s.NA != "" {
			if s.Node != nil || s.Claim != nil {
				t.Errorf("%s: n/a shape with slices or claims", s.Name)
			}
			continue
		}
		t.Run(s.Name, func(t *testing.T) {
			objs := s.Node("node-0000")
			for _, err := range resourceslices.CheckLimits(objs) {
				t.Error(err)
			}
			devices := 0
			for _, o := range objs {
				devices += len(o.Spec.Devices)
				if o.Spec.Pool.ResourceSliceCount != int64(len(objs)) {
					t.Errorf("%s: resourceSliceCount %d, want %d", o.Name, o.Spec.Pool.ResourceSliceCount, len(objs))
				}
			}
			if w := want[s.Name]; devices != w.devices || len(objs) != w.slices {
				t.Errorf("%d devices in %d slices, want %d in %d", devices, len(objs), w.devices, w.slices)
			}
			c := fit.NewCluster(objs, slices.Concat(classes, s.Classes))
			features := fit.Features
			if s.Gates == "stock" {
				features = fit.StockFeatures
			}
			c.Features = &features
			seen := map[string]bool{}
			for i := range s.PerNode {
				res, err := c.Allocate(context.Background(), "node-0000", s.Claim(podName(i)))
				if err != nil || res == nil {
					t.Fatalf("claim %d of %d: %v, %v", i+1, s.PerNode, res, err)
				}
				for _, r := range res.Devices.Results {
					if r.ShareID == nil && seen[r.Device] {
						t.Fatalf("claim %d: %s allocated twice", i+1, r.Device)
					}
					seen[r.Device] = true
				}
			}
			if res, err := c.Allocate(context.Background(), "node-0000", s.Claim("one-more")); err != nil || res != nil {
				t.Errorf("claim %d of %d fits: %v, %v", s.PerNode+1, s.PerNode, fit.Devices(res), err)
			}
		})
	}
	// Every family has a Facet and an NVIDIA row, measured or n/a.
	for _, f := range []string{"exclusive", "static-mig", "mig", "shared", "slots"} {
		for _, d := range []string{"Facet", "NVIDIA"} {
			if !slices.Contains(families, f+"/"+d) {
				t.Errorf("no %s shape for %s", d, f)
			}
		}
	}
}
