package multinode

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// TestNodesPublish checks the cluster the other tests rely on: each GPU
// node publishes its own pool, with its machine's GPUs in its mode, and the
// CPU node publishes nothing.
func TestNodesPublish(t *testing.T) {
	for _, n := range gpuNodes {
		t.Run(n.name, func(t *testing.T) {
			gpus := 0
			for _, s := range slicesOf(t, n.name) {
				if s.Spec.Pool.Name != n.name {
					t.Errorf("slice %s of node %s is in pool %q", s.Name, n.name, s.Spec.Pool.Name)
				}
				for _, d := range s.Spec.Devices {
					a := d.Attributes
					if typ := a[names.AttrType].StringValue; typ == nil || *typ != "gpu" {
						continue
					}
					gpus++
					if p := a[names.AttrProductName].StringValue; p == nil || *p != n.product {
						t.Errorf("%s/%s: productName %v, want %q", n.name, d.Name, p, n.product)
					}
					if m := a[names.AttrMode].StringValue; m == nil || *m != n.mode {
						t.Errorf("%s/%s: mode %v, want %q", n.name, d.Name, m, n.mode)
					}
				}
			}
			if gpus != n.gpus {
				t.Errorf("%s publishes %d GPUs, want %d", n.name, gpus, n.gpus)
			}
		})
	}
	if s := slicesOf(t, cpuNode); len(s) != 0 {
		t.Errorf("node %s has no plugin but %d slices", cpuNode, len(s))
	}
}

// TestClassesAndCEL checks that DeviceClasses and CEL selectors land each
// claim on the one node whose GPUs can serve it: by the GPUs' mode (MIG,
// vGPU shares) or by their attributes and capacity.
func TestClassesAndCEL(t *testing.T) {
	ns := newNamespace(t)
	for _, tc := range []struct {
		name   string
		req    request
		node   string
		device *regexp.Regexp
	}{
		{"MIG 1g.10gb instance on the H100s in mig mode", migRequest, h100.name, regexp.MustCompile(`^gpu-\d+-mig-1g10gb-\d+$`)},
		{"vGPU share on the A100s in shared mode", shareRequest, a100.name, regexp.MustCompile(`^gpu-\d+$`)},
		{"whole GPU by CEL on productName and memory: an L4", l4Request, l4.name, regexp.MustCompile(`^gpu-[0-3]$`)},
		{"whole GPU by CEL on memory and architecture: an A100", request{class: "gpu.facet.dev", cel: []string{
			`device.attributes["gpu.facet.dev"].architecture == "ampere" && ` +
				`device.capacity["gpu.facet.dev"].memory.compareTo(quantity("70Gi")) >= 0`,
		}}, a100.name, regexp.MustCompile(`^gpu-\d+$`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ToLower(strings.NewReplacer(" ", "-", ".", "", ":", "").Replace(tc.name))
			if len(name) > 50 {
				name = strings.TrimRight(name[:50], "-")
			}
			createPod(t, ns, name, tc.req, nil)
			pod := waitRunning(t, ns, name)
			devices := checkOn(t, pod, tc.node)
			for _, d := range devices {
				if !tc.device.MatchString(d) {
					t.Errorf("pod %s got device %s, want one matching %s", name, d, tc.device)
				}
			}
			t.Logf("%s: on %s with %v", name, pod.Spec.NodeName, devices)
		})
	}
}

// TestFitsNowhere checks that a claim no node can serve leaves its pod
// Pending, and that the scheduler says why: every node was tried, and each
// was ruled out by the DynamicResources plugin, not by anything else.
func TestFitsNowhere(t *testing.T) {
	ns := newNamespace(t)
	nodes, err := e.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const (
		// kube-scheduler's DynamicResources reasons (v1.35
		// pkg/scheduler/framework/plugins/dynamicresources).
		cannotAllocate = "cannot allocate all claims"
		timedOut       = "timed out trying to allocate devices"
	)
	for _, tc := range []struct {
		name string
		req  request
		// reasons are those each node may be ruled out with.
		reasons []string
	}{
		// More memory than any GPU has.
		{"gpu-with-1ti", request{class: "gpu.facet.dev", cel: []string{
			`device.capacity["gpu.facet.dev"].memory.compareTo(quantity("1Ti")) >= 0`,
		}}, []string{cannotAllocate}},
		// L4s have no MIG; the MIG-capable GPUs are not L4s.
		{"mig-on-an-l4", request{class: "mig.facet.dev", cel: []string{
			`device.attributes["gpu.facet.dev"].productName == "NVIDIA L4"`,
		}}, []string{cannotAllocate}},
		// A share bigger than an A100's 80 GB, the only GPUs that share.
		{"share-of-100gi", request{class: "vgpu.facet.dev", capacity: map[string]string{"memory": "100Gi"}}, []string{cannotAllocate}},
		// 20 GPUs in the cluster, at most 8 on a node, and a claim's
		// devices come from one node. On the 8-GPU nodes the 1.35
		// allocator may search until the scheduler's filter timeout (10 s)
		// before it gives up.
		{"nine-whole-gpus", request{class: "gpu.facet.dev", count: 9}, []string{cannotAllocate, timedOut}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			createPod(t, ns, tc.name, tc.req, nil)
			// The scheduler retries the pod; a retry of the nine-GPU claim
			// costs the scheduler 10 s of searching, so delete it at the end.
			defer func() {
				if err := e.client.CoreV1().Pods(ns).Delete(context.Background(), tc.name, metav1.DeleteOptions{}); err != nil {
					t.Error(err)
				}
			}()
			var msg string
			waitFor(t, "PodScheduled=False for "+tc.name, time.Minute, func() (bool, error) {
				pod := getPod(t, ns, tc.name)
				for _, c := range pod.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
						msg = c.Message
						return true, nil
					}
				}
				return false, fmt.Errorf("conditions %v", pod.Status.Conditions)
			})
			t.Logf("PodScheduled: %s", msg)
			if err := checkFitError(msg, len(nodes.Items), tc.reasons); err != nil {
				t.Errorf("PodScheduled message: %v", err)
			}
			events, err := e.client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
				FieldSelector: fields.Set{"involvedObject.name": tc.name, "reason": "FailedScheduling"}.AsSelector().String(),
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(events.Items) == 0 {
				t.Errorf("no FailedScheduling event")
			}
			for _, ev := range events.Items {
				if err := checkFitError(ev.Message, len(nodes.Items), tc.reasons); err != nil {
					t.Errorf("FailedScheduling event: %v", err)
				}
			}
			// Still Pending a while later: not a slow scheduling.
			time.Sleep(3 * time.Second)
			pod := getPod(t, ns, tc.name)
			if pod.Spec.NodeName != "" || pod.Status.Phase != corev1.PodPending {
				t.Errorf("pod %s is %s on %q, want Pending on no node", tc.name, pod.Status.Phase, pod.Spec.NodeName)
			}
			if claim := podClaim(t, pod); claim.Status.Allocation != nil {
				t.Errorf("claim %s allocated: %+v", claim.Name, claim.Status.Allocation)
			}
		})
	}
}

// fitErrorRE matches the head of kube-scheduler's FitError message:
// "0/4 nodes are available: 2 cannot allocate all claims, 2 timed out
// trying to allocate devices. ...".
var fitErrorRE = regexp.MustCompile(`^0/(\d+) nodes are available: ([^.]+)\.`)

// checkFitError checks that msg says none of the cluster's nodes fits, and
// that each node was ruled out for one of reasons.
func checkFitError(msg string, nodes int, reasons []string) error {
	m := fitErrorRE.FindStringSubmatch(msg)
	if m == nil {
		return fmt.Errorf("%q is no FitError", msg)
	}
	if m[1] != strconv.Itoa(nodes) {
		return fmt.Errorf("%q counts %s nodes, want %d", msg, m[1], nodes)
	}
	total := 0
	for _, part := range strings.Split(m[2], ", ") {
		n, reason, _ := strings.Cut(part, " ")
		count, err := strconv.Atoi(n)
		if err != nil || !slices.Contains(reasons, reason) {
			return fmt.Errorf("%q rules nodes out for %q, want only %q", msg, part, reasons)
		}
		total += count
	}
	if total != nodes {
		return fmt.Errorf("%q gives reasons for %d nodes, want %d", msg, total, nodes)
	}
	return nil
}
