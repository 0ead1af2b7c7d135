package install

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
// chart's pod template; deleted, the domain takes both with it. Uninstall
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
%s`, r.tag, r.computeDomains()))
	vals["computeDomains"].(map[string]any)["controller"].(map[string]any)["resync"] = "2s"
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

	if err := dyn.Delete(ctx, "train", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the domain, its template and its DaemonSet gone", 2*time.Minute, func() (bool, error) {
		_, cdErr := dyn.Get(ctx, "train", metav1.GetOptions{})
		_, tplErr := r.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, "train-channel", metav1.GetOptions{})
		_, dsErr := r.Client.AppsV1().DaemonSets(chartNS).Get(ctx, "imex-"+uid, metav1.GetOptions{})
		return apierrors.IsNotFound(cdErr) && apierrors.IsNotFound(tplErr) && apierrors.IsNotFound(dsErr), fmt.Errorf("domain %v, template %v, DaemonSet %v", cdErr, tplErr, dsErr)
	})
	t.Logf("torn down (%s)", r.since())
	if out, err := r.Run("", "get", "crd", "computedomains.gpu.facet.dev", "-o", "jsonpath={.metadata.annotations.helm\\.sh/resource-policy}"); err != nil || strings.TrimSpace(out) != "keep" {
		t.Errorf("the CRD's resource policy: %q, %v", out, err)
	}
}
