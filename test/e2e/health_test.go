package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// facetctlRun runs bin/facetctl against the e2e node's plugin state.
func facetctlRun(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(e.facetctl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig, "FACET_STATE_DIR="+filepath.Join(e.runDir, "facet-state"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("facetctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// gpuState is how a whole-GPU device appears in the node's slices:
// "absent", "healthy", or its taint ("xid-79:NoExecute").
func gpuState(t testing.TB, device string) string {
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			if d.Name != device {
				continue
			}
			if len(d.Taints) == 0 {
				return "healthy"
			}
			return d.Taints[0].Value + ":" + string(d.Taints[0].Effect)
		}
	}
	return "absent"
}

// nodeEvent waits for an Event on the Node with reason whose message
// contains contains, and returns the message.
func nodeEvent(t testing.TB, reason, contains string, after time.Time) string {
	t.Helper()
	var msg string
	waitFor(t, reason+" event on the node", time.Minute, func() (bool, error) {
		evs, err := e.client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,reason=" + reason})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if strings.Contains(ev.Message, contains) && !ev.LastTimestamp.Time.Before(after.Truncate(time.Second)) {
				msg = ev.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("%d %s events", len(evs.Items), reason)
	})
	return msg
}

// TestGPUHealth: an injected fault takes a GPU out of scheduling (a taint
// where DRADeviceTaints is enforced, unpublished on stock 1.35); a pod
// pinned to it stays Pending while an unpinned one lands elsewhere; a
// recovery request is refused while the GPU is lost and honoured after
// its reset, and the pinned pod then runs on it.
func TestGPUHealth(t *testing.T) {
	setupNamespace(t)
	state := filepath.Join(e.runDir, "facet-state")
	os.Remove(filepath.Join(state, "gpu-faults.json"))
	// Faults a previous test run left would be read at the start.
	if fileExists(filepath.Join(state, "simulated-nvml.json")) {
		facetctlRun(t, "fault", "clear", "--gpu", "all")
	}
	p := startPlugin(t, "dgx-h100", "--mode=exclusive", "--gpu-health-probe-interval=500ms", "--gpu-health-quiet-period=5s")
	deleteNamespaceAtEnd(t)
	waitModes(t, func(int64) string { return "exclusive" })
	const sick = "gpu-3"
	taints := e.gates.Has(features.DeviceTaints)
	wantOut := "absent"
	if taints {
		wantOut = "gpu-lost:NoExecute"
	}

	t.Run("a lost GPU leaves scheduling", func(t *testing.T) {
		start := time.Now()
		facetctlRun(t, "fault", "inject", "--gpu", "3", "--kind", "lost")
		waitFor(t, sick+" out of scheduling", time.Minute, func() (bool, error) {
			s := gpuState(t, sick)
			// The XID 79 event and the failing probe race; both are fatal.
			return s == wantOut || (taints && s == "xid-79:NoExecute"), fmt.Errorf("%s is %s", sick, s)
		})
		t.Logf("fault to out of scheduling: %s (%s)", time.Since(start).Round(time.Millisecond), gpuState(t, sick))
		msg := nodeEvent(t, "FacetGPUUnhealthy", "GPU 3 ", start)
		t.Logf("Node event: %s", msg)
		for i := range 8 {
			if d := fmt.Sprintf("gpu-%d", i); d != sick && gpuState(t, d) != "healthy" {
				t.Errorf("%s is %s, want healthy", d, gpuState(t, d))
			}
		}
		p.expectMetric(t, "facet_gpu_healthy", map[string]string{"gpu": "3"}, 0)
		p.expectMetric(t, "facet_gpu_healthy", map[string]string{"gpu": "2"}, 1)
	})

	t.Run("a pod pinned to it stays Pending, an unpinned one lands elsewhere", func(t *testing.T) {
		applyYAML(t, claimPod("pinned", `{name: gpu, exactly: {deviceClassName: gpu.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 3'}}]}}`))
		applyYAML(t, claimPod("anywhere", `{name: gpu, exactly: {deviceClassName: gpu.facet.dev}}`))
		pod := waitPodRunning(t, "anywhere")
		for _, c := range podClaims(t, pod) {
			if d := c.Status.Allocation.Devices.Results[0].Device; d == sick {
				t.Errorf("anywhere got the unhealthy %s", d)
			}
		}
		waitEvent(t, "pinned", "FailedScheduling", "cannot allocate all claims")
		if p, _ := e.client.CoreV1().Pods(namespace).Get(context.Background(), "pinned", metav1.GetOptions{}); p.Status.Phase != corev1.PodPending {
			t.Fatalf("pinned: phase %s", p.Status.Phase)
		}
	})

	t.Run("recovery is refused while the GPU is lost", func(t *testing.T) {
		start := time.Now()
		facetctlRun(t, "health", "recover", "--node", nodeName, "--gpu", "3")
		msg := nodeEvent(t, "FacetGPURecoveryFailed", "GPU 3 ", start)
		t.Logf("Node event: %s", msg)
		time.Sleep(2 * time.Second)
		if s := gpuState(t, sick); s == "healthy" {
			t.Fatalf("%s is back though it is still lost", sick)
		}
	})

	t.Run("after a reset and a recovery request the GPU is used again", func(t *testing.T) {
		facetctlRun(t, "fault", "clear", "--gpu", "3")
		// A fatal fault does not pass by itself, reset or not.
		time.Sleep(2 * time.Second)
		if s := gpuState(t, sick); s == "healthy" {
			t.Fatalf("%s came back without a recovery request", sick)
		}
		start := time.Now()
		facetctlRun(t, "health", "recover", "--node", nodeName, "--gpu", "3")
		waitFor(t, sick+" offered again", time.Minute, func() (bool, error) {
			s := gpuState(t, sick)
			return s == "healthy", fmt.Errorf("%s is %s", sick, s)
		})
		t.Logf("recovery request to offered again: %s", time.Since(start).Round(time.Millisecond))
		p.expectMetric(t, "facet_gpu_healthy", map[string]string{"gpu": "3"}, 1)
		nodeEvent(t, "FacetGPURecovered", "GPU 3 ", start)
		pod := waitPodRunning(t, "pinned")
		t.Logf("pinned pod Running %s after the recovery request", time.Since(start).Round(time.Millisecond))
		for _, c := range podClaims(t, pod) {
			if d := c.Status.Allocation.Devices.Results[0].Device; d != sick {
				t.Errorf("pinned got %s", d)
			}
		}
	})

	t.Run("a recoverable fault passes by itself after the quiet period", func(t *testing.T) {
		// A pod on the GPU keeps running: NoSchedule, or unpublished, does
		// not evict. Where the kubelet asks for device health (KEP-4680,
		// on here with the DRA gates) its status shows the fault.
		applyYAML(t, claimPod("on-five", `{name: gpu, exactly: {deviceClassName: gpu.facet.dev, selectors: [{cel: {expression: 'device.attributes["gpu.facet.dev"].index == 5'}}]}}`))
		waitPodRunning(t, "on-five")
		start := time.Now()
		facetctlRun(t, "fault", "inject", "--gpu", "5", "--kind", "query")
		want := "absent"
		if taints {
			want = "nvml-query-failed:NoSchedule"
		}
		waitFor(t, "gpu-5 out of scheduling", time.Minute, func() (bool, error) {
			s := gpuState(t, "gpu-5")
			return s == want, fmt.Errorf("gpu-5 is %s", s)
		})
		out := time.Since(start)
		if taints {
			waitDeviceHealth(t, "on-five", "Unhealthy")
		}
		facetctlRun(t, "fault", "clear", "--gpu", "5")
		cleared := time.Now()
		waitFor(t, "gpu-5 offered again", time.Minute, func() (bool, error) {
			s := gpuState(t, "gpu-5")
			return s == "healthy", fmt.Errorf("gpu-5 is %s", s)
		})
		back := time.Since(cleared)
		if back < 5*time.Second {
			t.Errorf("gpu-5 back %s after the fault cleared, before the 5 s quiet period", back)
		}
		if taints {
			waitDeviceHealth(t, "on-five", "Healthy")
		}
		if p, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), "on-five", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
			t.Errorf("on-five: %v, phase %v; want Running throughout", err, p.Status.Phase)
		}
		t.Logf("recoverable fault: out of scheduling after %s, back %s after it cleared (quiet period 5 s)", out.Round(time.Millisecond), back.Round(time.Millisecond))
	})
}

// waitDeviceHealth waits until the pod's container status shows its
// device's health as want (KEP-4680 allocatedResourcesStatus, fed by the
// plugin's NodeWatchResources).
func waitDeviceHealth(t *testing.T, pod, want string) {
	t.Helper()
	start := time.Now()
	waitFor(t, pod+" device health "+want+" in the pod status", time.Minute, func() (bool, error) {
		p, err := e.client.CoreV1().Pods(namespace).Get(context.Background(), pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				for _, r := range rs.Resources {
					seen = append(seen, fmt.Sprintf("%s %s=%s", rs.Name, r.ResourceID, r.Health))
					if string(r.Health) == want {
						return true, nil
					}
				}
			}
		}
		return false, fmt.Errorf("allocatedResourcesStatus %v", seen)
	})
	t.Logf("%s: device health %s in the pod status after %s", pod, want, time.Since(start).Round(time.Millisecond))
}
