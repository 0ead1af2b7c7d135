// Command kueue-webhooks rewrites Kueue's webhook configurations
// (config/components/webhook/manifests.yaml of the Kueue module) for a
// Kueue manager running as a host process beside the local node
// (hack/kueue.sh): only the webhooks of Kueue's own API and of the given
// integrations are kept, each calls a URL instead of a Service, with the
// given CA. Kueue's other webhooks (Deployments, StatefulSets, Ray, ...)
// would refuse or hold objects whose integrations are not enabled.
//
//	go run ./hack/kueue-webhooks -manifests FILE -url https://127.0.0.1:9445 -ca ca.crt -keep batch-v1-job,-v1-pod
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
	keep := flag.String("keep", "batch-v1-job", "comma-separated ends of the paths of the integrations' webhooks to keep, besides Kueue's own (kueue-x-k8s-io); the pod webhooks' paths end in --v1-pod, kept by -v1-pod")
	podLabel := flag.String("pod-label", "kueue.x-k8s.io/queue-name", "the pod webhooks get only pods with this label")
	flag.Parse()
	data, err := os.ReadFile(*manifests)
	if err == nil {
		var ca []byte
		if ca, err = os.ReadFile(*caFile); err == nil {
			r := rewriter{url: *url, ca: ca, keep: strings.Split(*keep, ","), podLabel: *podLabel}
			err = r.run(os.Stdout, data)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kueue-webhooks:", err)
		os.Exit(1)
	}
}

// rewriter turns the webhooks of Kueue's manifests into webhooks by URL.
type rewriter struct {
	url      string   // the manager's webhook server, e.g. https://127.0.0.1:9445
	ca       []byte   // PEM CA of its serving certificate
	keep     []string // ends of the integrations' paths to keep ("batch-v1-job", "-v1-pod")
	podLabel string   // the pod webhooks' object selector: pods with this label
}

// run writes the mutating and the validating configuration of manifests
// (YAML documents), rewritten, to w.
func (r rewriter) run(w io.Writer, manifests []byte) error {
	var out [][]byte
	for _, doc := range bytes.Split(manifests, []byte("\n---\n")) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return err
		}
		var b []byte
		var err error
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			var c admissionv1.MutatingWebhookConfiguration
			b, err = rewrite(r, doc, &c, &c.ObjectMeta, &c.Webhooks, func(h *admissionv1.MutatingWebhook) (*admissionv1.WebhookClientConfig, **metav1.LabelSelector) {
				return &h.ClientConfig, &h.ObjectSelector
			})
		case "ValidatingWebhookConfiguration":
			var c admissionv1.ValidatingWebhookConfiguration
			b, err = rewrite(r, doc, &c, &c.ObjectMeta, &c.Webhooks, func(h *admissionv1.ValidatingWebhook) (*admissionv1.WebhookClientConfig, **metav1.LabelSelector) {
				return &h.ClientConfig, &h.ObjectSelector
			})
		default:
			continue
		}
		if err != nil {
			return err
		}
		out = append(out, b)
	}
	if len(out) != 2 {
		return fmt.Errorf("found %d webhook configurations, want a mutating and a validating one", len(out))
	}
	_, err := w.Write(bytes.Join(out, []byte("---\n")))
	return err
}

// rewrite decodes doc into config (a webhook configuration whose metadata
// is meta and webhooks hooks), keeps the webhooks r keeps, each calling
// r.url with r.ca, renames it kueue-<name> and encodes it. fields gives a
// webhook's client config and object selector: the two kinds' webhooks are
// different types with the same fields.
func rewrite[C, H any](r rewriter, doc []byte, config *C, meta *metav1.ObjectMeta, hooks *[]H, fields func(*H) (*admissionv1.WebhookClientConfig, **metav1.LabelSelector)) ([]byte, error) {
	if err := yaml.UnmarshalStrict(doc, config); err != nil {
		return nil, err
	}
	var kept []H
	for _, h := range *hooks {
		client, selector := fields(&h)
		if client.Service == nil || client.Service.Path == nil || !r.kept(*client.Service.Path) {
			continue
		}
		path := *client.Service.Path
		if strings.HasSuffix(path, "--v1-pod") {
			// Otherwise every pod of the node would go through Kueue,
			// and none could be made while it is down (failurePolicy
			// Fail); pods without a queue are not Kueue's anyway.
			*selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: r.podLabel, Operator: metav1.LabelSelectorOpExists}}}
		}
		url := r.url + path
		*client = admissionv1.WebhookClientConfig{URL: &url, CABundle: r.ca}
		kept = append(kept, h)
	}
	meta.Name, *hooks = "kueue-"+meta.Name, kept
	return yaml.Marshal(config)
}

// kept reports whether the webhook at path stays: Kueue's own API's, and
// the integrations' whose paths end in -<one of r.keep>.
func (r rewriter) kept(path string) bool {
	if strings.Contains(path, "kueue-x-k8s-io") {
		return true
	}
	for _, k := range r.keep {
		if k != "" && strings.HasSuffix(path, "-"+k) {
			return true
		}
	}
	return false
}
