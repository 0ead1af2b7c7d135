package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/internal/testenv"
)

// TestTopology runs demo/topology's claims on a simulated HGX H100 node
// (demo/machines/hgx-h100.yaml: eight GPUs on one NVSwitch fabric, two per
// PCIe switch), through the live scheduler and kubelet, in exclusive mode,
// which every round serves: each pod runs, and its container sees GPUs
// whose published topology attributes are the ones its claim aligned on.
func TestTopology(t *testing.T) {
	setupNamespace(t)
	p := startPlugin(t, "hgx-h100", "--mode", "exclusive")
	t.Cleanup(resetSimulatedGPUs(t, p))
	deleteNamespaceAtEnd(t)
	waitModes(t, func(int64) string { return "exclusive" })

	// attrs are each published GPU's topology attributes, by UUID.
	attrs := map[string]map[string]string{}
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			a := map[string]string{}
			for _, k := range []string{"nvlinkDomain", "pcieSwitch"} {
				if v, ok := d.Attributes[resourceapi.QualifiedName(k)]; ok && v.StringValue != nil {
					a[k] = *v.StringValue
				}
			}
			attrs[*d.Attributes["uuid"].StringValue] = a
		}
	}
	for _, tc := range []struct{ file, template, attr string }{
		{"two-gpus-one-nvlink-domain.yaml", "two-gpus-one-nvlink-domain", "nvlinkDomain"},
		{"pair-one-pcie-switch.yaml", "pair-one-pcie-switch", "pcieSwitch"},
	} {
		t.Run(tc.template, func(t *testing.T) {
			kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "topology", tc.file))
			applyYAML(t, testenv.ClaimPod(tc.template, namespace, "gpus", tc.template))
			waitPodRunning(t, tc.template)
			uuids := strings.Split(envOf(execIn(t, tc.template, "", "env"))["FACET_GPU_UUIDS"], ",")
			if len(uuids) != 2 {
				t.Fatalf("the container sees GPUs %v, want two", uuids)
			}
			a, b := attrs[uuids[0]][tc.attr], attrs[uuids[1]][tc.attr]
			if a == "" || a != b {
				t.Errorf("GPUs %v have %s %q and %q, want one value", uuids, tc.attr, a, b)
			}
			t.Logf("%s: GPUs %v, %s %s", tc.template, uuids, tc.attr, a)
			kubectl(t, "delete", "pod", "-n", namespace, tc.template, "--wait=true", "--timeout=120s")
		})
	}
}
