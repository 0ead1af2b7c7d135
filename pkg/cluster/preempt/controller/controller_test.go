package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/facet-gpu/facet/internal/occupancy/occtest"
	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/pkg/cluster/preempt"
	"github.com/facet-gpu/facet/pkg/model/features"
)

// cluster is a node n1 with two whole GPUs, each held by a pod of priority
// 100 (low-0 started before low-1), and a pending pod "urgent" of priority
// prio with one claim for a whole GPU, which the scheduler gave up on.
// edit, where given, changes the low pods.
func cluster(t *testing.T, prio int32, never bool, edit func(*v1.Pod)) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	for _, s := range occtest.Slices(t, occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 2}) {
		objs = append(objs, s)
	}
	_, classes, _, err := fit.ReadFile("../../../../deployments/deviceclasses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range classes {
		objs = append(objs, c)
	}
	objs = append(objs, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 2 {
		name := fmt.Sprint("low-", i)
		p := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID("uid-" + name)},
			Spec:       v1.PodSpec{NodeName: "n1", Priority: ptr.To[int32](100)},
			Status:     v1.PodStatus{Phase: v1.PodRunning, StartTime: ptr.To(metav1.NewTime(t0.Add(time.Duration(i) * time.Minute)))},
		}
		if edit != nil {
			edit(p)
		}
		c := occtest.Allocated(p.Namespace+"/"+name+"-gpu", occtest.Result("n1", fmt.Sprint("gpu-", i)))
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: p.UID}}
		objs = append(objs, p, c)
	}
	urgent := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "urgent", UID: "uid-urgent"},
		Spec: v1.PodSpec{
			Priority:       ptr.To(prio),
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("whole")}},
		},
		Status: v1.PodStatus{
			Phase:                 v1.PodPending,
			ResourceClaimStatuses: []v1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("urgent-gpu")}},
			Conditions: []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionFalse, Reason: v1.PodReasonUnschedulable,
				Message: "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."}},
		},
	}
	if never {
		urgent.Spec.PreemptionPolicy = ptr.To(v1.PreemptNever)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "urgent-gpu", UID: "uid-urgent-gpu"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.facet.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
	return append(objs, urgent, claim)
}

// secondClaim gives the urgent pod of cluster a second claim for a whole
// GPU.
func secondClaim(objs []runtime.Object) []runtime.Object {
	for _, o := range objs {
		if p, ok := o.(*v1.Pod); ok && p.Name == "urgent" {
			p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: "gpu2", ResourceClaimTemplateName: ptr.To("whole")})
			p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, v1.PodResourceClaimStatus{Name: "gpu2", ResourceClaimName: ptr.To("urgent-gpu2")})
		}
		if c, ok := o.(*resourceapi.ResourceClaim); ok && c.Name == "urgent-gpu" {
			c2 := c.DeepCopy()
			c2.Name, c2.UID = "urgent-gpu2", "uid-urgent-gpu2"
			objs = append(objs, c2)
			break
		}
	}
	return objs
}

// rival adds urgent-2, a copy of cluster's urgent pod with a claim of its
// own.
func rival(objs []runtime.Object) []runtime.Object {
	for _, o := range objs {
		if p, ok := o.(*v1.Pod); ok && p.Name == "urgent" {
			p2 := p.DeepCopy()
			p2.Name, p2.UID = "urgent-2", "uid-urgent-2"
			p2.Status.ResourceClaimStatuses[0].ResourceClaimName = ptr.To("urgent-2-gpu")
			objs = append(objs, p2)
			break
		}
	}
	for _, o := range objs {
		if c, ok := o.(*resourceapi.ResourceClaim); ok && c.Name == "urgent-gpu" {
			c2 := c.DeepCopy()
			c2.Name, c2.UID = "urgent-2-gpu", "uid-urgent-2-gpu"
			return append(objs, c2)
		}
	}
	return objs
}

// TestNodeFreed: the preemptors that waited for a node are looked at again
// as soon as its preemption ends, however it ends.
func TestNodeFreed(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(c *Controller)
	}{
		{"given up (lost, timed out)", func(c *Controller) { c.clearAttempt("uid-a") }},
		{"the preemptor scheduled", func(c *Controller) { c.forget("uid-a") }},
		{"the preemptor deleted", func(c *Controller) { c.forgetGone() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Options{Client: fake.NewClientset(), Resync: time.Hour})
			defer c.queue.ShutDown()
			c.attempts["uid-a"] = &attempt{key: "ml/a", node: "n1"}
			b := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "b", UID: "uid-b"}}
			if got := c.busy(b, "n1"); got != "ml/a" {
				t.Fatalf("busy: %q, want ml/a", got)
			}
			if got := c.busy(b, "n2"); got != "" {
				t.Fatalf("busy on another node: %q", got)
			}
			if n := c.queue.Len(); n != 0 {
				t.Fatalf("%d queued before the end", n)
			}
			tc.end(c)
			if n := c.queue.Len(); n != 1 {
				t.Fatalf("%d queued, want ml/b", n)
			}
			if k, _ := c.queue.Get(); k != "ml/b" {
				t.Errorf("queued %q, want ml/b", k)
			}
			if len(c.attempts) != 0 || len(c.waiting) != 0 {
				t.Errorf("left: attempts %v, waiting %v", c.attempts, c.waiting)
			}
		})
	}
}

// evictions records the Eviction API calls; pods in refuse get 429, as
// from a PodDisruptionBudget, those in forbid 403, as from an admission
// policy. An Eviction without the preemptor's label or the pod's UID as a
// precondition gets 403 too, as the chart's policy answers it.
type evictions struct {
	mu     sync.Mutex
	calls  []string // "dry low-1", "evict low-0"
	refuse map[string]bool
	forbid map[string]bool
}

func (e *evictions) react(a clienttesting.Action) (bool, runtime.Object, error) {
	ca, ok := a.(clienttesting.CreateAction)
	if !ok || a.GetSubresource() != "eviction" {
		return false, nil, nil
	}
	ev := ca.GetObject().(*policyv1.Eviction)
	e.mu.Lock()
	defer e.mu.Unlock()
	verb := "evict"
	if ev.DeleteOptions != nil && slices.Contains(ev.DeleteOptions.DryRun, metav1.DryRunAll) {
		verb = "dry"
	}
	e.calls = append(e.calls, verb+" "+ev.Name)
	gr := schema.GroupResource{Resource: "pods/eviction"}
	if ev.Labels[EvictionLabel] != EvictionLabelValue || ev.DeleteOptions == nil || ev.DeleteOptions.Preconditions == nil || ev.DeleteOptions.Preconditions.UID == nil {
		return true, nil, apierrors.NewForbidden(gr, ev.Name, fmt.Errorf("no label %s=%s or no UID precondition: %+v", EvictionLabel, EvictionLabelValue, ev))
	}
	if e.refuse[ev.Name] {
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	}
	if e.forbid[ev.Name] {
		return true, nil, apierrors.NewForbidden(gr, ev.Name, errors.New("ValidatingAdmissionPolicy 'facet-preemptor-evicted-pods' denied request"))
	}
	return true, nil, nil
}

func (e *evictions) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.calls...)
}

// TestController runs the loop against a fake API server: which evictions
// it asks for and which Events it raises.
func TestController(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prio   int32
		never  bool
		refuse []string
		forbid []string
		low    func(*v1.Pod) // changes the low pods
		// two: the urgent pod claims two GPUs.
		two bool
		// rival: a second pending pod like urgent, urgent-2.
		rival bool
		// observe: --observe-only.
		observe bool
		// cap is --max-evictions-per-minute; spent of it are used up
		// before the loop starts.
		cap, spent int
		// was is urgent's status.nominatedNodeName to begin with;
		// nominated what it must be once the Event is out.
		was, nominated string
		calls          []string // the Eviction API calls, in order
		event          string   // an Event it must raise
	}{{
		name: "the latest started is evicted, after a dry run", prio: 1000,
		calls: []string{"dry low-1", "evict low-1"}, event: "Normal FacetPreempting facet-preemptor evicted ml/low-1 (priority 100) on node n1",
		nominated: "n1",
	}, {
		name: "a PDB refuses one: the other", prio: 1000, refuse: []string{"low-1"},
		calls: []string{"dry low-1", "dry low-0", "evict low-0"}, event: "Normal FacetPreempting facet-preemptor evicted ml/low-0 (priority 100) on node n1",
		nominated: "n1",
	}, {
		name: "an admission policy refuses one: the other", prio: 1000, forbid: []string{"low-1"},
		calls: []string{"dry low-1", "dry low-0", "evict low-0"}, event: "Normal FacetPreempting facet-preemptor evicted ml/low-0 (priority 100) on node n1",
		nominated: "n1",
	}, {
		name: "an admission policy refuses both: nothing, an Event that names it", prio: 1000, forbid: []string{"low-0", "low-1"},
		calls: []string{"dry low-1", "dry low-0"}, event: "Warning FacetPreemptionBlocked facet-preemptor evicts nothing for this pod: the eviction of ml/low-1 (pods/eviction \"low-1\" is forbidden: ValidatingAdmissionPolicy 'facet-preemptor-evicted-pods' denied request)",
	}, {
		name: "a PDB refuses both: nothing, an Event", prio: 1000, refuse: []string{"low-0", "low-1"},
		calls: []string{"dry low-1", "dry low-0"}, event: "Warning FacetPreemptionBlocked facet-preemptor evicts nothing for this pod: the eviction of ml/low-1",
	}, {
		name: "equal priority: nothing", prio: 100,
		event: "Normal FacetNotPreempting facet-preemptor evicts nothing for this pod: evicting every pod of lower priority than 100",
	}, {
		name: "equal priority: and why its claims fit nowhere, on the pod", prio: 100,
		event: "Warning FacetUnallocatable no node can allocate this pod's ResourceClaims now: node n1: ml/urgent-gpu request gpu: none of the 2 matching device(s) is free; gpu-0: whole GPU held by ml/low-0",
	}, {
		name: "preemptionPolicy Never: nothing", prio: 1000, never: true,
		event: "Normal FacetNotPreempting facet-preemptor evicts nothing for this pod: its preemptionPolicy is Never",
	}, {
		name: "the only victims in kube-system: nothing, and the Event says they are protected", prio: 1000,
		low:   func(p *v1.Pod) { p.Namespace = "kube-system" },
		event: "Normal FacetNotPreempting facet-preemptor evicts nothing for this pod: the only pods of lower priority than 1000 whose eviction would make room are protected: kube-system/low-1 (in namespace kube-system)",
	}, {
		name: "one in the preemptor's own namespace: the other", prio: 1000,
		low: func(p *v1.Pod) {
			if p.Name == "low-1" {
				p.Namespace = "facet"
			}
		},
		calls: []string{"dry low-0", "evict low-0"}, event: "Normal FacetPreempting facet-preemptor evicted ml/low-0 (priority 100) on node n1",
		nominated: "n1",
	}, {
		name: "within the eviction budget: evicted", prio: 1000, two: true, cap: 3, spent: 1,
		calls: []string{"dry low-1", "dry low-0", "evict low-1", "evict low-0"}, event: "Normal FacetPreempting facet-preemptor evicted ml/low-1 (priority 100), ml/low-0 (priority 100) on node n1",
		nominated: "n1",
	}, {
		name: "the eviction budget spent: it waits, evicts nothing, not even one of two", prio: 1000, two: true, cap: 3, spent: 2,
		event: "Normal FacetPreemptionWaiting facet-preemptor waits to evict ml/low-1 (priority 100), ml/low-0 (priority 100) on node n1: the preemptor's eviction budget (--max-evictions-per-minute=3) has fewer than 2 left",
	}, {
		name: "more victims than the cap allows at once: nothing, an Event", prio: 1000, two: true, cap: 1,
		event: "Warning FacetNotPreempting facet-preemptor evicts nothing for this pod: it needs 2 evictions on node n1 (ml/low-1 (priority 100), ml/low-0 (priority 100)), more than --max-evictions-per-minute=1 allows at once",
	}, {
		name: "two preemptors for one node: one evicts, the other waits for it", prio: 1000, rival: true,
		calls:     []string{"dry low-1", "evict low-1"},
		event:     "Normal FacetPreemptionWaiting facet-preemptor waits: node n1, where this pod's claims would fit, has a preemption in flight for pod ml/urgent",
		nominated: "-",
	}, {
		name: "observe-only: the dry run and the Events, no eviction, no nomination", prio: 1000, observe: true, cap: 10,
		calls: []string{"dry low-1"},
		event: "Normal FacetPreempting facet-preemptor (observe-only) would evict ml/low-1 (priority 100) on node n1 so that this pod's ResourceClaims fit",
	}, {
		name: "observe-only: a PodDisruptionBudget refuses as it would", prio: 1000, observe: true, refuse: []string{"low-1"},
		calls: []string{"dry low-1", "dry low-0"},
		event: "Normal FacetPreempting facet-preemptor (observe-only) would evict ml/low-0 (priority 100) on node n1",
	}, {
		name: "observe-only: the eviction budget holds it back as it would", prio: 1000, observe: true, cap: 1, spent: 1,
		event: "Normal FacetPreemptionWaiting facet-preemptor waits to evict ml/low-1 (priority 100) on node n1",
	}, {
		name: "a nomination of the scheduler's is left alone", prio: 1000, was: "n9",
		calls: []string{"dry low-1", "evict low-1"}, event: "Normal FacetPreempting facet-preemptor evicted ml/low-1 (priority 100) on node n1",
		nominated: "n9",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := cluster(t, tc.prio, tc.never, tc.low)
			if tc.two {
				objs = secondClaim(objs)
			}
			if tc.rival {
				objs = rival(objs)
			}
			for _, o := range objs {
				if p, ok := o.(*v1.Pod); ok && p.Name == "urgent" {
					p.Status.NominatedNodeName = tc.was
				}
			}
			client := fake.NewClientset(objs...)
			ev := &evictions{refuse: map[string]bool{}, forbid: map[string]bool{}}
			for _, r := range tc.refuse {
				ev.refuse[r] = true
			}
			for _, r := range tc.forbid {
				ev.forbid[r] = true
			}
			client.PrependReactor("create", "pods", ev.react)
			recorder := record.NewFakeRecorder(100)
			metrics := NewMetrics()
			c := New(Options{
				Client: client, Recorder: recorder, Metrics: metrics, ObserveOnly: tc.observe, Features: fit.FeaturesOf(features.AllOn("test")),
				Protection: preempt.Protection{Namespaces: map[string]bool{"facet": true}},
				Timeout:    time.Minute, Backoff: time.Minute, MaxBackoff: time.Minute, Resync: time.Hour,
				MaxEvictionsPerMinute: tc.cap,
			})
			if !c.budget.take(time.Now(), tc.spent) {
				t.Fatalf("could not spend %d of the budget", tc.spent)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- c.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			})
			var events []string
			deadline := time.After(30 * time.Second)
			for !slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, tc.event) }) {
				select {
				case e := <-recorder.Events:
					events = append(events, e)
				case <-deadline:
					t.Fatalf("no Event %q in %q; evictions %v", tc.event, events, ev.list())
				}
			}
			// The decision is taken once the event is out: every
			// eviction call came before it.
			if got := ev.list(); strings.Join(got, ",") != strings.Join(tc.calls, ",") {
				t.Errorf("eviction calls %v, want %v", got, tc.calls)
			}
			if slices.ContainsFunc(tc.calls, func(c string) bool { return strings.HasPrefix(c, "evict ") }) && !tc.rival &&
				!slices.ContainsFunc(events, func(e string) bool {
					return strings.HasPrefix(e, "Normal FacetPreempted Preempted by facet-preemptor for pod ml/urgent (priority 1000) on node n1")
				}) {
				t.Errorf("no FacetPreempted Event on a victim in %q", events)
			}
			if tc.nominated != "-" {
				p, err := client.CoreV1().Pods("ml").Get(ctx, "urgent", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if p.Status.NominatedNodeName != tc.nominated {
					t.Errorf("nominatedNodeName %q, want %q", p.Status.NominatedNodeName, tc.nominated)
				}
			}
			if tc.observe && strings.Contains(tc.event, "would evict") {
				// The same decision at the next look is not raised
				// again.
				c.queue.Add("ml/urgent")
				time.Sleep(300 * time.Millisecond)
				for len(recorder.Events) > 0 {
					if e := <-recorder.Events; strings.Contains(e, "would") {
						t.Errorf("raised again: %q", e)
					}
				}
				for name, want := range map[string]float64{"observed_preemptions_total": 1, "observed_victims_total": 1, "preemptions_total": 0, "victims_total": 0} {
					if got := testutil.ToFloat64(map[string]prometheus.Collector{
						"observed_preemptions_total": metrics.wouldPreempt, "observed_victims_total": metrics.wouldEvict,
						"preemptions_total": metrics.preemptions, "victims_total": metrics.victims,
					}[name]); got != want {
						t.Errorf("facet_preemptor_%s %v, want %v", name, got, want)
					}
				}
				if got := ev.list(); strings.Join(got, ",") != strings.Join(tc.calls, ",") {
					t.Errorf("eviction calls after a second look %v, want %v", got, tc.calls)
				}
			}
			for _, a := range client.Actions() {
				if a.GetVerb() == "patch" && (a.GetResource().Resource != "pods" || a.GetSubresource() != "status") {
					t.Errorf("patched %s/%s: only the preemptor's pods/status may be", a.GetResource().Resource, a.GetSubresource())
				}
			}
		})
	}
}
