package helm

import (
	"fmt"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

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
		{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceslices", "deviceclasses"}, Verbs: []string{"get", "list", "watch"}},
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
