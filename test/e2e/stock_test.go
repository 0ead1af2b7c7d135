package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// stockModes are the GA shapes on the dgx-h100: GPUs 0-1 carved by Facet
// with mig-parted's all-balanced and published as static MIG devices, GPU 4
// split into vGPU slots, the others whole (exclusive: named, because from
// Kubernetes 1.37 auto gives MIG-capable GPUs mig where the cluster enforces
// partitionable devices).
var stockModes = []string{
	"--mode", "exclusive",
	"--gpu-modes", "0-1=static-mig,4=slots",
	"--mig-layouts", "0-1=all-balanced",
	"--gpu-slots", "4=1x40Gi/50+2",
}

// TestStock runs the three GA shapes on the real node, on whatever gates it
// runs: on stock 1.35 they are Facet's only correct shapes, and with the
// gates on they must keep working.
func TestStock(t *testing.T) {
	ctx := context.Background()
	setupNamespace(t)
	p := startPlugin(t, "dgx-h100", stockModes...)
	t.Cleanup(resetSimulatedGPUs(t, p))
	deleteNamespaceAtEnd(t)
	waitFor(t, "stock slices", time.Minute, func() (bool, error) {
		n := map[string]int{}
		for _, s := range ourSlices(t) {
			for _, d := range s.Spec.Devices {
				n[*d.Attributes["mode"].StringValue]++
			}
		}
		ok := n["static-mig"] == 8 && n["slots"] == 3 && n["exclusive"] == 5 && len(n) == 3
		return ok, fmt.Errorf("devices by mode: %v", n)
	})

	t.Run("the plugin says what the cluster enforces", func(t *testing.T) {
		log := p.logText()
		want := "enforced: DRAPartitionableDevices"
		if !e.gates.Has(features.PartitionableDevices) {
			want = "not enforced: DRAPartitionableDevices (dry-run ResourceSlice)"
		}
		if !strings.Contains(log, want) {
			t.Errorf("plugin log lacks %q:\n%s", want, log)
		}
		waitFor(t, "FacetClusterFeatures event on the Node", time.Minute, func() (bool, error) {
			evs, err := e.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,reason=FacetClusterFeatures"})
			if err != nil {
				return false, err
			}
			for _, ev := range evs.Items {
				if strings.Contains(ev.Message, want) {
					return true, nil
				}
			}
			return false, fmt.Errorf("%d events", len(evs.Items))
		})
		for _, s := range ourSlices(t) {
			if len(s.Spec.SharedCounters) > 0 {
				t.Errorf("slice %s has counters", s.Name)
			}
			for _, d := range s.Spec.Devices {
				if d.AllowMultipleAllocations != nil || len(d.ConsumesCounters) > 0 {
					t.Errorf("device %s uses a gated field", d.Name)
				}
			}
		}
	})

	t.Run("whole GPU, smallest static MIG instance and smallest slot", func(t *testing.T) {
		applyYAML(t, claimPod("whole", `{name: req, exactly: {deviceClassName: gpu.facet.dev}}`))
		applyYAML(t, claimPod("mig-3gb", `{name: req, exactly: {deviceClassName: mig.facet.dev, selectors: [{cel: {expression: 'device.capacity["gpu.facet.dev"].memory.compareTo(quantity("3Gi")) >= 0'}}]}}`))
		applyYAML(t, claimPod("volcano-slot", `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev, selectors: [{cel: {expression: 'device.capacity["gpu.facet.dev"].memory.compareTo(quantity("2000Mi")) >= 0 && device.capacity["gpu.facet.dev"].cores.compareTo(quantity("20")) >= 0'}}]}}`))
		for pod, check := range map[string]func(device string, env map[string]string) error{
			"whole": func(d string, env map[string]string) error {
				if !regexp.MustCompile(`^gpu-[23567]$`).MatchString(d) || !strings.HasPrefix(env["FACET_GPU_UUIDS"], "GPU-") {
					return fmt.Errorf("got %s with %s, want an exclusive whole GPU", d, env["FACET_GPU_UUIDS"])
				}
				return nil
			},
			"mig-3gb": func(d string, env map[string]string) error {
				if !strings.Contains(d, "-mig-1g10gb-") || !strings.HasPrefix(env["FACET_GPU_UUIDS"], "MIG-") {
					return fmt.Errorf("got %s with %s, want the smallest instance, a 1g.10gb", d, env["FACET_GPU_UUIDS"])
				}
				return nil
			},
			"volcano-slot": func(d string, env map[string]string) error {
				// The smallest slot holding 2000 MiB and 20 %: 20 GiB, 25 %.
				// 25 % by MPS; HAMi-core's SM throttle off (0).
				if d != "gpu-4-slot-0" || env["CUDA_DEVICE_MEMORY_LIMIT_0"] != "20026m" || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" || env["CUDA_DEVICE_SM_LIMIT_0"] != "0" {
					return fmt.Errorf("got %s with limits %q %q %q, want gpu-4-slot-0, 20026m, MPS 25, SM limit 0", d, env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_DEVICE_SM_LIMIT_0"])
				}
				return nil
			},
		} {
			pd := waitPodRunning(t, pod)
			var device string
			for _, c := range podClaims(t, pd) {
				device = c.Status.Allocation.Devices.Results[0].Device
			}
			if err := check(device, envOf(execIn(t, pod, "", "env"))); err != nil {
				t.Errorf("%s: %v", pod, err)
			}
		}
		if n := len(simInstances(t)); n != 8 {
			t.Errorf("%d MIG instances, want the two layouts' 8: prepare carves nothing in static-mig", n)
		}
	})

	t.Run("a burst of mixed pods never shares a piece of a GPU", func(t *testing.T) {
		var pods []string
		add := func(name, request string) {
			applyYAML(t, claimPod(name, request))
			pods = append(pods, name)
		}
		for i := range 6 { // 4 whole GPUs are left
			add(fmt.Sprint("burst-gpu-", i), `{name: req, exactly: {deviceClassName: gpu.facet.dev}}`)
		}
		for i := range 9 { // 7 instances are left
			add(fmt.Sprint("burst-mig-", i), `{name: req, exactly: {deviceClassName: mig.facet.dev}}`)
		}
		for i := range 3 { // 2 slots are left
			add(fmt.Sprint("burst-slot-", i), `{name: req, exactly: {deviceClassName: vgpu-slot.facet.dev}}`)
		}
		var running int
		waitFor(t, "the burst settles: 13 more pods Running, the rest Pending", 3*time.Minute, func() (bool, error) {
			running = 0
			for _, name := range pods {
				pd, err := e.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				if pd.Status.Phase == corev1.PodRunning {
					running++
				}
			}
			return running == 13, fmt.Errorf("%d Running", running)
		})
		holder := map[string]string{}
		claims, err := e.client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range claims.Items {
			if c.Status.Allocation == nil {
				continue
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				if prev, dup := holder[r.Device]; dup {
					t.Errorf("device %s allocated to %s and %s", r.Device, prev, c.Name)
				}
				holder[r.Device] = c.Name
			}
		}
		if len(holder) != 16 {
			t.Errorf("%d devices allocated, want all 16", len(holder))
		}
		if log := p.logText(); strings.Contains(log, "conflicts with") {
			t.Errorf("prepare saw a double booking:\n%s", log)
		}
	})
}

// resetSimulatedGPUs returns a cleanup that, once the namespace is gone and
// the plugin stopped, powers the simulated GPUs off and on: their MIG
// instances and Facet's layout records go, as on a node whose GPUs were
// reset, so later tests start from uncarved GPUs.
func resetSimulatedGPUs(t *testing.T, p *plugin) func() {
	return func() {
		if out, err := kubectlErr("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=180s"); err != nil {
			t.Errorf("delete namespace %s: %v\n%s", namespace, err, out)
		}
		p.stop()
		for _, f := range []string{"simulated-nvml.json", "mig-layouts.json"} {
			if err := os.Remove(filepath.Join(e.runDir, "facet-state", f)); err != nil && !os.IsNotExist(err) {
				t.Error(err)
			}
		}
	}
}
