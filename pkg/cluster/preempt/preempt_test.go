package preempt

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/internal/occupancy/occtest"
	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/pkg/model/features"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// running is a pod "name" of priority prio on node, started at minute
// start, that holds one claim allocated the results.
type running struct {
	name    string
	node    string
	prio    int32
	start   int
	results []resourceapi.DeviceRequestAllocationResult
	// terminating marks a pod being deleted.
	terminating bool
	// sharedWith is another running pod's name the claim is also
	// reserved for.
	sharedWith string
	// ns is the pod's namespace, ml where empty.
	ns string
	// daemonSet: a DaemonSet controls it. mirror: it is a static pod's
	// mirror.
	daemonSet, mirror bool
}

func uid(name string) types.UID { return types.UID("uid-" + name) }

func (r running) objects() (*v1.Pod, *resourceapi.ResourceClaim) {
	ns := r.ns
	if ns == "" {
		ns = "ml"
	}
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: r.name, UID: uid(r.name)},
		Spec:       v1.PodSpec{NodeName: r.node, Priority: ptr.To(r.prio)},
		Status:     v1.PodStatus{Phase: v1.PodRunning, StartTime: ptr.To(metav1.NewTime(t0.Add(time.Duration(r.start) * time.Minute)))},
	}
	if r.daemonSet {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "uid-agent", Controller: ptr.To(true)}}
	}
	if r.mirror {
		p.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "abc"}
	}
	if r.terminating {
		p.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
	}
	c := occtest.Allocated(ns+"/"+r.name+"-gpu", r.results...)
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: r.name, UID: p.UID}}
	if r.sharedWith != "" {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: r.sharedWith, UID: uid(r.sharedWith)})
	}
	return p, c
}

// request is one request of a class, with selectors and, for a share,
// capacity requests.
type request struct {
	class     string
	capacity  map[string]string
	selectors []string
}

func (r request) claim(name string) *resourceapi.ResourceClaim {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: r.class}
	for _, s := range r.selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	if r.capacity != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range r.capacity {
			req.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: uid(name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}},
	}
}

// preemptor is a pending pod of priority prio with one claim per request,
// made from templates (named in its status).
func preemptor(prio int32, reqs ...request) (*v1.Pod, []*resourceapi.ResourceClaim) {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "urgent", UID: "uid-urgent"},
		Spec:       v1.PodSpec{Priority: ptr.To(prio)},
		Status:     v1.PodStatus{Phase: v1.PodPending},
	}
	var claims []*resourceapi.ResourceClaim
	for i, r := range reqs {
		entry := fmt.Sprint("c", i)
		name := "urgent-" + entry
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: entry, ResourceClaimTemplateName: ptr.To("t")})
		p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, v1.PodResourceClaimStatus{Name: entry, ResourceClaimName: ptr.To(name)})
		claims = append(claims, r.claim(name))
	}
	return p, claims
}

func classes(t *testing.T) []*resourceapi.DeviceClass {
	t.Helper()
	_, cls, _, err := fit.ReadFile("../../../deployments/deviceclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cls
}

// wholeGPUs are pods name0..name<n-1> of prio holding gpu-0..gpu-<n-1> of
// node n1, started a minute apart.
func wholeGPUs(name string, n int, prio int32, firstStart int) []running {
	var out []running
	for i := range n {
		out = append(out, running{name: fmt.Sprint(name, i), node: "n1", prio: prio, start: firstStart + i, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", fmt.Sprint("gpu-", i))}})
	}
	return out
}

// withPod is rs with a copy of its i-th pod changed by edit.
func withPod(rs []running, i int, edit func(*running)) []running {
	out := append([]running(nil), rs...)
	edit(&out[i])
	return out
}

func TestDecide(t *testing.T) {
	whole := request{class: "gpu.facet.dev"}
	mig1g := request{class: "mig.facet.dev", selectors: []string{`device.attributes["gpu.facet.dev"].profile == "1g.10gb"`}}
	dgx := occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 8}
	eight := wholeGPUs("batch-", 8, 100, 0)
	for _, tc := range []struct {
		name      string
		nodes     []occtest.Node
		stock     bool
		running   []running
		prio      int32
		never     bool
		reqs      []request
		protected []string
		vanished  []string // running pods deleted, their claims not yet deallocated
		k8sNodes  []*v1.Node
		// protectNS are --protected-namespaces.
		protectNS []string
		outcome   Outcome
		node      string
		victims   []string
		// why is a part of the reason given.
		why string
	}{{
		name: "8 + 1: the latest started of eight equal pods", nodes: []occtest.Node{dgx},
		running: eight, prio: 1000, reqs: []request{whole},
		outcome: Preempt, node: "n1", victims: []string{"batch-7"},
	}, {
		name: "8 + 1 on stock 1.35", nodes: []occtest.Node{dgx}, stock: true,
		running: eight, prio: 1000, reqs: []request{whole},
		outcome: Preempt, node: "n1", victims: []string{"batch-7"},
	}, {
		name: "the lowest priority first, however late the others started", nodes: []occtest.Node{dgx},
		running: append(wholeGPUs("batch-", 7, 100, 10), running{name: "scavenger", node: "n1", prio: 10, start: 0, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-7")}}),
		prio:    1000, reqs: []request{whole},
		outcome: Preempt, node: "n1", victims: []string{"scavenger"},
	}, {
		name: "equal priority: nothing", nodes: []occtest.Node{dgx},
		running: eight, prio: 100, reqs: []request{whole},
		outcome: NoCandidate,
	}, {
		name: "preemptionPolicy Never: nothing", nodes: []occtest.Node{dgx},
		running: eight, prio: 1000, never: true, reqs: []request{whole},
		outcome: Ineligible,
	}, {
		name: "a free GPU: fits, nothing evicted", nodes: []occtest.Node{dgx},
		running: eight[:7], prio: 1000, reqs: []request{whole},
		outcome: Fits, node: "n1",
	}, {
		name: "a pod terminating frees a GPU: wait", nodes: []occtest.Node{dgx},
		running: append(append([]running(nil), eight[:7]...), running{name: "leaving", node: "n1", prio: 100, start: 9, terminating: true, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-7")}}),
		prio:    1000, reqs: []request{whole},
		outcome: Wait, node: "n1",
	}, {
		name: "a claim whose pod is gone is being freed: fits, nothing evicted", nodes: []occtest.Node{dgx},
		running: eight, vanished: []string{"batch-3"}, prio: 1000, reqs: []request{whole},
		outcome: Fits, node: "n1",
	}, {
		name: "two claims of a GPU each: two victims on one node", nodes: []occtest.Node{dgx},
		running: eight, prio: 1000, reqs: []request{whole, whole},
		outcome: Preempt, node: "n1", victims: []string{"batch-7", "batch-6"},
	}, {
		name: "an eviction refused: the next one", nodes: []occtest.Node{dgx},
		running: eight, prio: 1000, reqs: []request{whole}, protected: []string{"batch-7"},
		outcome: Preempt, node: "n1", victims: []string{"batch-6"},
	}, {
		name: "every eviction refused: nothing", nodes: []occtest.Node{dgx},
		running: eight, prio: 1000, reqs: []request{whole},
		protected: []string{"batch-0", "batch-1", "batch-2", "batch-3", "batch-4", "batch-5", "batch-6", "batch-7"},
		outcome:   NoCandidate,
	}, {
		name: "a claim shared with a pod of higher priority is not freed", nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1}},
		running: []running{{name: "low", node: "n1", prio: 100, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0")}, sharedWith: "high"}, {name: "high", node: "n1", prio: 2000}},
		prio:    1000, reqs: []request{whole},
		outcome: NoCandidate,
	}, {
		name:  "1g.10gb (dynamic MIG): one MIG pod, not a whole GPU of lower priority",
		nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2, Modes: "0=mig"}},
		running: func() []running {
			var rs []running
			for i := range 7 {
				rs = append(rs, running{name: fmt.Sprint("mig-", i), node: "n1", prio: 200, start: i, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", fmt.Sprintf("gpu-0-mig-1g10gb-%d", i))}})
			}
			return append(rs, running{name: "whole", node: "n1", prio: 100, start: 10, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-1")}})
		}(),
		prio: 1000, reqs: []request{mig1g},
		outcome: Preempt, node: "n1", victims: []string{"mig-6"},
	}, {
		name:  "1g.10gb (static MIG, stock 1.35): one MIG pod, not a whole GPU of lower priority",
		nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2, Modes: "0=static-mig", Layout: "0=all-balanced"}}, stock: true,
		running: []running{
			{name: "mig-a", node: "n1", prio: 200, start: 0, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0-mig-1g10gb-3")}},
			{name: "mig-b", node: "n1", prio: 200, start: 1, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0-mig-1g10gb-2")}},
			{name: "whole", node: "n1", prio: 100, start: 2, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-1")}},
		},
		prio: 1000, reqs: []request{mig1g},
		outcome: Preempt, node: "n1", victims: []string{"mig-b"},
	}, {
		name:  "a share frees capacity: one of two shares, not both",
		nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=shared"}},
		running: []running{
			{name: "share-a", node: "n1", prio: 100, start: 0, results: []resourceapi.DeviceRequestAllocationResult{occtest.Share("n1", "gpu-0", "s1", "40Gi", 50)}},
			{name: "share-b", node: "n1", prio: 100, start: 1, results: []resourceapi.DeviceRequestAllocationResult{occtest.Share("n1", "gpu-0", "s2", "40Gi", 50)}},
		},
		prio: 1000, reqs: []request{{class: "vgpu.facet.dev", capacity: map[string]string{"memory": "20Gi", "cores": "20"}}},
		outcome: Preempt, node: "n1", victims: []string{"share-b"},
	}, {
		name:  "slots (stock 1.35): the one slot the request needs",
		nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=slots", Slots: "0=2"}}, stock: true,
		running: []running{
			{name: "slot-a", node: "n1", prio: 100, start: 0, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0-slot-0")}},
			{name: "slot-b", node: "n1", prio: 50, start: 1, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0-slot-1")}},
		},
		prio: 1000, reqs: []request{{class: "vgpu-slot.facet.dev"}},
		outcome: Preempt, node: "n1", victims: []string{"slot-b"},
	}, {
		name:  "two nodes: the one whose victims matter least",
		nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1}, {Name: "n2", Model: "H100-SXM5-80GB", GPUs: 1}},
		running: []running{
			{name: "on-n1", node: "n1", prio: 300, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0")}},
			{name: "on-n2", node: "n2", prio: 200, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n2", "gpu-0")}},
		},
		prio: 1000, reqs: []request{whole},
		outcome: Preempt, node: "n2", victims: []string{"on-n2"},
	}, {
		name:  "a cordoned node is no candidate",
		nodes: []occtest.Node{dgx}, running: eight, prio: 1000, reqs: []request{whole},
		k8sNodes: []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: v1.NodeSpec{Unschedulable: true}}},
		outcome:  NoCandidate,
	}, {
		name:  "a node tainted NoSchedule is no candidate",
		nodes: []occtest.Node{dgx}, running: eight, prio: 1000, reqs: []request{whole},
		k8sNodes: []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "k", Effect: v1.TaintEffectNoSchedule}}}}},
		outcome:  NoCandidate,
	}, {
		name:  "an admitting node is a candidate",
		nodes: []occtest.Node{dgx}, running: eight, prio: 1000, reqs: []request{whole},
		k8sNodes: []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}},
		outcome:  Preempt, node: "n1", victims: []string{"batch-7"},
	}, {
		name: "a pod in kube-system is never a victim: the next one", nodes: []occtest.Node{dgx},
		running: withPod(eight, 7, func(r *running) { r.ns = "kube-system" }), prio: 1000, reqs: []request{whole},
		outcome: Preempt, node: "n1", victims: []string{"batch-6"},
	}, {
		name: "a pod in a protected namespace is never a victim", nodes: []occtest.Node{dgx}, protectNS: []string{"infra"},
		running: withPod(eight, 7, func(r *running) { r.ns = "infra" }), prio: 1000, reqs: []request{whole},
		outcome: Preempt, node: "n1", victims: []string{"batch-6"},
	}, {
		name: "a DaemonSet's pod is never a victim", nodes: []occtest.Node{dgx},
		running: withPod(eight, 7, func(r *running) { r.daemonSet = true }), prio: 1000, reqs: []request{whole},
		outcome: Preempt, node: "n1", victims: []string{"batch-6"},
	}, {
		name: "a static pod is never a victim", nodes: []occtest.Node{dgx},
		running: withPod(eight, 7, func(r *running) { r.mirror = true }), prio: 1000, reqs: []request{whole},
		outcome: Preempt, node: "n1", victims: []string{"batch-6"},
	}, {
		name:  "a node whose only victims are protected is no candidate: the other node",
		nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1}, {Name: "n2", Model: "H100-SXM5-80GB", GPUs: 1}},
		running: []running{
			{name: "agent", node: "n1", prio: 10, ns: "kube-system", results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0")}},
			{name: "on-n2", node: "n2", prio: 500, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n2", "gpu-0")}},
		},
		prio: 1000, reqs: []request{whole},
		outcome: Preempt, node: "n2", victims: []string{"on-n2"},
	}, {
		name:  "only protected pods would make room: nothing, and why says so",
		nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2}}, protectNS: []string{"facet"},
		running: []running{
			{name: "ds", node: "n1", prio: 10, daemonSet: true, results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0")}},
			{name: "own", node: "n1", prio: 20, ns: "facet", results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-1")}},
		},
		prio: 1000, reqs: []request{whole},
		outcome: NoCandidate, why: "are protected: ml/ds (owned by DaemonSet agent)",
	}, {
		name:  "protected pods that would not make room either are not blamed",
		nodes: []occtest.Node{{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2}},
		running: []running{
			{name: "sys", node: "n1", prio: 10, ns: "kube-system", results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-0")}},
			{name: "sys2", node: "n1", prio: 10, ns: "kube-system", results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "gpu-1")}},
		},
		prio: 1000, reqs: []request{whole, whole, whole},
		outcome: NoCandidate, why: "would not make room",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := Snapshot{Classes: classes(t), Features: fit.FeaturesOf(features.AllOn("test")), Protected: map[types.UID]bool{}, Nodes: tc.k8sNodes,
				Protection: Protection{Namespaces: map[string]bool{}}}
			for _, ns := range tc.protectNS {
				s.Protection.Namespaces[ns] = true
			}
			if tc.stock {
				s.Features = fit.FeaturesOf(features.Stock("test"))
			}
			for _, n := range tc.nodes {
				s.Slices = append(s.Slices, occtest.Slices(t, n)...)
			}
			for _, r := range tc.running {
				p, c := r.objects()
				if !slices.Contains(tc.vanished, r.name) {
					s.Pods = append(s.Pods, p)
				}
				s.Claims = append(s.Claims, c)
			}
			pod, claims := preemptor(tc.prio, tc.reqs...)
			if tc.never {
				pod.Spec.PreemptionPolicy = ptr.To(v1.PreemptNever)
			}
			s.Claims = append(s.Claims, claims...)
			for _, p := range tc.protected {
				s.Protected[uid(p)] = true
			}
			d, err := Decide(context.Background(), s, pod)
			if err != nil {
				t.Fatal(err)
			}
			var victims []string
			for _, v := range d.Victims {
				victims = append(victims, v.Name)
			}
			if d.Outcome != tc.outcome || d.Node != tc.node || strings.Join(victims, ",") != strings.Join(tc.victims, ",") {
				t.Errorf("got %s on %q evicting %v (%s), want %s on %q evicting %v", d.Outcome, d.Node, victims, d.Why, tc.outcome, tc.node, tc.victims)
			}
			if d.Why == "" || !strings.Contains(d.Why, tc.why) {
				t.Errorf("reason %q, want one with %q", d.Why, tc.why)
			}
			if d.Outcome == Preempt && len(d.Devices) != len(tc.reqs) {
				t.Errorf("devices %v, want one per request", d.Devices)
			}
		})
	}
}

func TestProtection(t *testing.T) {
	pr := Protection{Namespaces: map[string]bool{"facet": true}}
	pod := func(ns string, edit func(*v1.Pod)) *v1.Pod {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}
		if edit != nil {
			edit(p)
		}
		return p
	}
	owned := func(apiVersion, kind string, controller bool) func(*v1.Pod) {
		return func(p *v1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "o", Controller: ptr.To(controller)}}
		}
	}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		why  string // "": not protected
	}{
		{"kube-system, always", pod("kube-system", nil), "in namespace kube-system"},
		{"a configured namespace", pod("facet", nil), "in protected namespace facet"},
		{"another namespace", pod("ml", nil), ""},
		{"a static pod's mirror", pod("ml", func(p *v1.Pod) { p.Annotations = map[string]string{v1.MirrorPodAnnotationKey: "x"} }), "a static pod"},
		{"a DaemonSet's pod", pod("ml", owned("apps/v1", "DaemonSet", true)), "owned by DaemonSet o"},
		{"an Advanced DaemonSet's pod (OpenKruise)", pod("ml", owned("apps.kruise.io/v1alpha1", "DaemonSet", true)), "owned by DaemonSet o"},
		{"a DaemonSet that owns but does not control", pod("ml", owned("apps/v1", "DaemonSet", false)), ""},
		{"a ReplicaSet's pod", pod("ml", owned("apps/v1", "ReplicaSet", true)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pr.Why(tc.pod); got != tc.why {
				t.Errorf("Why %q, want %q", got, tc.why)
			}
		})
	}
}

func TestDecideIneligible(t *testing.T) {
	pod, claims := preemptor(1000, request{class: "gpu.facet.dev"})
	noClaims := pod.DeepCopy()
	noClaims.Spec.ResourceClaims, noClaims.Status.ResourceClaimStatuses = nil, nil
	allocated := claims[0].DeepCopy()
	allocated.Status.Allocation = &resourceapi.AllocationResult{}
	bound := pod.DeepCopy()
	bound.Spec.NodeName = "n1"
	for _, tc := range []struct {
		name   string
		pod    *v1.Pod
		claims []*resourceapi.ResourceClaim
		why    string
	}{
		{"claim not created yet", pod, nil, "do not exist yet"},
		{"no claims", noClaims, claims, "no ResourceClaims"},
		{"claim already allocated", pod, []*resourceapi.ResourceClaim{allocated}, "already allocated"},
		{"bound", bound, claims, "bound to node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Decide(context.Background(), Snapshot{Claims: tc.claims}, tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			if d.Outcome != Ineligible || !strings.Contains(d.Why, tc.why) {
				t.Errorf("got %s (%s), want Ineligible because %q", d.Outcome, d.Why, tc.why)
			}
		})
	}
}

// TestUnfit: where a pod's claims fit on no admitted node, Unfit gives
// fit's reasons per node (a GPU too small, every GPU held), bounded; where
// they fit, or there is nothing to ask about, nil.
func TestUnfit(t *testing.T) {
	dgx := occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 8}
	shared := occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2, Modes: "0-1=shared"}
	for _, tc := range []struct {
		name    string
		node    occtest.Node
		running []running
		reqs    []request
		want    []string // parts of the lines, in order; nil: no lines
		lines   int      // the number of lines, when want is set
	}{{
		name: "every GPU held", node: dgx, running: wholeGPUs("batch-", 8, 100, 0),
		reqs:  []request{{class: "gpu.facet.dev"}},
		want:  []string{"node n1: ml/urgent-c0 request gpu: none of the 8 matching device(s) is free", "gpu-0: whole GPU held by ml/batch-0-gpu", "gpu-4: whole GPU held by ml/batch-4-gpu"},
		lines: maxUnfitLines + 1,
	}, {
		name: "a share larger than any GPU", node: shared,
		reqs:  []request{{class: "vgpu.facet.dev", capacity: map[string]string{"memory": "200Gi", "cores": "10"}}},
		want:  []string{"node n1: ml/urgent-c0 request gpu: none of the 2 matching device(s) is large enough", "gpu-0: too small, 79.18Gi of memory in all, need 200Gi", "gpu-1: too small"},
		lines: 3,
	}, {
		name: "fits: nothing to say", node: dgx, running: wholeGPUs("batch-", 7, 100, 0),
		reqs: []request{{class: "gpu.facet.dev"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := Snapshot{Classes: classes(t), Features: fit.FeaturesOf(features.AllOn("test")), Slices: occtest.Slices(t, tc.node)}
			for _, r := range tc.running {
				p, c := r.objects()
				s.Pods, s.Claims = append(s.Pods, p), append(s.Claims, c)
			}
			pod, claims := preemptor(1000, tc.reqs...)
			s.Claims = append(s.Claims, claims...)
			got, err := Unfit(context.Background(), s, pod)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if got != nil {
					t.Fatalf("lines %q, want none", got)
				}
				return
			}
			if len(got) != tc.lines {
				t.Errorf("%d lines, want %d: %q", len(got), tc.lines, got)
			}
			all := strings.Join(got, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("lines lack %q:\n%s", w, all)
				}
			}
			if strings.Contains(all, "held by ()") {
				t.Errorf("an empty holder list:\n%s", all)
			}
		})
	}
}
