package helm

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestNodeCheckHook: `helm test`'s pod runs facetctl node-check-all over
// exactly the plugin's pods of this release (its selector matches every
// plugin DaemonSet's pods and no other pod of the chart), memory only
// unless tests.nodeCheck.computeSeconds says otherwise, as a ServiceAccount
// that may only list those pods and exec into them, in the release
// namespace; and none of it is rendered when turned off or without a
// plugin.
func TestNodeCheckHook(t *testing.T) {
	const name = releaseName + "-node-check"
	for _, tc := range []struct {
		name     string
		values   string
		rendered bool
		want     []string
	}{
		{name: "defaults", values: "", rendered: true,
			want: []string{"--seconds=0", "--share-memory=2000Mi", "--share-cores=20", "--parallel=4", "--timeout=10m", "--namespace=" + releaseNamespace}},
		{name: "compute, two node groups", rendered: true, values: `
tests: {nodeCheck: {computeSeconds: 10, parallel: 2}}
kubeletPlugin: {nodeGroups: {default: null, a100: {mode: mig}, h100: {mode: shared}}}`,
			want: []string{"--seconds=10", "--parallel=2"}},
		{name: "turned off", values: "tests: {nodeCheck: {enabled: false}}"},
		{name: "no plugin", values: "kubeletPlugin: {nodeGroups: {default: null}}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := renderErr(t, values(t, tc.values), releaseName, releaseNamespace)
			if err != nil {
				t.Fatal(err)
			}
			notes := out["facet/templates/NOTES.txt"]
			const say = "helm test " + releaseName + " -n " + releaseNamespace + " --logs"
			if strings.Contains(notes, say) != !strings.Contains(tc.values, "enabled: false") {
				t.Errorf("NOTES.txt says %q: %v, want it where the test is on:\n%s", say, strings.Contains(notes, say), notes)
			}
			objs := render(t, values(t, tc.values))
			var mine []object
			for _, o := range objs {
				if o.GetLabels()["app.kubernetes.io/component"] == "node-check" {
					mine = append(mine, o)
				}
			}
			if !tc.rendered {
				if len(mine) != 0 {
					t.Fatalf("%d node-check objects rendered, want none", len(mine))
				}
				return
			}
			var kinds []string
			for _, o := range mine {
				kinds = append(kinds, o.GetKind())
			}
			slices.Sort(kinds)
			if want := []string{"Pod", "Role", "RoleBinding", "ServiceAccount"}; !slices.Equal(kinds, want) {
				t.Fatalf("node-check objects %v, want %v", kinds, want)
			}
			pod := &corev1.Pod{}
			into(t, find(t, objs, "Pod", name), pod)
			if pod.Annotations["helm.sh/hook"] != "test" {
				t.Errorf("pod annotations %v: want a test hook", pod.Annotations)
			}
			for _, kind := range []string{"ServiceAccount", "Role", "RoleBinding"} {
				// `helm test --logs` reads a pod's logs for every test hook.
				if h := find(t, objs, kind, name).GetAnnotations()["helm.sh/hook"]; h != "" {
					t.Errorf("%s %s is a %s hook: helm test --logs would look for a pod of that name", kind, name, h)
				}
			}
			if pod.Spec.ServiceAccountName != name || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("pod runs as %q, restart %q; want %s, Never", pod.Spec.ServiceAccountName, pod.Spec.RestartPolicy, name)
			}
			c := pod.Spec.Containers[0]
			if c.Image != facetImage(t, values(t, tc.values)) || !slices.Equal(c.Command[:2], []string{"facetctl", "node-check-all"}) {
				t.Errorf("container %s runs %q in %s; want facetctl node-check-all of Facet's image", c.Name, c.Command, c.Image)
			}
			for _, w := range tc.want {
				if !slices.Contains(c.Command, w) {
					t.Errorf("command %q lacks %s", c.Command, w)
				}
			}
			var selector labels.Selector
			for _, a := range c.Command {
				if s, ok := strings.CutPrefix(a, "--selector="); ok {
					var err error
					if selector, err = labels.Parse(s); err != nil {
						t.Fatal(err)
					}
				}
			}
			if selector == nil {
				t.Fatalf("command %q has no --selector", c.Command)
			}
			plugins := 0
			for _, o := range objs {
				if o.GetKind() != "DaemonSet" && o.GetKind() != "Deployment" {
					continue
				}
				tmpl := labels.Set{}
				for k, v := range o.Object["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)["labels"].(map[string]any) {
					tmpl[k] = v.(string)
				}
				isPlugin := o.GetLabels()["app.kubernetes.io/component"] == "kubelet-plugin"
				if selector.Matches(tmpl) != isPlugin {
					t.Errorf("--selector %s matches %s %s's pods: %v, want %v", selector, o.GetKind(), o.GetName(), !isPlugin, isPlugin)
				}
				if isPlugin {
					plugins++
				}
				if selector.Matches(labels.Set{"app.kubernetes.io/name": "facet", "app.kubernetes.io/instance": "other", "app.kubernetes.io/component": "kubelet-plugin"}) {
					t.Errorf("--selector %s matches another release's plugin", selector)
				}
			}
			if plugins == 0 {
				t.Error("no plugin DaemonSet rendered")
			}

			role := &rbacv1.Role{}
			into(t, find(t, objs, "Role", name), role)
			want := []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
				{APIGroups: []string{""}, Resources: []string{"pods/exec"}, Verbs: []string{"get", "create"}},
			}
			if len(role.Rules) != len(want) {
				t.Fatalf("role rules %+v, want %+v", role.Rules, want)
			}
			for i := range want {
				r := role.Rules[i]
				if !slices.Equal(r.APIGroups, want[i].APIGroups) || !slices.Equal(r.Resources, want[i].Resources) || !slices.Equal(r.Verbs, want[i].Verbs) {
					t.Errorf("rule %d %+v, want %+v", i, r, want[i])
				}
			}
			rb := &rbacv1.RoleBinding{}
			into(t, find(t, objs, "RoleBinding", name), rb)
			if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != name || rb.Subjects[0].Namespace != releaseNamespace {
				t.Errorf("role binding %+v: want %s's Role for its ServiceAccount only", rb, name)
			}
			if role.Namespace != releaseNamespace || rb.Namespace != releaseNamespace {
				t.Errorf("role in %q, binding in %q: want the release namespace", role.Namespace, rb.Namespace)
			}
		})
	}
}
