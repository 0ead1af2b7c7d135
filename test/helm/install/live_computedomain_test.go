package install

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/computedomain"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
)

// computeDomainsGVR is the ComputeDomain CRD's resource.
var computeDomainsGVR = schema.GroupVersionResource{Group: "gpu.facet.dev", Version: "v1alpha1", Resource: "computedomains"}

// TestLiveChartComputeDomain installs the chart with facet-controller (and
// no plugin) and runs a ComputeDomain through it: the chart's CRD serves
// it, the controller, under the chart's service account and RBAC, pins it
// to the one clique (a hand-written channel slice: the node has no NVLink
// fabric), writes its template and makes its IMEX DaemonSet from the
// chart's pod template. The node labelled as the plugin labels it, the
// chart's IMEX pod (the stand-in, computeDomains.imex.simulate) runs
// there under the chart's RBAC, turns Ready, and the controller calls the
// domain Ready. Deleted, the domain waits for the label; with the label
// removed it takes its template, DaemonSet and pod with it. Uninstall
// keeps the CRD (helm.sh/resource-policy keep).
func TestLiveChartComputeDomain(t *testing.T) {
	r := newChartRig(t)
	ctx := context.Background()
	const ns = "facet-chart-cd"
	r.Namespace(t, ns)
	vals := values(t, fmt.Sprintf(`
image: {repository: facet.local/facet, tag: %q, pullPolicy: Never}
deviceClasses: {enabled: false}
kubeletPlugin:
  nodeGroups: {default: null}
admission:
  policies: {enabled: false}
  webhook: {enabled: false}
%s`, r.tag, r.computeDomains(t)))
	cd := vals["computeDomains"].(map[string]any)
	cd["controller"].(map[string]any)["resync"] = "2s"
	cd["imex"].(map[string]any)["simulate"] = true
	r.install(t, vals)

	slice := `apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: chart-compute-domain}
spec:
  driver: gpu.facet.dev
  nodeName: localhost
  pool: {name: chart-compute-domain, resourceSliceCount: 1}
  devices:
  - name: imex-channel
    attributes:
      type: {string: imex-channel}
      fabricClusterUUID: {string: c4a27e00-0000-4000-8000-000000000001}
      fabricCliqueID: {int: 7}
`
	r.Must(t, slice, "apply", "-f", "-")
	t.Cleanup(func() { _, _ = r.Run("", "delete", "resourceslice", "chart-compute-domain", "--ignore-not-found") })

	dyn := dynamic.NewForConfigOrDie(r.Config).Resource(computeDomainsGVR).Namespace(ns)
	r.Must(t, `apiVersion: gpu.facet.dev/v1alpha1
kind: ComputeDomain
metadata: {name: train, namespace: `+ns+`}
spec:
  numNodes: 1
  channel: {resourceClaimTemplate: {name: train-channel}}
`, "apply", "-f", "-")
	t.Cleanup(func() {
		_, _ = r.Run("", "delete", "computedomain", "-n", ns, "train", "--ignore-not-found", "--wait=true", "--timeout=60s")
	})

	var uid string
	testenv.WaitFor(t, "the chart's controller to pin the domain and make its template and DaemonSet", 3*time.Minute, func() (bool, error) {
		u, err := dyn.Get(ctx, "train", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		uid = string(u.GetUID())
		clique, _, _ := unstructured.NestedString(u.Object, "status", "clique")
		_, tplErr := r.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, "train-channel", metav1.GetOptions{})
		_, dsErr := r.Client.AppsV1().DaemonSets(chartNS).Get(ctx, "imex-"+uid, metav1.GetOptions{})
		logs, _ := r.Run("", "logs", "-n", chartNS, "-l", "app.kubernetes.io/component=controller", "--tail=20")
		return clique == "c4a27e00-0000-4000-8000-000000000001.7" && slices.Contains(u.GetFinalizers(), "gpu.facet.dev/compute-domain") && tplErr == nil && dsErr == nil,
			fmt.Errorf("clique %q, finalizers %v, template %v, DaemonSet %v; controller:\n%s", clique, u.GetFinalizers(), tplErr, dsErr, logs)
	})
	t.Logf("domain pinned, template and DaemonSet made (%s)", r.since())
	var ds *appsv1.DaemonSet
	ds, err := r.Client.AppsV1().DaemonSets(chartNS).Get(ctx, "imex-"+uid, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if spec.ServiceAccountName != chartRelease+"-imex" || !spec.HostNetwork || spec.NodeSelector["gpu.facet.dev/compute-domain"] != uid ||
		spec.Containers[0].Image != "facet.local/facet:"+r.tag || !slices.Contains(spec.Containers[0].Args, "--domain-uid="+uid) {
		t.Errorf("the DaemonSet is not the chart's pod template made the domain's: %+v", spec)
	}

	r.imexDaemonRuns(t, dyn, ns, uid)

	// Deleted, the domain waits for the node's label: the kubelet plugin
	// removes it when the node holds no prepared channel claim of the
	// domain any more (here there is none, and no plugin: the test
	// removes it), and only then do the daemons and the template go.
	if err := dyn.Delete(ctx, "train", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the deleted domain to wait for the labelled node", 2*time.Minute, func() (bool, error) {
		evs, err := r.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=train,reason=" + computedomain.ReasonWaitingForPods})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "has not unprepared its channel yet (localhost)") {
				return true, nil
			}
		}
		return false, fmt.Errorf("no %s Event naming localhost: %d Events", computedomain.ReasonWaitingForPods, len(evs.Items))
	})
	if _, err := r.Client.AppsV1().DaemonSets(chartNS).Get(ctx, "imex-"+uid, metav1.GetOptions{}); err != nil {
		t.Errorf("the DaemonSet of a deleted domain whose node is still labelled: %v", err)
	}
	unlabelled := time.Now()
	r.Must(t, "", "label", "node", "localhost", computedomain.Label+"-")
	testenv.WaitFor(t, "the domain, its template, its DaemonSet and its IMEX pod gone", 2*time.Minute, func() (bool, error) {
		_, cdErr := dyn.Get(ctx, "train", metav1.GetOptions{})
		_, tplErr := r.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, "train-channel", metav1.GetOptions{})
		_, dsErr := r.Client.AppsV1().DaemonSets(chartNS).Get(ctx, "imex-"+uid, metav1.GetOptions{})
		pods, err := r.Client.CoreV1().Pods(chartNS).List(ctx, metav1.ListOptions{LabelSelector: computedomain.Label + "=" + uid})
		if err != nil {
			return false, err
		}
		return apierrors.IsNotFound(cdErr) && apierrors.IsNotFound(tplErr) && apierrors.IsNotFound(dsErr) && len(pods.Items) == 0,
			fmt.Errorf("domain %v, template %v, DaemonSet %v, %d IMEX pods", cdErr, tplErr, dsErr, len(pods.Items))
	})
	t.Logf("label removed -> domain, template, DaemonSet and pod gone: %s", time.Since(unlabelled).Round(time.Millisecond))
	t.Logf("torn down (%s)", r.since())
	if out, err := r.Run("", "get", "crd", "computedomains.gpu.facet.dev", "-o", "jsonpath={.metadata.annotations.helm\\.sh/resource-policy}"); err != nil || strings.TrimSpace(out) != "keep" {
		t.Errorf("the CRD's resource policy: %q, %v", out, err)
	}
}

// imexDaemonRuns labels the local node with the domain's UID, as the
// kubelet plugin does at a channel's prepare, and waits for the chart's
// IMEX pod: made by the domain's DaemonSet on the node, run under the
// chart's -imex service account (its RBAC lets facet-imex watch the
// domain, its extraEnv lets the in-cluster config reach the API server
// from the host's network), Ready by the stand-in's verdict on the peer
// list, and for the controller to call the node's daemon and the domain
// Ready. It logs how long each step took; a pod that is not Ready is
// described, with its logs, in the test's output.
func (r *chartRig) imexDaemonRuns(t *testing.T, dyn dynamic.ResourceInterface, ns, uid string) {
	t.Helper()
	ctx := context.Background()
	sel := computedomain.Label + "=" + uid
	t.Cleanup(func() { _, _ = r.Run("", "label", "node", "localhost", computedomain.Label+"-") })
	r.explainPodsOnFailure(t, sel)
	labelled := time.Now()
	r.Must(t, "", "label", "node", "localhost", sel)

	var pod *corev1.Pod
	imexPod := func(ready bool) func() (bool, error) {
		return func() (bool, error) {
			pods, err := r.Client.CoreV1().Pods(chartNS).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil || len(pods.Items) != 1 {
				return false, fmt.Errorf("%d IMEX pods (%v)", len(pods.Items), err)
			}
			pod = &pods.Items[0]
			return !ready || computedomain.DaemonReady([]*corev1.Pod{pod}, "localhost"), fmt.Errorf("pod %s: phase %s, conditions %+v", pod.Name, pod.Status.Phase, pod.Status.Conditions)
		}
	}
	testenv.WaitFor(t, "the DaemonSet to make an IMEX pod on the labelled node", time.Minute, imexPod(false))
	createdSeen := time.Now()
	testenv.WaitFor(t, "the chart's IMEX pod to be Ready", 3*time.Minute, imexPod(true))
	readySeen := time.Now()
	if pod.Spec.ServiceAccountName != chartRelease+"-imex" || !pod.Spec.HostNetwork {
		t.Errorf("IMEX pod %s: service account %q, hostNetwork %t; want the chart's %s-imex, true", pod.Name, pod.Spec.ServiceAccountName, pod.Spec.HostNetwork, chartRelease)
	}
	var readyAt time.Time
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			readyAt = c.LastTransitionTime.Time
		}
	}
	t.Logf("IMEX pod %s: seen created %s after the label, seen Ready %s after that (polled every 250 ms); by its API timestamps (whole seconds) Ready %s after its creation",
		pod.Name, createdSeen.Sub(labelled).Round(time.Millisecond), readySeen.Sub(createdSeen).Round(time.Millisecond), readyAt.Sub(pod.CreationTimestamp.Time))

	testenv.WaitFor(t, "the controller to call the node's daemon and the domain Ready", 2*time.Minute, func() (bool, error) {
		u, err := dyn.Get(ctx, "train", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var cd v1alpha1.ComputeDomain
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cd); err != nil {
			return false, err
		}
		st := cd.Status
		cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDaemonsReady)
		ok := st.Status == v1alpha1.ComputeDomainReady && len(st.Nodes) == 1 && st.Nodes[0].Name == "localhost" &&
			st.Nodes[0].Status == v1alpha1.ComputeDomainReady && st.Nodes[0].Index == 0 && st.Nodes[0].IPAddress != "" &&
			cond != nil && cond.Status == metav1.ConditionTrue
		return ok, fmt.Errorf("status %q, nodes %+v, %s condition %+v", st.Status, st.Nodes, v1alpha1.ConditionDaemonsReady, cond)
	})
	t.Logf("domain Ready %s after the label, %s after its IMEX pod was seen Ready", time.Since(labelled).Round(time.Millisecond), time.Since(readySeen).Round(time.Millisecond))
}
