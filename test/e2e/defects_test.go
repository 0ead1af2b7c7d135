package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/model/features"
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

// TestDynamicBurst is the load that met kubernetes#139034 live on 1.35.4:
// 8 whole-GPU, 7 MIG 1g.10gb and 4 vGPU-share pods created at once on an
// 8×H100 node in dynamic mode, where every GPU can serve any of the three.
// On a cluster whose allocator is past the fix, no GPU is held by two
// uses (a whole GPU alone; MIG instances never beside shares), every pod
// the scheduler binds runs, and Facet's prepare-time guard never has to
// refuse a claim (no FailedPrepareDynamicResources). The pods that do not
// fit stay Pending, unschedulable. Before the fix the plugin refuses
// dynamic mode (TestAllocatorDefects), so there is nothing to burst.
func TestDynamicBurst(t *testing.T) {
	needGates(t, features.PartitionableDevices, features.ConsumableCapacity)
	if !utilversion.MustParseGeneric(e.gates.ServerVersion).AtLeast(utilversion.MustParseGeneric("1.36.2")) {
		t.Skipf("dynamic mode is refused on Kubernetes %s (kubernetes#139034; TestAllocatorDefects)", e.gates.ServerVersion)
	}
	setupNamespace(t)
	p := startPlugin(t, "dgx-h100", "--gpu-modes", "0-7=dynamic")
	t.Cleanup(resetSimulatedGPUs(t, p))
	deleteNamespaceAtEnd(t)
	waitModes(t, func(int64) string { return "dynamic" })

	templates := map[string]string{
		"whole": `{name: req, exactly: {deviceClassName: gpu.facet.dev}}`,
		"mig":   `{name: req, exactly: {deviceClassName: mig-1g.10gb.facet.dev}}`,
		"share": `{name: req, exactly: {deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 8Gi, cores: "25"}}}}`,
	}
	counts := map[string]int{"whole": 8, "mig": 7, "share": 4}
	var docs []string
	for use, req := range templates {
		docs = append(docs, strings.NewReplacer("NAME", "burst-"+use, "REQUEST", req).Replace(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: NAME, namespace: facet-demo}
spec: {spec: {devices: {requests: [REQUEST]}}}
`))
	}
	// Interleaved, as a mixed workload arrives: the scheduler's queue takes
	// pods of one priority in the order they were added.
	var pods []string
	for i := 1; i <= 8; i++ {
		for _, use := range []string{"whole", "mig", "share"} {
			if i > counts[use] {
				continue
			}
			name := fmt.Sprintf("burst-%s-%d", use, i)
			pods = append(pods, name)
			docs = append(docs, testenv.ClaimPod(name, namespace, "req", "burst-"+use))
		}
	}
	start := time.Now()
	applyYAML(t, strings.Join(docs, "---\n"))

	// Settled: every pod bound to the node runs, every other one has been
	// found unschedulable. A pod bound but not running after 3 minutes is
	// what the defect left: stuck in ContainerCreating.
	ctx := context.Background()
	var list *corev1.PodList
	waitFor(t, "every burst pod running or unschedulable", 3*time.Minute, func() (bool, error) {
		var err error
		list, err = e.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(list.Items) != len(pods) {
			return false, fmt.Errorf("%d pods", len(list.Items))
		}
		for _, pod := range list.Items {
			if pod.Spec.NodeName != "" {
				if pod.Status.Phase != corev1.PodRunning {
					return false, fmt.Errorf("%s bound but %s", pod.Name, pod.Status.Phase)
				}
				continue
			}
			if !unschedulable(&pod) {
				return false, fmt.Errorf("%s not yet tried", pod.Name)
			}
		}
		return true, nil
	})
	t.Logf("settled in %s", time.Since(start).Round(time.Second))

	// Which uses hold each GPU, from the allocations of the running pods.
	gpuOf := regexp.MustCompile(`^gpu-(\d+)`)
	uses := map[string]map[string]int{}
	running := map[string]int{}
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.Status.Phase != corev1.PodRunning {
			continue
		}
		use := strings.Split(pod.Name, "-")[1]
		running[use]++
		for _, c := range podClaims(t, pod) {
			for _, r := range c.Status.Allocation.Devices.Results {
				m := gpuOf.FindStringSubmatch(r.Device)
				if m == nil {
					t.Fatalf("%s: allocated %q, not a device of a GPU", pod.Name, r.Device)
				}
				if uses[m[1]] == nil {
					uses[m[1]] = map[string]int{}
				}
				uses[m[1]][use]++
			}
		}
	}
	t.Logf("running: %v; GPU uses: %v", running, uses)
	if len(uses) != 8 {
		t.Errorf("%d of 8 GPUs in use with %v pods running: the rest waits on a GPU that is free", len(uses), running)
	}
	for gpu, u := range uses {
		if u["whole"] > 0 && (u["whole"] > 1 || len(u) > 1) {
			t.Errorf("GPU %s held whole and by more: %v", gpu, u)
		}
		if u["mig"] > 0 && u["share"] > 0 {
			t.Errorf("GPU %s holds MIG instances beside vGPU shares: %v", gpu, u)
		}
	}
	evs, err := e.client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedPrepareDynamicResources"})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		t.Errorf("prepare refused a claim the scheduler allocated (double-booked?): %s: %s", ev.InvolvedObject.Name, ev.Message)
	}
}

// unschedulable says whether the scheduler has tried pod and found no
// node for it.
func unschedulable(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}
