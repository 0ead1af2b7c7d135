package helm

import (
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

	"github.com/facet-gpu/facet/pkg/cluster/webhook"
)

// TestPodMutatorOffByDefault: the pod mutator is opt-in; without it the
// webhook has no cluster-wide API access (TestWebhookAPIAccess: the claim
// mutator's Role in the release namespace).
func TestPodMutatorOffByDefault(t *testing.T) {
	for name, v := range map[string]string{
		"defaults":                   "",
		"mutatePods without webhook": "admission: {webhook: {enabled: false, mutatePods: {enabled: true}}}",
	} {
		t.Run(name, func(t *testing.T) {
			for _, o := range render(t, values(t, v)) {
				switch {
				case o.GetKind() == "MutatingWebhookConfiguration" && o.GetName() != "facet-webhook-claims",
					o.GetKind() == "ConfigMap" && strings.Contains(o.GetName(), "extended-resources"),
					strings.HasPrefix(o.GetKind(), "ClusterRole") && strings.Contains(o.GetName(), "webhook"):
					t.Errorf("%s %s rendered", o.GetKind(), o.GetName())
				}
			}
		})
	}
}

func TestPodMutator(t *testing.T) {
	tests := []struct {
		name, values string
		wantMap      webhook.ExtendedResourceMap
		wantMode     string
		wantKueue    string // the --kueue flag's value, "" for none (off)
		wantPolicy   admissionregistrationv1.FailurePolicyType
		wantExcluded []string
		// wantMatch are terms the matchCondition must contain.
		wantMatch []string
	}{
		{
			name:         "defaults",
			values:       "admission: {webhook: {mutatePods: {enabled: true}}}",
			wantMap:      webhook.DefaultExtendedResourceMap(),
			wantMode:     "auto",
			wantPolicy:   admissionregistrationv1.Fail,
			wantExcluded: []string{"kube-system", releaseNamespace},
			wantMatch: []string{"'nvidia.com/gpu'", "'nvidia.com/gpumem'", "'nvidia.com/gpucores'", "'nvidia.com/gpumem-percentage'",
				"'volcano.sh/vgpu-number'", "'volcano.sh/vgpu-memory'", "'volcano.sh/vgpu-cores'", "'volcano.sh/vgpu-memory-percentage'",
				"k.startsWith('nvidia.com/mig-')"},
		},
		{
			name:         "Kueue mode",
			values:       `admission: {webhook: {mutatePods: {enabled: true, kueue: "on"}}}`,
			wantMap:      webhook.DefaultExtendedResourceMap(),
			wantMode:     "auto",
			wantKueue:    "on",
			wantPolicy:   admissionregistrationv1.Fail,
			wantExcluded: []string{"kube-system", releaseNamespace},
			wantMatch:    []string{"'nvidia.com/gpu'", "'volcano.sh/vgpu-memory'", "k.startsWith('nvidia.com/mig-')"},
		},
		{
			name:   "own table",
			values: "", // the configuration of render_test.go
			wantMap: webhook.ExtendedResourceMap{
				Devices: []webhook.DeviceMapping{
					{Resource: "nvidia.com/gpu", DeviceClassName: "gpu.facet.dev"},
					{Resource: "example.com/accel-*", DeviceClassName: "accel-*.facet.dev"},
				},
				VGPUs: []webhook.VGPUMapping{{Count: "volcano.sh/vgpu-number", Memory: "volcano.sh/vgpu-memory", DeviceClassName: "vgpu-slot.facet.dev"}},
			},
			wantMode:     "always",
			wantPolicy:   admissionregistrationv1.Ignore,
			wantExcluded: []string{"kube-system", "monitoring", releaseNamespace},
			wantMatch:    []string{"k in ['nvidia.com/gpu', 'volcano.sh/vgpu-memory', 'volcano.sh/vgpu-number']", "k.startsWith('example.com/accel-')"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vals := values(t, tc.values)
			if tc.values == "" {
				vals = configurations(t)["pod mutator with its own table"]
			}
			objs := render(t, vals)

			// The ConfigMap is a table the webhook loads, equal to the
			// values' (and by default to the built-in one).
			cm := &corev1.ConfigMap{}
			into(t, find(t, objs, "ConfigMap", "facet-webhook-extended-resources"), cm)
			path := filepath.Join(t.TempDir(), "map.yaml")
			if err := os.WriteFile(path, []byte(cm.Data["map.yaml"]), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := webhook.LoadExtendedResourceMap(path)
			if err != nil {
				t.Fatalf("the webhook refuses the rendered table: %v\n%s", err, cm.Data["map.yaml"])
			}
			if !reflect.DeepEqual(got, tc.wantMap) {
				t.Errorf("table %+v\nwant %+v", got, tc.wantMap)
			}

			dep := &appsv1.Deployment{}
			into(t, find(t, objs, "Deployment", "facet-webhook"), dep)
			spec := dep.Spec.Template.Spec
			if spec.AutomountServiceAccountToken == nil || !*spec.AutomountServiceAccountToken {
				t.Error("the pod mutator needs an API token")
			}
			c := spec.Containers[0]
			args := strings.Join(c.Args, " ")
			for _, want := range []string{"--mutate-pods", "--mutate-extended-resources=" + tc.wantMode, "--extended-resource-map="} {
				if !strings.Contains(args, want) {
					t.Errorf("args %q lack %s", args, want)
				}
			}
			if got := strings.Contains(args, "--kueue"); got != (tc.wantKueue != "") || (got && !strings.Contains(args, "--kueue="+tc.wantKueue)) {
				t.Errorf("args %q: want --kueue=%q (none if empty)", args, tc.wantKueue)
			}
			var mapFile string
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--extended-resource-map="); ok {
					mapFile = v
				}
			}
			mounted := false
			for _, m := range c.VolumeMounts {
				for _, v := range spec.Volumes {
					if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name && mapFile == filepath.Join(m.MountPath, "map.yaml") {
						mounted = true
					}
				}
			}
			if !mounted {
				t.Errorf("%s is not the ConfigMap's map.yaml: mounts %+v, volumes %+v", mapFile, c.VolumeMounts, spec.Volumes)
			}
			if dep.Spec.Template.Annotations["checksum/extended-resource-map"] == "" {
				t.Error("no checksum annotation: a changed table would not restart the webhook")
			}
			sa := &corev1.ServiceAccount{}
			into(t, find(t, objs, "ServiceAccount", "facet-webhook"), sa)
			if sa.AutomountServiceAccountToken == nil || !*sa.AutomountServiceAccountToken {
				t.Error("the service account does not mount a token")
			}

			role := &rbacv1.ClusterRole{}
			into(t, find(t, objs, "ClusterRole", "facet-webhook-mutate-pods"), role)
			allowed := map[string]bool{}
			for _, r := range role.Rules {
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						for _, v := range r.Verbs {
							allowed[g+"/"+res+"/"+v] = true
						}
					}
				}
			}
			want := []string{
				"resource.k8s.io/deviceclasses/get", "resource.k8s.io/deviceclasses/list", "resource.k8s.io/deviceclasses/watch",
				"resource.k8s.io/resourceclaimtemplates/get", "resource.k8s.io/resourceclaimtemplates/create",
			}
			for _, w := range want {
				if !allowed[w] {
					t.Errorf("ClusterRole lacks %s", w)
				}
			}
			if len(allowed) != len(want) {
				t.Errorf("ClusterRole allows more than it needs: %v", allowed)
			}
			binding := &rbacv1.ClusterRoleBinding{}
			into(t, find(t, objs, "ClusterRoleBinding", "facet-webhook-mutate-pods"), binding)
			if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "facet-webhook" || binding.Subjects[0].Namespace != releaseNamespace {
				t.Errorf("binding %+v", binding)
			}

			mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
			into(t, find(t, objs, "MutatingWebhookConfiguration", "facet-webhook"), mwc)
			if len(mwc.Webhooks) != 1 {
				t.Fatalf("%d webhooks", len(mwc.Webhooks))
			}
			w := mwc.Webhooks[0]
			if s := w.ClientConfig.Service; s == nil || s.Name != "facet-webhook" || s.Path == nil || *s.Path != webhook.MutatePath {
				t.Errorf("clientConfig %+v", w.ClientConfig)
			}
			if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
				t.Errorf("sideEffects %v: it creates templates, except on dry runs", w.SideEffects)
			}
			if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy {
				t.Errorf("reinvocationPolicy %v", w.ReinvocationPolicy)
			}
			if w.FailurePolicy == nil || *w.FailurePolicy != tc.wantPolicy {
				t.Errorf("failurePolicy %v, want %s", w.FailurePolicy, tc.wantPolicy)
			}
			if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].Resources, []string{"pods"}) || !slices.Equal(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) ||
				!slices.Equal(w.Rules[0].APIGroups, []string{""}) {
				t.Errorf("rules %+v: pods on CREATE only", w.Rules)
			}
			var excluded []string
			for _, e := range w.NamespaceSelector.MatchExpressions {
				if e.Key == "kubernetes.io/metadata.name" && e.Operator == "NotIn" {
					excluded = e.Values
				}
			}
			if !slices.Equal(excluded, tc.wantExcluded) {
				t.Errorf("excluded namespaces %v, want %v", excluded, tc.wantExcluded)
			}
			if len(w.MatchConditions) != 1 {
				t.Fatalf("matchConditions %+v", w.MatchConditions)
			}
			for _, m := range tc.wantMatch {
				if !strings.Contains(w.MatchConditions[0].Expression, m) {
					t.Errorf("matchCondition %q lacks %s", w.MatchConditions[0].Expression, m)
				}
			}
		})
	}
}
