package helm

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/preempt/controller"
)

const preemptorName = releaseName + "-preemptor"

// TestPreemptorOffByDefault: nothing of facet-preemptor renders unless it
// is enabled.
func TestPreemptorOffByDefault(t *testing.T) {
	for _, o := range render(t, values(t, "")) {
		if strings.Contains(o.GetName(), "preemptor") {
			t.Errorf("%s %s rendered with the defaults", o.GetKind(), o.GetName())
		}
	}
}

// preemptorConfig parses the preemptor container's args with the binary's
// own flags, and its POD_NAMESPACE as the downward API fills it, in the
// release namespace.
func preemptorConfig(t *testing.T, c corev1.Container) controller.Config {
	t.Helper()
	podNS := ""
	for _, e := range c.Env {
		if e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace" {
			podNS = releaseNamespace
		}
	}
	if podNS == "" {
		t.Errorf("no POD_NAMESPACE from metadata.namespace in %v", c.Env)
	}
	t.Setenv("POD_NAMESPACE", podNS)
	var cfg controller.Config
	testenv.ParseFlags(t, "facet-preemptor", cfg.AddFlags, c.Args)
	testenv.WantError(t, cfg.Complete(), "")
	return cfg
}

// TestPreemptorDefaults: the chart's defaults are the binary's brakes: a
// cap of 10 evictions a minute, evictions on, the release namespace
// protected.
func TestPreemptorDefaults(t *testing.T) {
	var d appsv1.Deployment
	into(t, find(t, render(t, values(t, "preemptor: {enabled: true}")), "Deployment", preemptorName), &d)
	cfg := preemptorConfig(t, d.Spec.Template.Spec.Containers[0])
	got := fmt.Sprintf("%d %t %v %s", cfg.MaxEvictionsPerMinute, cfg.ObserveOnly, cfg.ProtectedNamespaces, cfg.SchedulerPreempts)
	if want := fmt.Sprintf("10 false [%s] auto", releaseNamespace); got != want {
		t.Errorf("parsed args %q, want %q", got, want)
	}
}

// TestPreemptor checks the Deployment's command line against the binary's
// own flags, and that its RBAC is exactly what it uses.
func TestPreemptor(t *testing.T) {
	objs := render(t, values(t, `
preemptor:
  enabled: true
  schedulerPreemptsClaims: "false"
  featureGates: DRAPartitionableDevices=true
  preemptionTimeout: 90s
  maxEvictionsPerMinute: 4
  observeOnly: true
  protectedNamespaces: [monitoring, infra]
  priorityClassName: system-cluster-critical
`))
	var d appsv1.Deployment
	into(t, find(t, objs, "Deployment", preemptorName), &d)
	spec := d.Spec.Template.Spec
	if spec.ServiceAccountName != preemptorName || spec.PriorityClassName != "system-cluster-critical" || *d.Spec.Replicas != 2 {
		t.Errorf("service account %q, priority class %q, replicas %d", spec.ServiceAccountName, spec.PriorityClassName, *d.Spec.Replicas)
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the preemptor must not run as root")
	}
	c := spec.Containers[0]
	if strings.Join(c.Command, " ") != "facet-preemptor" {
		t.Errorf("command %v", c.Command)
	}
	// The args parse with the binary's flags, and mean what the values say.
	cfg := preemptorConfig(t, c)
	got := fmt.Sprintf("%t %s/%s %s %s %s %s %d %t %v", cfg.LeaderElect, cfg.LeaseNamespace, cfg.LeaseName, cfg.SchedulerPreempts, cfg.FeatureGates, cfg.Timeout, cfg.MetricsAddr,
		cfg.MaxEvictionsPerMinute, cfg.ObserveOnly, cfg.ProtectedNamespaces)
	want := fmt.Sprintf("true %s/%s false DRAPartitionableDevices=true 1m30s :8080 4 true [monitoring infra %s]", releaseNamespace, preemptorName, releaseNamespace)
	if got != want {
		t.Errorf("parsed args %q, want %q", got, want)
	}
	if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Error("no /healthz liveness probe")
	}

	var cr rbacv1.ClusterRole
	into(t, find(t, objs, "ClusterRole", preemptorName), &cr)
	gotRules := fmt.Sprint(cr.Rules)
	wantRules := fmt.Sprint([]rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceslices", "deviceclasses"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
	})
	if gotRules != wantRules {
		t.Errorf("ClusterRole rules\n%s\nwant\n%s", gotRules, wantRules)
	}
	var role rbacv1.Role
	into(t, find(t, objs, "Role", preemptorName), &role)
	gotRules = fmt.Sprint(role.Rules)
	wantRules = fmt.Sprint([]rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{preemptorName}, Verbs: []string{"get", "update"}},
	})
	if gotRules != wantRules || role.Namespace != releaseNamespace {
		t.Errorf("Role in %s, rules\n%s\nwant\n%s", role.Namespace, gotRules, wantRules)
	}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		var b rbacv1.RoleBinding // the fields compared are common to both
		into(t, find(t, objs, kind, preemptorName), &b)
		if b.RoleRef.Name != preemptorName || len(b.Subjects) != 1 || b.Subjects[0].Name != preemptorName || b.Subjects[0].Namespace != releaseNamespace {
			t.Errorf("%s: roleRef %v, subjects %v", kind, b.RoleRef, b.Subjects)
		}
	}
}

// TestPreemptorPolicies: the ValidatingAdmissionPolicies that confine the
// preemptor's service account are bound to it and agree with the binary:
// the namespaces they protect are the ones its flags protect (with
// kube-system), the label the pod check selects by is the one it sets, and
// every field of a pod's status but nominatedNodeName is compared.
func TestPreemptorPolicies(t *testing.T) {
	objs := render(t, values(t, "preemptor: {enabled: true, protectedNamespaces: [monitoring, infra]}"))
	var d appsv1.Deployment
	into(t, find(t, objs, "Deployment", preemptorName), &d)
	cfg := preemptorConfig(t, d.Spec.Template.Spec.Containers[0])
	user := "system:serviceaccount:" + releaseNamespace + ":" + d.Spec.Template.Spec.ServiceAccountName

	policies := map[string]*admissionregistrationv1.ValidatingAdmissionPolicy{}
	for _, o := range ofKind(objs, "ValidatingAdmissionPolicy") {
		if o.GetLabels()["app.kubernetes.io/component"] != "preemptor" {
			continue
		}
		p := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		into(t, o, p)
		policies[strings.TrimPrefix(p.Name, preemptorName+"-")] = p
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
			t.Errorf("%s: failurePolicy %v, want Fail", p.Name, p.Spec.FailurePolicy)
		}
		if len(p.Spec.MatchConditions) != 1 || p.Spec.MatchConditions[0].Expression != fmt.Sprintf("request.userInfo.username == %q", user) {
			t.Errorf("%s: matchConditions %v, want the preemptor's service account %s alone", p.Name, p.Spec.MatchConditions, user)
		}
		var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
		into(t, find(t, objs, "ValidatingAdmissionPolicyBinding", p.Name), &b)
		if b.Spec.PolicyName != p.Name || fmt.Sprint(b.Spec.ValidationActions) != "[Deny]" {
			t.Errorf("binding %s: policy %s, actions %v", b.Name, b.Spec.PolicyName, b.Spec.ValidationActions)
		}
	}
	if len(policies) != 3 {
		t.Fatalf("preemptor policies %v, want evictions, evicted-pods, pod-status", policies)
	}
	variable := func(p *admissionregistrationv1.ValidatingAdmissionPolicy, name string) string {
		for _, v := range p.Spec.Variables {
			if v.Name == name {
				return v.Expression
			}
		}
		t.Fatalf("%s: no variable %s", p.Name, name)
		return ""
	}

	// The namespaces: the binary's (the release namespace from
	// POD_NAMESPACE, and its flag) and kube-system, which it always
	// protects.
	var got []string
	if err := json.Unmarshal([]byte(variable(policies["evictions"], "protectedNamespaces")), &got); err != nil {
		t.Fatal(err)
	}
	want := append([]string{metav1.NamespaceSystem}, cfg.ProtectedNamespaces...)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the policy protects %v, the preemptor %v", got, want)
	}

	// The label: set by the binary, required by one policy, selected on by
	// the other's binding.
	label := fmt.Sprintf("object.metadata.?labels[?'%s'].orValue(\"\") == '%s'", controller.EvictionLabel, controller.EvictionLabelValue)
	if v := policies["evictions"].Spec.Validations; len(v) != 2 || v[1].Expression != label {
		t.Errorf("evictions: validations %v, want the second to be %s", v, label)
	}
	pods := policies["evicted-pods"]
	if k := pods.Spec.ParamKind; k == nil || k.APIVersion != "v1" || k.Kind != "Pod" {
		t.Errorf("evicted-pods: paramKind %v, want v1 Pod", k)
	}
	var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
	into(t, find(t, objs, "ValidatingAdmissionPolicyBinding", pods.Name), &b)
	if r := b.Spec.ParamRef; r == nil || r.Name != "" || r.Namespace != "" || r.Selector == nil || len(r.Selector.MatchLabels)+len(r.Selector.MatchExpressions) != 0 ||
		r.ParameterNotFoundAction == nil || *r.ParameterNotFoundAction != admissionregistrationv1.DenyAction {
		t.Errorf("evicted-pods binding: paramRef %+v, want every pod of the request's namespace, none found denied", r)
	}
	if m := b.Spec.MatchResources; m == nil || m.ObjectSelector == nil ||
		fmt.Sprint(m.ObjectSelector.MatchLabels) != fmt.Sprint(map[string]string{controller.EvictionLabel: controller.EvictionLabelValue}) {
		t.Errorf("evicted-pods binding: matchResources %+v, want the preemptor's label", m)
	}
	for _, p := range policies {
		for _, r := range p.Spec.MatchConstraints.ResourceRules {
			if want := map[string]string{"evictions": "pods/eviction CREATE", "evicted-pods": "pods/eviction CREATE", "pod-status": "pods/status UPDATE"}[strings.TrimPrefix(p.Name, preemptorName+"-")]; fmt.Sprint(strings.Join(r.Resources, ","), " ", r.Operations[0]) != want || len(r.Operations) != 1 {
				t.Errorf("%s: rule %v, want %s", p.Name, r, want)
			}
		}
	}

	// Every status field of this k8s.io/api but the nomination is
	// compared: a field added upstream fails here until it is.
	status := variable(policies["pod-status"], "statusChanged")
	ty := reflect.TypeFor[corev1.PodStatus]()
	for i := range ty.NumField() {
		name, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		compared := strings.Contains(status, fmt.Sprintf("object.status.?%s == oldObject.status.?%s ? [] : [%q]", name, name, name))
		if compared == (name == "nominatedNodeName") {
			t.Errorf("pod-status: status.%s compared: %v", name, compared)
		}
	}
}

var update = flag.Bool("update", false, "rewrite the golden files other packages' tests read")

// e2ePreemptorManifest is test/e2e's copy of the chart's preemptor
// identity: TestPreempt runs facet-preemptor with the service account,
// RBAC and policies the chart renders (for release facet in namespace
// facet-e2e-preemptor, preemptor.protectedNamespaces facet-e2e-guarded),
// since test/e2e's module does not carry Helm.
var e2ePreemptorManifest = filepath.Join(repoRoot, "test", "e2e", "testdata", "preemptor-chart.yaml")

// TestPreemptorE2EManifest: test/e2e's copy is this render; -update
// rewrites it.
func TestPreemptorE2EManifest(t *testing.T) {
	var objs []object
	for _, o := range renderAs(t, values(t, "preemptor: {enabled: true, protectedNamespaces: [facet-e2e-guarded]}"), "facet", "facet-e2e-preemptor") {
		if o.GetLabels()["app.kubernetes.io/component"] == "preemptor" && o.GetKind() != "Deployment" {
			objs = append(objs, o)
		}
	}
	want := "# Generated from deployments/helm/facet by test/helm's TestPreemptorE2EManifest\n" +
		"# (cd test/helm && go test -run TestPreemptorE2EManifest -update): facet-preemptor's\n" +
		"# service account, RBAC and policies for release facet in namespace facet-e2e-preemptor.\n" + stream(t, objs)
	if *update {
		if err := os.WriteFile(e2ePreemptorManifest, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(e2ePreemptorManifest)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from the chart's render: cd test/helm && go test -run TestPreemptorE2EManifest -update", e2ePreemptorManifest)
	}
}
