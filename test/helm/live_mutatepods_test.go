package helm

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/webhook"
	"github.com/facet-gpu/facet/test/helm/helmtest"
)

// TestLiveChartPodMutator runs facet-webhook's pod mutator as a local
// process with the chart's rendered table, behind the chart's own
// MutatingWebhookConfiguration (url and namespace swapped for the test's),
// and creates pods through the real API server: its matchCondition, object
// selector and patch. --mutate-extended-resources=always, so that it
// rewrites whatever gates the node runs (test/e2e covers auto).
func TestLiveChartPodMutator(t *testing.T) {
	l := liveCluster(t)
	const ns, release = "facet-helm-mutate", "facet-helmtest"
	l.Namespace(t, ns)
	l.Must(t, "", "apply", "-f", filepath.Join(repoRoot, "deployments", "deviceclasses.yaml"))
	dir := t.TempDir()

	caPEM := writeServingCert(t, dir)
	caBundle := base64.StdEncoding.EncodeToString(caPEM)
	objs := renderAs(t, values(t, "admission: {webhook: {mutatePods: {enabled: true}, tls: {mode: secret, secret: {name: unused, caBundle: "+caBundle+"}}}}"), release, ns)

	cm := &corev1.ConfigMap{}
	into(t, find(t, objs, "ConfigMap", release+"-webhook-extended-resources"), cm)
	mapFile := filepath.Join(dir, "map.yaml")
	if err := os.WriteFile(mapFile, []byte(cm.Data["map.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := helmtest.FacetBinary(t, repoRoot, "facet-webhook")
	logPath := filepath.Join(dir, "webhook.log")
	addr := testenv.StartWebhook(t, bin, logPath, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), caPEM,
		"--mutate-pods", "--kubeconfig", l.Kubeconfig, "--mutate-extended-resources=always", "--extended-resource-map", mapFile, "-v", "4")

	mwc := find(t, objs, "MutatingWebhookConfiguration", release+"-webhook")
	for _, w := range mwc.Object["webhooks"].([]any) {
		w := w.(map[string]any)
		w["clientConfig"] = map[string]any{"url": "https://" + addr + webhook.MutatePath, "caBundle": caBundle}
		sel := w["namespaceSelector"].(map[string]any)
		sel["matchLabels"] = map[string]any{"kubernetes.io/metadata.name": ns}
		// The release namespace is excluded by the chart; this test's
		// release lives in the test's namespace, so drop that exclusion.
		delete(sel, "matchExpressions")
	}
	manifest := stream(t, []object{mwc})
	t.Cleanup(func() { _, _ = l.Run(manifest, "delete", "--ignore-not-found", "-f", "-") })
	l.Must(t, manifest, "apply", "-f", "-")

	pod := func(name string, labels map[string]string, limits string) string {
		p := map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": name, "namespace": ns, "labels": labels},
			"spec": map[string]any{"containers": []any{map[string]any{
				"name": "cuda", "image": "busybox", "command": []string{"sleep", "1"},
				"resources": map[string]any{"limits": json.RawMessage(limits)},
			}}},
		}
		b, _ := json.Marshal(p)
		return string(b)
	}
	dryRun := func(t *testing.T, manifest string) (*corev1.Pod, error) {
		out, err := l.Run(manifest, "create", "--dry-run=server", "-o", "json", "-f", "-")
		if err != nil {
			return nil, fmt.Errorf("%v: %s", err, out)
		}
		var p corev1.Pod
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			return nil, fmt.Errorf("%v: %s", err, out)
		}
		return &p, nil
	}
	testenv.WaitFor(t, "pod mutator registered", time.Minute, func() (bool, error) {
		p, err := dryRun(t, pod("probe", nil, `{"nvidia.com/gpu": "1"}`))
		return err == nil && len(p.Spec.ResourceClaims) == 1, fmt.Errorf("%v: %+v", err, p)
	})

	for _, tc := range []struct {
		name, pod    string
		wantTemplate string // prefix; "" for a pod left alone
		wantInLog    bool
	}{
		{"whole GPUs", pod("gpus", nil, `{"nvidia.com/gpu": "2", "cpu": "100m"}`), "facet-gpu-facet-dev-2-", true},
		{"a MIG profile", pod("mig", nil, `{"nvidia.com/mig-1g.10gb": "1"}`), "facet-mig-1g-10gb-facet-dev-1-", true},
		{"a pod without extended resources is never sent", pod("plain", nil, `{"cpu": "100m"}`), "", false},
		{"an opted-out pod is never sent", pod("opted-out", map[string]string{"gpu.facet.dev/rewrite-extended-resources": "false"}, `{"nvidia.com/gpu": "1"}`), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := dryRun(t, tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantTemplate == "" {
				if len(p.Spec.ResourceClaims) != 0 {
					t.Errorf("rewritten: %+v", p.Spec.ResourceClaims)
				}
			} else if len(p.Spec.ResourceClaims) != 1 || p.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil ||
				!strings.HasPrefix(*p.Spec.ResourceClaims[0].ResourceClaimTemplateName, tc.wantTemplate) {
				t.Errorf("resourceClaims %+v, want a template %s*", p.Spec.ResourceClaims, tc.wantTemplate)
			}
			log, _ := os.ReadFile(logPath)
			if got := strings.Contains(string(log), `name="`+p.Name+`"`); got != tc.wantInLog {
				t.Errorf("sent to the webhook: %v, want %v", got, tc.wantInLog)
			}
		})
	}

	t.Run("refused, naming the container and the resource", func(t *testing.T) {
		_, err := dryRun(t, pod("fraction", nil, `{"nvidia.com/gpu": "500m"}`))
		if err == nil || !strings.Contains(err.Error(), `admission webhook "pods.gpu.facet.dev" denied the request`) ||
			!strings.Contains(err.Error(), `container "cuda": nvidia.com/gpu: 500m is not a whole number`) {
			t.Errorf("got %v", err)
		}
	})

	t.Run("a dry run makes no template; a create makes one", func(t *testing.T) {
		ctx := context.Background()
		list, err := l.Client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 0 {
			t.Fatalf("%v: %d templates after dry runs", err, len(list.Items))
		}
		l.Must(t, pod("real", nil, `{"nvidia.com/gpu": "1"}`), "create", "-f", "-")
		// A MIG profile's claim is a prioritized list (preferExistingMIG,
		// on by default), which this API server must admit.
		l.Must(t, pod("real-mig", nil, `{"nvidia.com/mig-1g.10gb": "1"}`), "create", "-f", "-")
		list, err = l.Client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{
			LabelSelector: webhook.ManagedByLabel + "=" + webhook.ManagedByValue,
		})
		if err != nil || len(list.Items) != 2 {
			t.Fatalf("%v: templates %+v", err, list)
		}
		for _, tpl := range list.Items {
			req := tpl.Spec.Spec.Devices.Requests[0]
			var subs []string
			for _, sub := range req.FirstAvailable {
				subs = append(subs, sub.Name)
			}
			if strings.HasPrefix(tpl.Name, "facet-mig-") && strings.Join(subs, ",") != "existing,split,carved" {
				t.Errorf("template %s: subrequests %v, want existing, split, carved", tpl.Name, subs)
			}
		}
	})
}
