package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// facetctlOut runs bin/facetctl against the node and returns its output
// and exit code.
func facetctlOut(t testing.TB, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(e.facetctl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("facetctl %s: %v", strings.Join(args, " "), err)
	}
	return string(out), 0
}

// TestOccupancyAndFit runs `facetctl occupancy` and `facetctl fit` against
// the real node with the demo's layout, a MIG instance and a vGPU share
// held by running pods.
func TestOccupancyAndFit(t *testing.T) {
	needGates(t, features.PartitionableDevices, features.ConsumableCapacity)
	setupNamespace(t)
	startPlugin(t, "dgx-h100", demoModes...)
	deleteNamespaceAtEnd(t)
	waitModes(t, demoMode)

	applyYAML(t, claimPod("mig-3g", `{name: mig, exactly: {deviceClassName: mig.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].profile == "3g.40gb"'}}]}}`))
	applyYAML(t, claimPod("share-20g", `{name: vgpu, exactly: {deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 20Gi, cores: "20"}}}}`))
	applyYAML(t, claimPod("whole", `{name: gpu, exactly: {deviceClassName: gpu.facet.dev}}`))
	for _, p := range []string{"mig-3g", "share-20g", "whole"} {
		waitPodRunning(t, p)
	}

	t.Run("occupancy", func(t *testing.T) {
		pic, rc := facetctlOut(t, "occupancy", "-o", "picture")
		t.Logf("facetctl occupancy -o picture:\n%s", pic)
		table, rc2 := facetctlOut(t, "occupancy", "--node", nodeName)
		t.Logf("facetctl occupancy:\n%s", table)
		if rc != 0 || rc2 != 0 {
			t.Fatalf("exit codes %d, %d", rc, rc2)
		}
		for _, want := range []string{"facet-demo/mig-3g-req", "facet-demo/share-20g-req", "facet-demo/whole-req", "memory slices free"} {
			if !strings.Contains(pic, want) {
				t.Errorf("picture lacks %q", want)
			}
		}
		for _, want := range []string{"(3g.40gb, slices", "share", "whole GPU", "(20Gi, 20%; 19.9Gi usable, MPS)", "usable: a vGPU share's or slot's memory"} {
			if !strings.Contains(table, want) {
				t.Errorf("table lacks %q", want)
			}
		}
	})

	t.Run("fit", func(t *testing.T) {
		dir := t.TempDir()
		write := func(name, manifest string) string {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte(manifest), 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}
		fits := write("fits.yaml", claimPod("another-3g", `{name: mig, exactly: {deviceClassName: mig.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].profile == "3g.40gb"'}}]}}`))
		out, rc := facetctlOut(t, "fit", "-f", fits)
		t.Logf("facetctl fit (fits):\n%s", out)
		if rc != 0 || !strings.Contains(out, "fits on node localhost") {
			t.Errorf("exit code %d, want a fit on localhost", rc)
		}
		tooMany := write("eight.yaml", claimPod("eight", `{name: gpus, exactly: {deviceClassName: gpu.facet.dev, count: 8}}`))
		out, rc = facetctlOut(t, "fit", "-f", tooMany)
		t.Logf("facetctl fit (does not fit):\n%s", out)
		if rc != 3 || !strings.Contains(out, "does not fit on node localhost") || !strings.Contains(out, "whole GPU held by facet-demo/whole-req") {
			t.Errorf("exit code %d, want 3 and the held GPUs named", rc)
		}
	})
}
