package main

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

func TestRewrite(t *testing.T) {
	manifests, err := os.ReadFile("testdata/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	onlyMutating, _, _ := bytes.Cut(manifests, []byte("\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration"))
	for _, tc := range []struct {
		name      string
		manifests []byte
		keep      []string
		want      []string // the kept webhooks' URLs' paths, in each of the two configurations
		wantErr   string
	}{
		{name: "Kueue's API only", manifests: manifests, want: []string{"kueue-x-k8s-io-v1beta2-clusterqueue"}},
		{name: "Jobs and pods", manifests: manifests, keep: []string{"batch-v1-job", "-v1-pod"},
			want: []string{"kueue-x-k8s-io-v1beta2-clusterqueue", "batch-v1-job", "-v1-pod"}},
		{name: "a path's end, not any part of it", manifests: manifests, keep: []string{"v1"}, want: []string{"kueue-x-k8s-io-v1beta2-clusterqueue"}},
		{name: "no validating configuration", manifests: onlyMutating, wantErr: "found 1 webhook configurations"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := rewriter{url: "https://127.0.0.1:9445", ca: []byte("CA"), keep: tc.keep, podLabel: "q"}.run(&out, tc.manifests)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			docs := strings.Split(out.String(), "---\n")
			if len(docs) != 2 {
				t.Fatalf("%d documents, want 2:\n%s", len(docs), out.String())
			}
			var m admissionv1.MutatingWebhookConfiguration
			var v admissionv1.ValidatingWebhookConfiguration
			if err := yaml.UnmarshalStrict([]byte(docs[0]), &m); err != nil {
				t.Fatal(err)
			}
			if err := yaml.UnmarshalStrict([]byte(docs[1]), &v); err != nil {
				t.Fatal(err)
			}
			if m.Name != "kueue-mutating-webhook-configuration" || v.Name != "kueue-validating-webhook-configuration" {
				t.Errorf("names %q, %q", m.Name, v.Name)
			}
			var got [2][]string
			for i, hooks := range [][]admissionv1.WebhookClientConfig{clients(m.Webhooks, func(h admissionv1.MutatingWebhook) admissionv1.WebhookClientConfig { return h.ClientConfig }),
				clients(v.Webhooks, func(h admissionv1.ValidatingWebhook) admissionv1.WebhookClientConfig { return h.ClientConfig })} {
				prefix := []string{"https://127.0.0.1:9445/mutate-", "https://127.0.0.1:9445/validate-"}[i]
				for _, c := range hooks {
					if c.Service != nil || c.URL == nil || !strings.HasPrefix(*c.URL, prefix) || string(c.CABundle) != "CA" {
						t.Fatalf("client config %+v, want a URL %s... and the CA only", c, prefix)
					}
					got[i] = append(got[i], strings.TrimPrefix(*c.URL, prefix))
				}
				if !slices.Equal(got[i], tc.want) {
					t.Errorf("%s kept %v, want %v", prefix, got[i], tc.want)
				}
			}
			for _, h := range m.Webhooks {
				pod := strings.HasSuffix(*h.ClientConfig.URL, "--v1-pod")
				if labelled := h.ObjectSelector != nil && len(h.ObjectSelector.MatchExpressions) == 1 && h.ObjectSelector.MatchExpressions[0].Key == "q"; labelled != pod {
					t.Errorf("%s: object selector %v, want one for label q only on the pod webhook", h.Name, h.ObjectSelector)
				}
			}
			for _, h := range v.Webhooks {
				if pod := strings.HasSuffix(*h.ClientConfig.URL, "--v1-pod"); pod != (h.ObjectSelector != nil) {
					t.Errorf("%s: object selector %v, want one only on the pod webhook", h.Name, h.ObjectSelector)
				}
			}
		})
	}
}

func clients[H any](hooks []H, client func(H) admissionv1.WebhookClientConfig) []admissionv1.WebhookClientConfig {
	var out []admissionv1.WebhookClientConfig
	for _, h := range hooks {
		out = append(out, client(h))
	}
	return out
}
