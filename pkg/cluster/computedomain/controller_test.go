package computedomain

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
)

const facetNS = "facet-system"

// world is a controller on client-go's fake clients, its informers
// started and synced; tests call Sync themselves, one step at a time.
type world struct {
	t      *testing.T
	ctx    context.Context
	kube   *fake.Clientset
	dyn    *dynamicfake.FakeDynamicClient
	events *record.FakeRecorder
	c      *Controller
}

func newWorld(t *testing.T, domains []*v1alpha1.ComputeDomain, objs ...runtime.Object) *world {
	t.Helper()
	var us []runtime.Object
	for _, cd := range domains {
		u, err := toUnstructured(cd.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		us = append(us, u)
	}
	w := &world{t: t, kube: fake.NewClientset(objs...), events: record.NewFakeRecorder(100),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{occupancy.ComputeDomains: "ComputeDomainList"}, us...)}
	tpl, err := LoadPodTemplate("testdata/imex-pod-template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.ctx = ctx
	w.c = New(Options{Client: w.kube, Dynamic: w.dyn, Recorder: w.events, Namespace: facetNS, PodTemplate: tpl, Resync: time.Minute})
	if !w.c.start(ctx) {
		t.Fatal("informers did not sync")
	}
	t.Cleanup(func() {
		cancel()
		w.c.shutdown()
	})
	return w
}

// sync reconciles the domain, failing the test on an error.
func (w *world) sync(name string) {
	w.t.Helper()
	if err := w.c.Sync(w.ctx, ns+"/"+name); err != nil {
		w.t.Fatalf("Sync %s: %v", name, err)
	}
}

// domain reads the domain from the fake API server.
func (w *world) domain(name string) *v1alpha1.ComputeDomain {
	w.t.Helper()
	u, err := w.dyn.Resource(occupancy.ComputeDomains).Namespace(ns).Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	cd, err := toDomain(u)
	if err != nil {
		w.t.Fatal(err)
	}
	return cd
}

// cached waits until the controller's informer holds the domain as the
// API server does (after a write of the controller's own). The fake
// clients keep no resourceVersion: the contents are compared.
func (w *world) cached(name string) {
	w.t.Helper()
	u, err := w.dyn.Resource(occupancy.ComputeDomains).Namespace(ns).Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	w.until("the informer to see ComputeDomain "+name+" as written", func() bool {
		o, ok, _ := w.c.domains.GetIndexer().GetByKey(ns + "/" + name)
		return ok && equality.Semantic.DeepEqual(o.(*unstructured.Unstructured).Object, u.Object)
	})
}

func (w *world) until(what string, cond func() bool) {
	w.t.Helper()
	if err := wait.PollUntilContextTimeout(w.ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		w.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// drained returns the Events raised so far, "Type Reason message".
func (w *world) drained() []string {
	var out []string
	for {
		select {
		case e := <-w.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// hasEvents checks that the events hold each want ("Type Reason part").
func hasEvents(t *testing.T, events []string, want ...string) {
	t.Helper()
	for _, wnt := range want {
		if !slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, wnt) || strings.Contains(e, wnt) }) {
			t.Errorf("no Event %q in\n%s", wnt, strings.Join(events, "\n"))
		}
	}
}

func (w *world) daemonSet(cd *v1alpha1.ComputeDomain) (*appsv1.DaemonSet, error) {
	return w.kube.AppsV1().DaemonSets(facetNS).Get(w.ctx, DaemonSetName(cd), metav1.GetOptions{})
}

func (w *world) template(name string) (*resourceapi.ResourceClaimTemplate, error) {
	return w.kube.ResourceV1().ResourceClaimTemplates(ns).Get(w.ctx, name, metav1.GetOptions{})
}

// rack is two cliques: clique 1 of nodes a1-a4, clique 2 of b1-b2.
func rack() []runtime.Object {
	var out []runtime.Object
	for _, n := range []string{"a1", "a2", "a3", "a4"} {
		out = append(out, channelSlice(n, 1))
	}
	for _, n := range []string{"b1", "b2"} {
		out = append(out, channelSlice(n, 2))
	}
	return out
}

// TestControllerCreates: a new domain gets the finalizer, its DaemonSet,
// its clique (the best fit) and its template, and a status that says so.
func TestControllerCreates(t *testing.T) {
	for _, tc := range []struct {
		name      string
		numNodes  int32
		objs      []runtime.Object
		clique    string // "" none
		fits      bool
		event     string
		selecting string // a part of the template's CEL; "" no template
	}{
		{name: "two nodes: the smaller clique fits best", numNodes: 2, objs: rack(),
			clique: fabric + ".2", fits: true, event: "Normal CliqueAssigned pinned to clique " + fabric + ".2", selecting: "fabricCliqueID == 2"},
		{name: "four nodes: only the larger one fits", numNodes: 4, objs: rack(),
			clique: fabric + ".1", fits: true, event: "Normal CliqueAssigned", selecting: "fabricCliqueID == 1"},
		{name: "five nodes: none fits; pinned to the one with the most", numNodes: 5, objs: rack(),
			clique: fabric + ".1", event: "Warning NoCliqueFits no clique has 5 IMEX channels available: the most, 4 of 4", selecting: "fabricCliqueID == 1"},
		{name: "no channel anywhere: no template", numNodes: 1,
			event: "Warning NoCliqueFits no node publishes an IMEX channel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, []*v1alpha1.ComputeDomain{domain("train", tc.numNodes)}, tc.objs...)
			w.sync("train")
			cd := w.domain("train")
			if !slices.Contains(cd.Finalizers, Finalizer) {
				t.Errorf("finalizers %v", cd.Finalizers)
			}
			if ds, err := w.daemonSet(cd); err != nil || ds.Spec.Template.Spec.NodeSelector[Label] != string(cd.UID) {
				t.Errorf("DaemonSet: %v %v", err, ds)
			}
			c := meta.FindStatusCondition(cd.Status.Conditions, v1alpha1.ConditionCliqueAssigned)
			if cd.Status.Clique != tc.clique || c == nil || (c.Status == metav1.ConditionTrue) != tc.fits {
				t.Errorf("clique %q, condition %+v; want %q, fits %t", cd.Status.Clique, c, tc.clique, tc.fits)
			}
			if cd.Status.Status != v1alpha1.ComputeDomainNotReady {
				t.Errorf("status %q, want NotReady: no daemon runs", cd.Status.Status)
			}
			tpl, err := w.template("train-channel")
			switch {
			case tc.selecting == "" && !apierrors.IsNotFound(err):
				t.Errorf("a template without a clique: %v %v", tpl, err)
			case tc.selecting != "" && err != nil:
				t.Fatal(err)
			case tc.selecting != "" && (!strings.Contains(tpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression, tc.selecting) || !OwnedBy(tpl, cd)):
				t.Errorf("template %+v", tpl)
			}
			hasEvents(t, w.drained(), tc.event)

			// A second look changes nothing and says nothing again.
			w.cached("train")
			writes := len(w.dyn.Actions())
			w.sync("train")
			if acts := w.dyn.Actions()[writes:]; len(acts) > 0 {
				t.Errorf("a second sync wrote the domain again: %v", acts)
			}
			if ev := w.drained(); len(ev) > 0 {
				t.Errorf("a second sync raised %v", ev)
			}
		})
	}
}

// TestControllerStatus: status.nodes and readiness from the labelled
// nodes and the daemon pods, and the Events of their changes, a daemon's
// restart among them.
func TestControllerStatus(t *testing.T) {
	cd := pinned(domain("train", 2), fabric+".1", true)
	cd.Finalizers = []string{Finalizer}
	uid := string(cd.UID)
	objs := append(rack(), node("a1", "10.0.0.1", uid), node("a2", "10.0.0.2", uid), node("a3", "10.0.0.3", ""),
		daemonPod(cd, "a1", true, 0), daemonPod(cd, "a2", false, 0))
	w := newWorld(t, []*v1alpha1.ComputeDomain{cd}, objs...)
	w.sync("train")
	got := w.domain("train")
	if e := entries(got.Status.Nodes); e != "0:a1:10.0.0.1:.1:Ready 1:a2:10.0.0.2:.1:NotReady" || got.Status.Status != v1alpha1.ComputeDomainNotReady {
		t.Errorf("status %s: %s", got.Status.Status, e)
	}
	hasEvents(t, w.drained(), "Normal NodeJoined node a1 joined the domain (index 0, 10.0.0.1)", "Normal NodeJoined node a2", "Normal DaemonReady IMEX daemon on node a1 is ready")

	// a2's daemon becomes ready: the domain is Ready.
	w.cached("train")
	ready := daemonPod(cd, "a2", true, 0)
	if _, err := w.kube.CoreV1().Pods(facetNS).UpdateStatus(w.ctx, ready, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.until("the pod's readiness", func() bool { return DaemonReady(mustPods(w), "a2") })
	w.sync("train")
	if got := w.domain("train"); got.Status.Status != v1alpha1.ComputeDomainReady || !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionDaemonsReady) {
		t.Errorf("status %s, conditions %v", got.Status.Status, got.Status.Conditions)
	}
	hasEvents(t, w.drained(), "Normal DaemonReady IMEX daemon on node a2 is ready", "Normal DomainReady 2 of 2")

	// a1's daemon crashes and restarts; then a2 is lost.
	w.cached("train")
	crashed := daemonPod(cd, "a1", false, 1)
	if _, err := w.kube.CoreV1().Pods(facetNS).UpdateStatus(w.ctx, crashed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.until("the pod's restart", func() bool { return !DaemonReady(mustPods(w), "a1") })
	w.sync("train")
	hasEvents(t, w.drained(), "Warning DaemonNotReady IMEX daemon on node a1 is not ready", "Warning DaemonRestarted IMEX daemon on node a1 restarted (1 restarts); it ended with exit code 1 (Error)", "Warning DomainNotReady")
	w.cached("train")
	if err := w.kube.CoreV1().Nodes().Delete(w.ctx, "a2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.until("the node's deletion", func() bool { _, err := w.c.nodes.Get("a2"); return apierrors.IsNotFound(err) })
	w.sync("train")
	if e := entries(w.domain("train").Status.Nodes); e != "0:a1:10.0.0.1:.1:NotReady" {
		t.Errorf("after a2 is lost: %s", e)
	}
	hasEvents(t, w.drained(), "Warning NodeLost node a2 is gone")
}

func mustPods(w *world) []*corev1.Pod {
	pods, err := w.c.pods.Pods(facetNS).List(labels.Everything())
	if err != nil {
		w.t.Fatal(err)
	}
	return pods
}

// TestControllerFinalize: a deleted domain loses its template at once,
// keeps its DaemonSet and finalizer while a pod holds a channel or a node
// is still labelled, then both go.
func TestControllerFinalize(t *testing.T) {
	base := pinned(domain("train", 2), fabric+".1", true)
	base.Finalizers = []string{Finalizer, "example.com/other"}
	now := metav1.Now()
	base.DeletionTimestamp = &now
	uid := string(base.UID)
	tpl, err := Template(base, clique(1, 4, 4))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := DaemonSet(base, mustTemplate(t), facetNS)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		objs     []runtime.Object
		torn     bool
		waitsFor string
	}{
		{name: "a pod runs", objs: []runtime.Object{channelClaim(base, "w0", "a1", "worker-0"), node("a1", "10.0.0.1", uid)},
			waitsFor: "1 pod(s) hold its IMEX channels (ml/worker-0), and while the kubelet plugin of 1 node(s) has not unprepared its channel yet (a1)"},
		{name: "the pod ended, the node not unprepared yet", objs: []runtime.Object{channelClaim(base, "w0", "a1", ""), node("a1", "10.0.0.1", uid)},
			waitsFor: "the kubelet plugin of 1 node(s) has not unprepared its channel yet (a1)"},
		{name: "nothing holds it", objs: []runtime.Object{channelClaim(base, "w0", "", ""), node("a1", "10.0.0.1", "")}, torn: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, []*v1alpha1.ComputeDomain{base}, append(tc.objs, tpl.DeepCopy(), ds.DeepCopy())...)
			w.sync("train")
			if _, err := w.template("train-channel"); !apierrors.IsNotFound(err) {
				t.Errorf("the template of a deleted domain must go at once: %v", err)
			}
			cd := w.domain("train")
			_, dsErr := w.daemonSet(cd)
			events := w.drained()
			if tc.torn {
				if !apierrors.IsNotFound(dsErr) || slices.Contains(cd.Finalizers, Finalizer) || !slices.Contains(cd.Finalizers, "example.com/other") {
					t.Errorf("not torn down: DaemonSet %v, finalizers %v", dsErr, cd.Finalizers)
				}
				hasEvents(t, events, "Normal TornDown no pod holds the domain's channels: DaemonSet facet-system/imex-uid-train and ResourceClaimTemplate train-channel deleted")
				return
			}
			if dsErr != nil || !slices.Contains(cd.Finalizers, Finalizer) {
				t.Errorf("torn down while held: DaemonSet %v, finalizers %v", dsErr, cd.Finalizers)
			}
			hasEvents(t, events, "Normal WaitingForPods deleted: its IMEX daemons stay while "+tc.waitsFor)
			// The peer list stays current while it waits.
			if e := entries(cd.Status.Nodes); !strings.Contains(e, "a1:10.0.0.1") {
				t.Errorf("status.nodes while waiting: %s", e)
			}
			// Said once.
			w.cached("train")
			w.sync("train")
			if ev := w.drained(); len(ev) > 0 {
				t.Errorf("said again: %v", ev)
			}
		})
	}
}

func mustTemplate(t *testing.T) *corev1.PodTemplateSpec {
	t.Helper()
	tpl, err := LoadPodTemplate("testdata/imex-pod-template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

// TestControllerReplace: a domain that fits no clique is placed again
// while no claim of it exists, its template replaced; once a claim of it
// exists it stays where it is. A template that is not the domain's is
// never touched.
func TestControllerReplace(t *testing.T) {
	stuck := pinned(domain("train", 3), fabric+".2", false)
	stuck.Finalizers = []string{Finalizer}
	old, err := Template(stuck, clique(2, 2, 2))
	if err != nil {
		t.Fatal(err)
	}
	t.Run("no claim yet: moves to the clique that fits now", func(t *testing.T) {
		w := newWorld(t, []*v1alpha1.ComputeDomain{stuck}, append(rack(), old.DeepCopy())...)
		w.sync("train")
		cd := w.domain("train")
		tpl, err := w.template("train-channel")
		if err != nil || cd.Status.Clique != fabric+".1" || !strings.Contains(tpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression, "fabricCliqueID == 1") {
			t.Errorf("clique %s, template %v %v", cd.Status.Clique, tpl, err)
		}
		hasEvents(t, w.drained(), "Normal CliqueAssigned")
	})
	t.Run("a claim exists: stays", func(t *testing.T) {
		w := newWorld(t, []*v1alpha1.ComputeDomain{stuck}, append(rack(), old.DeepCopy(), channelClaim(stuck, "w0", "", ""))...)
		w.sync("train")
		cd := w.domain("train")
		tpl, err := w.template("train-channel")
		if err != nil || cd.Status.Clique != fabric+".2" || !strings.Contains(tpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression, "fabricCliqueID == 2") {
			t.Errorf("clique %s, template %v %v", cd.Status.Clique, tpl, err)
		}
	})
	t.Run("another's template of that name", func(t *testing.T) {
		theirs := old.DeepCopy()
		theirs.OwnerReferences, theirs.Labels = nil, nil
		w := newWorld(t, []*v1alpha1.ComputeDomain{domain("train", 2)}, append(rack(), theirs)...)
		w.sync("train")
		cd := w.domain("train")
		c := meta.FindStatusCondition(cd.Status.Conditions, v1alpha1.ConditionCliqueAssigned)
		if c == nil || c.Reason != CondConflict {
			t.Errorf("condition %+v", c)
		}
		if tpl, err := w.template("train-channel"); err != nil || len(tpl.OwnerReferences) != 0 {
			t.Errorf("their template was touched: %v %v", tpl, err)
		}
		hasEvents(t, w.drained(), "Warning TemplateConflict ResourceClaimTemplate ml/train-channel exists and is not this domain's")
		// Said once, not flipping between a fit and the conflict.
		w.cached("train")
		w.sync("train")
		if ev := w.drained(); len(ev) > 0 {
			t.Errorf("said again: %v", ev)
		}
		// Theirs goes: the domain's is written, and the condition says so.
		if err := w.kube.ResourceV1().ResourceClaimTemplates(ns).Delete(w.ctx, "train-channel", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.sync("train")
		tpl, err := w.template("train-channel")
		if err != nil || !OwnedBy(tpl, w.domain("train")) || !meta.IsStatusConditionTrue(w.domain("train").Status.Conditions, v1alpha1.ConditionCliqueAssigned) {
			t.Errorf("after theirs went: template %v %v, conditions %v", tpl, err, w.domain("train").Status.Conditions)
		}
		hasEvents(t, w.drained(), "Normal CliqueAssigned")
	})
	t.Run("reservations: a second domain does not take what the first still needs", func(t *testing.T) {
		first := pinned(domain("first", 2), fabric+".2", true)
		first.Finalizers = []string{Finalizer}
		w := newWorld(t, []*v1alpha1.ComputeDomain{first, domain("second", 2)}, rack()...)
		w.sync("second")
		if got := w.domain("second").Status.Clique; got != fabric+".1" {
			t.Errorf("second pinned to %s, want %s.1: clique 2's two channels are first's", got, fabric)
		}
	})
}

// TestControllerInvalidSpec: a spec the CRD should have refused is said,
// and nothing is made for it.
func TestControllerInvalidSpec(t *testing.T) {
	w := newWorld(t, []*v1alpha1.ComputeDomain{domain("train", 0)}, rack()...)
	w.sync("train")
	cd := w.domain("train")
	c := meta.FindStatusCondition(cd.Status.Conditions, v1alpha1.ConditionCliqueAssigned)
	if c == nil || c.Reason != CondInvalidSpec || !strings.Contains(c.Message, "spec.numNodes") {
		t.Errorf("condition %+v", c)
	}
	if _, err := w.daemonSet(cd); !apierrors.IsNotFound(err) {
		t.Errorf("a DaemonSet for an invalid domain: %v", err)
	}
	hasEvents(t, w.drained(), "Warning InvalidSpec spec.numNodes: Invalid value: 0")
}

// TestSweep: the DaemonSets and templates of domains that are gone are
// deleted; those of live domains stay.
func TestSweep(t *testing.T) {
	live, gone := domain("live", 1), domain("gone", 1)
	var objs []runtime.Object
	for _, cd := range []*v1alpha1.ComputeDomain{live, gone} {
		ds, err := DaemonSet(cd, mustTemplate(t), facetNS)
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := Template(cd, clique(1, 1, 1))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, ds, tpl)
	}
	w := newWorld(t, []*v1alpha1.ComputeDomain{live}, objs...)
	w.c.Sweep(w.ctx)
	for _, tc := range []struct {
		cd   *v1alpha1.ComputeDomain
		want bool
	}{{live, true}, {gone, false}} {
		_, dsErr := w.daemonSet(tc.cd)
		_, tplErr := w.template(tc.cd.Spec.Channel.ResourceClaimTemplate.Name)
		if (dsErr == nil) != tc.want || (tplErr == nil) != tc.want {
			t.Errorf("%s: DaemonSet %v, template %v; want kept %t", tc.cd.Name, dsErr, tplErr, tc.want)
		}
	}
}

// TestControllerUpdatesDaemonSet: a new pod template (a chart upgrade)
// reaches the domain's DaemonSet.
func TestControllerUpdatesDaemonSet(t *testing.T) {
	cd := pinned(domain("train", 1), fabric+".1", true)
	cd.Finalizers = []string{Finalizer}
	old := mustTemplate(t)
	old.Spec.Containers[0].Image = "facet.local/facet:0.0.9"
	ds, err := DaemonSet(cd, old, facetNS)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, []*v1alpha1.ComputeDomain{cd}, append(rack(), ds)...)
	w.sync("train")
	got, err := w.daemonSet(cd)
	if err != nil || got.Spec.Template.Spec.Containers[0].Image != "facet.local/facet:0.1.0" || got.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("DaemonSet %v: %v", err, got)
	}
}
