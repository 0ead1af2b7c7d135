package helm

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// criticalClasses are the PriorityClasses GKE admits outside kube-system
// only into a namespace with a ResourceQuota scoped to them.
var criticalClasses = []string{"system-node-critical", "system-cluster-critical"}

// podSpecOf returns the pod template of a DaemonSet or a Deployment, or
// a Pod's spec (helm test's).
func podSpecOf(t testing.TB, o object) (corev1.PodSpec, bool) {
	t.Helper()
	path := []string{"spec", "template", "spec"}
	switch o.GetKind() {
	case "DaemonSet", "Deployment":
	case "Pod":
		path = []string{"spec"}
	default:
		return corev1.PodSpec{}, false
	}
	m, ok, err := unstructured.NestedMap(o.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s %s: no pod template: %v", o.GetKind(), o.GetName(), err)
	}
	var spec corev1.PodSpec
	into(t, object{&unstructured.Unstructured{Object: m}, o.template}, &spec)
	return spec, true
}

// quotaCovers says whether a ResourceQuota's scopes admit a pod of class:
// a PriorityClass In scope that names it.
func quotaCovers(t testing.TB, o object, class string) bool {
	t.Helper()
	var q corev1.ResourceQuota
	into(t, o, &q)
	if q.Spec.ScopeSelector == nil {
		return false
	}
	for _, e := range q.Spec.ScopeSelector.MatchExpressions {
		if e.ScopeName == corev1.ResourceQuotaScopePriorityClass && e.Operator == corev1.ScopeSelectorOpIn && slices.Contains(e.Values, class) {
			return true
		}
	}
	return false
}

// TestCriticalPodsQuota: outside kube-system, every pod of the chart whose
// PriorityClass is system-node-critical or system-cluster-critical has a
// ResourceQuota in its namespace scoped to its class, as GKE requires; none
// is rendered where no pod needs it, in kube-system, or when turned off.
func TestCriticalPodsQuota(t *testing.T) {
	for _, tc := range []struct {
		name, values, namespace string
		wantQuota               bool
		wantPods                string
	}{
		{name: "defaults", namespace: releaseNamespace, wantQuota: true, wantPods: "1G"},
		{name: "in kube-system", namespace: "kube-system"},
		{name: "turned off", values: "criticalPodsQuota: {enabled: false}", namespace: releaseNamespace},
		{name: "no critical pod", values: "kubeletPlugin: {priorityClassName: \"\"}\nadmission: {webhook: {priorityClassName: \"\"}}\npreemptor: {priorityClassName: \"\"}", namespace: releaseNamespace},
		{
			name:      "only the preemptor and the webhook are critical",
			values:    "kubeletPlugin: {priorityClassName: \"\"}\npreemptor: {enabled: true, priorityClassName: system-cluster-critical}\nadmission: {webhook: {priorityClassName: system-cluster-critical}}\ncriticalPodsQuota: {pods: 5000}",
			namespace: releaseNamespace, wantQuota: true, wantPods: "5000",
		},
		{name: "a large integer", values: "criticalPodsQuota: {pods: 1000000000}", namespace: releaseNamespace, wantQuota: true, wantPods: "1000000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderAs(t, values(t, tc.values), releaseName, tc.namespace)
			quotas := ofKind(objs, "ResourceQuota")
			if got := len(quotas) > 0; got != tc.wantQuota {
				t.Fatalf("ResourceQuota rendered: %v, want %v", got, tc.wantQuota)
			}
			if !tc.wantQuota {
				return
			}
			var q corev1.ResourceQuota
			into(t, quotas[0], &q)
			if got, _, _ := unstructured.NestedStringMap(quotas[0].Object, "spec", "hard"); len(got) != 1 || got["pods"] != tc.wantPods {
				t.Errorf("hard %v, want pods: %q only", got, tc.wantPods)
			}
			for _, c := range criticalClasses {
				if !quotaCovers(t, quotas[0], c) {
					t.Errorf("the quota's scopes %+v do not cover %s", q.Spec.ScopeSelector, c)
				}
			}
		})
	}

	for cfgName, vals := range configurations(t) {
		objs := podObjects(t, render(t, vals))
		for _, o := range objs {
			spec, ok := podSpecOf(t, o)
			if !ok || !slices.Contains(criticalClasses, spec.PriorityClassName) {
				continue
			}
			covered := false
			for _, q := range ofKind(objs, "ResourceQuota") {
				if q.GetNamespace() == o.GetNamespace() && quotaCovers(t, q, spec.PriorityClassName) {
					covered = true
				}
			}
			if !covered {
				t.Errorf("%s: %s %s has priority class %s and no ResourceQuota admits it outside kube-system", cfgName, o.GetKind(), o.GetName(), spec.PriorityClassName)
			}
		}
	}
}

// TestPriorityClasses: every pod of the chart has a priority that keeps it
// from being evicted for the workloads it serves: the node's plugin,
// facet-mps and hami-core (which installs the library every enforced vGPU
// share needs) system-node-critical, the webhook (which claims with a Facet
// config wait on) and the preemptor system-cluster-critical; and the
// critical-pods quota covers them all.
func TestPriorityClasses(t *testing.T) {
	objs := podObjects(t, render(t, values(t, "preemptor: {enabled: true}")))
	// helm test's node check runs on demand, and is not to outrank
	// workloads.
	want := map[string]string{"kubelet-plugin": "system-node-critical", "mps": "system-node-critical", "hami-core": "system-node-critical", "webhook": "system-cluster-critical", "preemptor": "system-cluster-critical", "node-check": "",
		"controller": "system-cluster-critical", "imex": "system-node-critical"}
	seen := map[string]bool{}
	for _, o := range objs {
		spec, ok := podSpecOf(t, o)
		if !ok {
			continue
		}
		component := o.GetLabels()["app.kubernetes.io/component"]
		w, known := want[component]
		if !known {
			t.Errorf("%s/%s (component %q) has no priority decided here", o.GetKind(), o.GetName(), component)
			continue
		}
		seen[component] = true
		if spec.PriorityClassName != w {
			t.Errorf("%s/%s: priorityClassName %q, want %s", o.GetKind(), o.GetName(), spec.PriorityClassName, w)
		}
		if w != "" && !quotaCovers(t, find(t, objs, "ResourceQuota", releaseName+"-critical-pods"), w) {
			t.Errorf("the critical-pods quota does not cover %s", w)
		}
	}
	for c := range want {
		if !seen[c] {
			t.Errorf("no pod of component %s rendered", c)
		}
	}
}

// oneShot are the containers whose work is bounded (a copy, or a pause),
// by pod component: they have a memory limit. The daemons have none: an
// OOM kill of the plugin mid-prepare costs a retry, of facet-mps the
// node's MPS daemons.
var oneShot = map[string]map[string]bool{
	"kubelet-plugin": {"install-nvidia-cdi-hook": true},
	"node-check":     {"node-check": true},
	"hami-core":      {"stage-installer": true, "install-hami-core": true, "hold": true},
}

// TestResourceRequests: every container of every pod the chart runs, init
// containers included, asks for CPU and memory (measured defaults,
// values.yaml), so that no pod is BestEffort, the first evicted under node
// pressure; the daemons have no memory limit by default, and the one-shot
// containers one no lower than their request. No container has a CPU
// limit, which would only slow it.
func TestResourceRequests(t *testing.T) {
	seen := map[string]bool{}
	for cfgName, vals := range configurations(t) {
		for _, o := range podObjects(t, render(t, vals)) {
			spec, ok := podSpecOf(t, o)
			if !ok {
				continue
			}
			component := o.GetLabels()["app.kubernetes.io/component"]
			for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
				seen[component+"/"+c.Name] = true
				req := c.Resources.Requests
				if req.Cpu().IsZero() || req.Memory().IsZero() {
					t.Errorf("%s: %s %s container %s requests %v: want cpu and memory", cfgName, o.GetKind(), o.GetName(), c.Name, req)
				}
				if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
					t.Errorf("%s: %s %s container %s has a CPU limit by default", cfgName, o.GetKind(), o.GetName(), c.Name)
				}
				limit, limited := c.Resources.Limits[corev1.ResourceMemory]
				switch {
				case oneShot[component][c.Name] && !limited:
					t.Errorf("%s: %s %s container %s has no memory limit; its work is bounded", cfgName, o.GetKind(), o.GetName(), c.Name)
				case oneShot[component][c.Name] && limit.Cmp(*req.Memory()) < 0:
					t.Errorf("%s: %s %s container %s: memory limit %s under its request %s", cfgName, o.GetKind(), o.GetName(), c.Name, limit.String(), req.Memory())
				case !oneShot[component][c.Name] && limited:
					t.Errorf("%s: %s %s container %s has a memory limit by default", cfgName, o.GetKind(), o.GetName(), c.Name)
				}
			}
		}
	}
	for component, names := range oneShot {
		for name := range names {
			if !seen[component+"/"+name] {
				t.Errorf("no container %s of component %s rendered: oneShot is stale", name, component)
			}
		}
	}
}
