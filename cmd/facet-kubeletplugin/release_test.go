package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShippedBuildLinksNoSimulator checks the builds that ship (no build
// tags): no daemon of the image, the kubelet plugin, facet-mps,
// facet-webhook, facet-preemptor, facet-controller and facet-install, may link Facet's
// simulator, its MPS stand-in or go-nvml's mock GPUs. Only `-tags facetsim` (make build, for
// the demo and the end-to-end tests) links them into the plugin.
func TestShippedBuildLinksNoSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, tc := range []struct {
		pkg, tags string
		wantLinks bool
	}{
		{".", "", false},
		{".", "facetsim", true},
		{"../facet-mps", "", false},
		{"../facet-webhook", "", false},
		{"../facet-preemptor", "", false},
		{"../facet-controller", "", false},
		{"../facet-install", "", false},
	} {
		out, err := exec.Command("go", "list", "-tags", tc.tags, "-deps", tc.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags %q %s: %v\n%s", tc.tags, tc.pkg, err, out)
		}
		var sim []string
		for _, pkg := range strings.Fields(string(out)) {
			if strings.HasPrefix(pkg, "github.com/NVIDIA/go-nvml/pkg/nvml/mock") ||
				pkg == "github.com/facet-gpu/facet/internal/nvml/sim" || pkg == "github.com/facet-gpu/facet/internal/mps/mpssim" {
				sim = append(sim, pkg)
			}
		}
		if got := len(sim) > 0; got != tc.wantLinks {
			t.Errorf("%s -tags %q: links the simulator: %v (%v), want %v", tc.pkg, tc.tags, got, sim, tc.wantLinks)
		}
	}
}
