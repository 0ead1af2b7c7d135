package e2e

import (
	"strings"
	"testing"
	"time"

	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/facet-gpu/facet/pkg/features"
)

// TestAllocatorDefects: the plugin knows the defects of the cluster's own
// allocator (inventory.AllocatorDefects). Where the allocator can
// double-book a mode's GPUs (kubernetes#139034 before 1.36.2: dynamic), the
// plugin refuses the mode at start, says why in its log and in a Node Event
// naming the defect, the release that fixes it and the safe modes, and
// publishes nothing. Where a defect only delays a pod that fits
// (kubernetes#140436 before 1.36.3: mig and dynamic), it serves the mode and
// warns with an Event. Past both fixes, dynamic is served without a word.
func TestAllocatorDefects(t *testing.T) {
	needGates(t, features.PartitionableDevices, features.ConsumableCapacity)
	v := utilversion.MustParseGeneric(e.gates.ServerVersion)
	dynamic := []string{"--gpu-modes", "0-7=dynamic"}

	if !v.AtLeast(utilversion.MustParseGeneric("1.36.2")) {
		t.Run("dynamic is refused: kubernetes#139034 double-books it", func(t *testing.T) {
			start := time.Now()
			p := launchPlugin(t, "dgx-h100", nil, true, dynamic...)
			// Wait reaps it: exited() cannot tell an exited plugin from
			// a running one while it is a zombie.
			done := make(chan error, 1)
			go func() { done <- p.cmd.Wait() }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("the plugin exited 0 with dynamic refused, want a failure:\n%s", p.logText())
				}
			case <-time.After(2 * time.Minute):
				t.Fatalf("the plugin did not refuse dynamic mode and exit within 2 minutes:\n%s", p.logText())
			}
			log := p.logText()
			for _, want := range []string{"mode dynamic is refused on Kubernetes " + e.gates.ServerVersion, "kubernetes#139034", "fixed in Kubernetes 1.36.2", "safe on this cluster: exclusive, static-mig, slots, shared, mig"} {
				if !strings.Contains(log, want) {
					t.Errorf("the plugin's log lacks %q:\n%s", want, log)
				}
			}
			msg := nodeEvent(t, "FacetAllocatorDefect", "kubernetes#139034", start)
			t.Logf("refusal, as the Node Event says it: %s", msg)
			for _, sl := range ourSlices(t) {
				for _, d := range sl.Spec.Devices {
					if m := d.Attributes["mode"].StringValue; m != nil && *m == "dynamic" {
						t.Errorf("device %s published in dynamic mode by a plugin that refused it", d.Name)
					}
				}
			}
		})
	} else {
		t.Run("dynamic is served", func(t *testing.T) {
			p := startPlugin(t, "dgx-h100", dynamic...)
			t.Cleanup(resetSimulatedGPUs(t, p))
			waitModes(t, func(int64) string { return "dynamic" })
		})
	}

	if !v.AtLeast(utilversion.MustParseGeneric("1.36.3")) {
		t.Run("mig is served with a kubernetes#140436 warning", func(t *testing.T) {
			start := time.Now()
			p := startPlugin(t, "dgx-h100", "--gpu-modes", "0-7=mig")
			t.Cleanup(resetSimulatedGPUs(t, p))
			waitModes(t, func(int64) string { return "mig" })
			msg := nodeEvent(t, "FacetAllocatorDefect", "kubernetes#140436", start)
			if !strings.Contains(msg, "mode mig on Kubernetes "+e.gates.ServerVersion) || !strings.Contains(msg, "Nothing is double-booked") {
				t.Errorf("warning %q", msg)
			}
		})
	}
}
