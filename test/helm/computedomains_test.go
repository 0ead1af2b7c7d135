package helm

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/computedomain"
)

const (
	controllerName  = releaseName + "-controller"
	imexName        = releaseName + "-imex"
	imexTemplateKey = "imex-pod-template.yaml"
)

// sampleDomain is the domain whose DaemonSet the tests build.
var sampleDomain = &v1alpha1.ComputeDomain{
	ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train", UID: "0b6f7b2e-3d1c-4f5a-9e8d-7c6b5a493827"},
	Spec:       v1alpha1.ComputeDomainSpec{NumNodes: 2, Channel: v1alpha1.ComputeDomainChannelSpec{ResourceClaimTemplate: v1alpha1.ComputeDomainResourceClaimTemplate{Name: "train-channel"}}},
}

// imexDaemonSet is the IMEX DaemonSet facet-controller makes for
// sampleDomain from the pod template the chart rendered (objs' ConfigMap),
// as an object of the chart: the chart deploys it through the
// controller. ok is false where the chart renders no pod template.
func imexDaemonSet(t testing.TB, objs []object) (object, bool) {
	t.Helper()
	for _, o := range ofKind(objs, "ConfigMap") {
		data, _, _ := unstructured.NestedString(o.Object, "data", imexTemplateKey)
		if data == "" {
			continue
		}
		tpl, err := computedomain.ParsePodTemplate([]byte(data), o.GetName())
		if err != nil {
			t.Fatal(err)
		}
		ds, err := computedomain.DaemonSet(sampleDomain, tpl, o.GetNamespace())
		if err != nil {
			t.Fatal(err)
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ds)
		if err != nil {
			t.Fatal(err)
		}
		return object{&unstructured.Unstructured{Object: m}, o.template + " (the DaemonSet facet-controller makes of it)"}, true
	}
	return object{}, false
}

// podObjects are objs and the IMEX DaemonSet facet-controller makes from
// them: every pod the chart runs, for the tests of pod specs.
func podObjects(t testing.TB, objs []object) []object {
	t.Helper()
	if ds, ok := imexDaemonSet(t, objs); ok {
		return append(append([]object(nil), objs...), ds)
	}
	return objs
}

// controllerConfig parses the controller container's args with the
// binary's own flags.
func controllerConfig(t *testing.T, c corev1.Container) computedomain.Config {
	t.Helper()
	t.Setenv("POD_NAMESPACE", "")
	var cfg computedomain.Config
	testenv.ParseFlags(t, "facet-controller", cfg.AddFlags, c.Args)
	testenv.WantError(t, cfg.Complete(), "")
	return cfg
}

// TestComputeDomainCRD: the CRD is rendered by default from the generated
// file, unchanged but for the release's labels and the keep policy, and
// not at all with crd.install=false; compute domains off leave the CRD.
func TestComputeDomainCRD(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "files", "crds", "gpu.facet.dev_computedomains.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	crd := find(t, render(t, values(t, "")), "CustomResourceDefinition", "computedomains.gpu.facet.dev")
	if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" || crd.GetLabels()["app.kubernetes.io/instance"] != releaseName {
		t.Errorf("annotations %v, labels %v", crd.GetAnnotations(), crd.GetLabels())
	}
	if !reflect.DeepEqual(crd.Object["spec"], want["spec"]) {
		t.Error("the rendered CRD's spec differs from files/crds/gpu.facet.dev_computedomains.yaml")
	}
	if got := ofKind(render(t, values(t, "computeDomains: {crd: {install: false}}")), "CustomResourceDefinition"); len(got) != 0 {
		t.Errorf("crd.install=false rendered %d CRDs", len(got))
	}
	off := render(t, values(t, "computeDomains: {enabled: false}"))
	if len(ofKind(off, "CustomResourceDefinition")) != 1 {
		t.Error("computeDomains.enabled=false must leave the CRD: the kubelet plugin reads ComputeDomains")
	}
	for _, o := range off {
		if c := o.GetLabels()["app.kubernetes.io/component"]; c == "controller" || c == "imex" {
			t.Errorf("computeDomains.enabled=false rendered %s %s", o.GetKind(), o.GetName())
		}
	}
}

// TestComputeDomainController: the Deployment's command line against the
// binary's own flags, its pod template ConfigMap mounted where the flag
// says and its checksum on the pod, and RBAC that is exactly what the
// controller and the IMEX daemons use.
func TestComputeDomainController(t *testing.T) {
	objs := render(t, values(t, "computeDomains: {controller: {replicas: 2, resync: 30s}}"))
	var d appsv1.Deployment
	into(t, find(t, objs, "Deployment", controllerName), &d)
	spec := d.Spec.Template.Spec
	if spec.ServiceAccountName != controllerName || *d.Spec.Replicas != 2 || spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil {
		t.Errorf("service account %q, replicas %d, affinity %v", spec.ServiceAccountName, *d.Spec.Replicas, spec.Affinity)
	}
	c := spec.Containers[0]
	if strings.Join(c.Command, " ") != "facet-controller" {
		t.Errorf("command %v", c.Command)
	}
	cfg := controllerConfig(t, c)
	got := fmt.Sprintf("%s %t %s/%s %s %s %s", cfg.Namespace, cfg.LeaderElect, cfg.LeaseNamespace, cfg.LeaseName, cfg.Resync, cfg.MetricsAddr, cfg.PodTemplate)
	want := fmt.Sprintf("%s true %s/%s 30s :8080 /etc/facet/%s", releaseNamespace, releaseNamespace, controllerName, imexTemplateKey)
	if got != want {
		t.Errorf("parsed args %q, want %q", got, want)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Error("no /healthz liveness probe")
	}
	// The flag's file is the ConfigMap's key, mounted.
	var cm corev1.ConfigMap
	into(t, find(t, objs, "ConfigMap", imexName+"-pod-template"), &cm)
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name && filepath.Join(m.MountPath, imexTemplateKey) == cfg.PodTemplate {
				mounted = true
			}
		}
	}
	if !mounted || cm.Data[imexTemplateKey] == "" {
		t.Errorf("--imex-pod-template %s is not the ConfigMap %s's key, mounted", cfg.PodTemplate, cm.Name)
	}
	if d.Spec.Template.Annotations["checksum/imex-pod-template"] == "" {
		t.Error("no checksum of the pod template on the controller's pods: a changed template would not restart it")
	}
	other := render(t, values(t, "computeDomains: {imex: {logVerbosity: 5}}"))
	var d2 appsv1.Deployment
	into(t, find(t, other, "Deployment", controllerName), &d2)
	if d2.Spec.Template.Annotations["checksum/imex-pod-template"] == d.Spec.Template.Annotations["checksum/imex-pod-template"] {
		t.Error("a changed pod template keeps the checksum")
	}

	rules := func(kind, name string) string {
		var r rbacv1.ClusterRole // Role has the same rules
		into(t, find(t, objs, kind, name), &r)
		return fmt.Sprint(r.Rules)
	}
	for _, tc := range []struct {
		kind, name string
		want       []rbacv1.PolicyRule
	}{
		{"ClusterRole", controllerName, []rbacv1.PolicyRule{
			{APIGroups: []string{"gpu.facet.dev"}, Resources: []string{"computedomains"}, Verbs: []string{"get", "list", "watch", "update"}},
			{APIGroups: []string{"gpu.facet.dev"}, Resources: []string{"computedomains/status", "computedomains/finalizers"}, Verbs: []string{"update"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaimtemplates"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceslices"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		}},
		{"Role", controllerName, []rbacv1.PolicyRule{
			{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{controllerName}, Verbs: []string{"get", "update"}},
		}},
		{"ClusterRole", imexName, []rbacv1.PolicyRule{
			{APIGroups: []string{"gpu.facet.dev"}, Resources: []string{"computedomains"}, Verbs: []string{"get", "list", "watch"}},
		}},
	} {
		if got, want := rules(tc.kind, tc.name), fmt.Sprint(tc.want); got != want {
			t.Errorf("%s %s rules\n%s\nwant\n%s", tc.kind, tc.name, got, want)
		}
	}
	for _, b := range []struct{ kind, name string }{{"ClusterRoleBinding", controllerName}, {"RoleBinding", controllerName}, {"ClusterRoleBinding", imexName}} {
		var rb rbacv1.RoleBinding
		into(t, find(t, objs, b.kind, b.name), &rb)
		if rb.RoleRef.Name != b.name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != b.name || rb.Subjects[0].Namespace != releaseNamespace {
			t.Errorf("%s %s: roleRef %v, subjects %v", b.kind, b.name, rb.RoleRef, rb.Subjects)
		}
	}
}

// TestIMEXDaemonSet: the DaemonSet facet-controller makes from the chart's
// pod template: Facet's image running facet-imex with the driver root
// mounted as facet-mps mounts it, in the host's network, under the IMEX
// service account, tolerating every taint the plugin tolerates, probed by
// `facet-imex probe` on the state directory it writes.
func TestIMEXDaemonSet(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		args         []string // the template's own args, before the domain's
		hostPath     string
		tolerations  []string // keys
		env          []string // NAME=value, NAME=<fieldPath> for a field
	}{
		{name: "defaults", args: []string{"--driver-root=/driver-root", "--state-dir=/run/facet-imex", "-v=2"}, hostPath: "/",
			tolerations: []string{"nvidia.com/gpu", "nvidia.com/gpu"}, env: []string{"NODE_NAME=<spec.nodeName>"}},
		{name: "GPU Operator driver, a node group's taint, the stand-in", values: `
kubeletPlugin:
  driver: {root: /run/nvidia/driver}
  nodeGroups:
    shared: {mode: shared, tolerations: [{key: example.com/shared, operator: Exists, effect: NoSchedule}]}
computeDomains:
  imex: {simulate: true, logVerbosity: 4, tolerations: [{key: example.com/rack, operator: Exists}]}
`, args: []string{"--driver-root=/host/run/nvidia/driver", "--host-root=/host", "--state-dir=/run/facet-imex", "--simulate", "-v=4"}, hostPath: "/",
			tolerations: []string{"nvidia.com/gpu", "nvidia.com/gpu", "example.com/shared", "example.com/rack"}, env: []string{"NODE_NAME=<spec.nodeName>"}},
		{name: "more environment, after NODE_NAME, as written", values: `
computeDomains:
  imex:
    extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
    - {name: KUBERNETES_SERVICE_PORT, value: "6443"}
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
`, args: []string{"--driver-root=/driver-root", "--state-dir=/run/facet-imex", "-v=2"}, hostPath: "/",
			tolerations: []string{"nvidia.com/gpu", "nvidia.com/gpu"},
			env:         []string{"NODE_NAME=<spec.nodeName>", "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443", "POD_IP=<status.podIP>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, values(t, tc.values))
			o, ok := imexDaemonSet(t, objs)
			if !ok {
				t.Fatal("no IMEX pod template rendered")
			}
			var ds appsv1.DaemonSet
			into(t, o, &ds)
			spec := ds.Spec.Template.Spec
			c := spec.Containers[0]
			wantArgs := append(slices.Clone(tc.args), "--domain-namespace=ml", "--domain-name=train", "--domain-uid="+string(sampleDomain.UID), "--node-name=$(NODE_NAME)")
			if c.Image != facetImage(t, values(t, tc.values)) || strings.Join(c.Command, " ") != "facet-imex" || !slices.Equal(c.Args, wantArgs) {
				t.Errorf("image %s, command %v, args\n%v\nwant\n%v", c.Image, c.Command, c.Args, wantArgs)
			}
			if !spec.HostNetwork || spec.ServiceAccountName != imexName || spec.NodeSelector[computedomain.Label] != string(sampleDomain.UID) || ds.Namespace != releaseNamespace {
				t.Errorf("hostNetwork %t, service account %s, nodeSelector %v, namespace %s", spec.HostNetwork, spec.ServiceAccountName, spec.NodeSelector, ds.Namespace)
			}
			var keys []string
			for _, tol := range spec.Tolerations {
				keys = append(keys, tol.Key)
			}
			if !slices.Equal(keys, tc.tolerations) {
				t.Errorf("tolerations %v, want %v", keys, tc.tolerations)
			}
			var env []string
			for _, e := range c.Env {
				v := e.Value
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
					v = "<" + e.ValueFrom.FieldRef.FieldPath + ">"
				}
				env = append(env, e.Name+"="+v)
			}
			if !slices.Equal(env, tc.env) {
				t.Errorf("env %v, want %v", env, tc.env)
			}
			if p := c.ReadinessProbe; p == nil || p.Exec == nil || strings.Join(p.Exec.Command, " ") != "facet-imex probe --state-dir=/run/facet-imex" {
				t.Errorf("readiness probe %+v", c.ReadinessProbe)
			}
			for _, v := range spec.Volumes {
				if v.Name == "driver-root" && (v.HostPath == nil || v.HostPath.Path != tc.hostPath) {
					t.Errorf("driver root volume %+v", v)
				}
			}
			if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
				t.Errorf("update strategy %s: a chart upgrade must not restart the daemons under running jobs", ds.Spec.UpdateStrategy.Type)
			}
		})
	}
}
