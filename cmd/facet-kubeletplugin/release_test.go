package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShippedBuildLinksNoSimulator checks the build that ships (no build
// tags): the plugin must not link Facet's simulator or go-nvml's mock GPUs.
// Only `-tags facetsim` (make build, for the demo and the end-to-end tests)
// links them.
func TestShippedBuildLinksNoSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, tc := range []struct {
		tags      string
		wantLinks bool
	}{
		{"", false},
		{"facetsim", true},
	} {
		out, err := exec.Command("go", "list", "-tags", tc.tags, "-deps", ".").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags %q: %v\n%s", tc.tags, err, out)
		}
		var sim []string
		for _, pkg := range strings.Fields(string(out)) {
			if strings.HasPrefix(pkg, "github.com/NVIDIA/go-nvml/pkg/nvml/mock") ||
				pkg == "github.com/facet-gpu/facet/pkg/nvml/sim" {
				sim = append(sim, pkg)
			}
		}
		if got := len(sim) > 0; got != tc.wantLinks {
			t.Errorf("-tags %q: links the simulator: %v (%v), want %v", tc.tags, got, sim, tc.wantLinks)
		}
	}
}
