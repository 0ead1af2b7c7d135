// Command kueue-webhooks rewrites Kueue's webhook configurations
// (config/components/webhook/manifests.yaml of the Kueue module) for a
// Kueue manager running as a host process beside the local node
// (hack/kueue.sh): only the webhooks of Kueue's own API and of the given
// integrations are kept, each calls a URL instead of a Service, with the
// given CA. Kueue's other webhooks (Deployments, StatefulSets, Ray, ...)
// would refuse or hold objects whose integrations are not enabled.
//
//	go run ./hack/kueue-webhooks -manifests FILE -url https://127.0.0.1:9445 -ca ca.crt -keep batch-v1-job,--v1-pod
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

func main() {
	manifests := flag.String("manifests", "", "Kueue's config/components/webhook/manifests.yaml")
	url := flag.String("url", "https://127.0.0.1:9445", "the manager's webhook server")
	caFile := flag.String("ca", "", "PEM CA of the webhook server's certificate")
	keep := flag.String("keep", "batch-v1-job", "comma-separated path parts of the integrations' webhooks to keep, besides kueue-x-k8s-io (e.g. batch-v1-job,--v1-pod)")
	podSelector := flag.String("pod-label", "kueue.x-k8s.io/queue-name", "the pod webhooks get only pods with this label")
	flag.Parse()
	if err := run(os.Stdout, *manifests, *url, *caFile, *keep, *podSelector); err != nil {
		fmt.Fprintln(os.Stderr, "kueue-webhooks:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, manifests, url, caFile, keep, podLabel string) error {
	data, err := os.ReadFile(manifests)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	kept := func(path string) bool {
		if strings.Contains(path, "kueue-x-k8s-io") {
			return true
		}
		for _, k := range strings.Split(keep, ",") {
			if k != "" && strings.HasSuffix(path, "-"+k) {
				return true
			}
		}
		return false
	}
	client := func(path string) admissionv1.WebhookClientConfig {
		u := url + path
		return admissionv1.WebhookClientConfig{URL: &u, CABundle: ca}
	}
	podOnly := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: podLabel, Operator: metav1.LabelSelectorOpExists}}}
	var out [][]byte
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return err
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			var c admissionv1.MutatingWebhookConfiguration
			if err := yaml.UnmarshalStrict(doc, &c); err != nil {
				return err
			}
			var hooks []admissionv1.MutatingWebhook
			for _, h := range c.Webhooks {
				if svcPath(h.ClientConfig) == "" || !kept(svcPath(h.ClientConfig)) {
					continue
				}
				if strings.HasSuffix(svcPath(h.ClientConfig), "--v1-pod") {
					h.ObjectSelector = podOnly
				}
				h.ClientConfig = client(svcPath(h.ClientConfig))
				hooks = append(hooks, h)
			}
			c.Name, c.Webhooks = "kueue-"+c.Name, hooks
			b, err := yaml.Marshal(c)
			if err != nil {
				return err
			}
			out = append(out, b)
		case "ValidatingWebhookConfiguration":
			var c admissionv1.ValidatingWebhookConfiguration
			if err := yaml.UnmarshalStrict(doc, &c); err != nil {
				return err
			}
			var hooks []admissionv1.ValidatingWebhook
			for _, h := range c.Webhooks {
				if svcPath(h.ClientConfig) == "" || !kept(svcPath(h.ClientConfig)) {
					continue
				}
				if strings.HasSuffix(svcPath(h.ClientConfig), "--v1-pod") {
					h.ObjectSelector = podOnly
				}
				h.ClientConfig = client(svcPath(h.ClientConfig))
				hooks = append(hooks, h)
			}
			c.Name, c.Webhooks = "kueue-"+c.Name, hooks
			b, err := yaml.Marshal(c)
			if err != nil {
				return err
			}
			out = append(out, b)
		}
	}
	if len(out) != 2 {
		return fmt.Errorf("%s: found %d webhook configurations, want a mutating and a validating one", manifests, len(out))
	}
	_, err = w.Write(bytes.Join(out, []byte("---\n")))
	return err
}

func svcPath(c admissionv1.WebhookClientConfig) string {
	if c.Service == nil || c.Service.Path == nil {
		return ""
	}
	return *c.Service.Path
}
