package helm

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

func TestWebhookConfiguration(t *testing.T) {
	tests := []struct {
		name   string
		values string
		// apis the cluster serves besides Kubernetes'.
		apis []string
		// wantCertManager lists the cert-manager objects expected, by kind/name.
		wantCertManager []string
		wantCABundle    bool
		wantInject      bool
		wantSecret      string
		// wantSelfSigned: the chart's own kubernetes.io/tls Secret, whose
		// CA is the caBundle.
		wantSelfSigned bool
	}{
		{
			name:         "default on a cluster without cert-manager: the chart's own certificate",
			values:       "",
			wantCABundle: true, wantSecret: "facet-webhook-tls", wantSelfSigned: true,
		},
		{
			name:         "selfSigned, explicitly, where cert-manager is",
			values:       "admission: {webhook: {tls: {mode: selfSigned}}}",
			apis:         []string{"cert-manager.io/v1"},
			wantCABundle: true, wantSecret: "facet-webhook-tls", wantSelfSigned: true,
		},
		{
			name:   "default where the cluster serves cert-manager: cert-manager with the chart's own CA",
			values: "",
			apis:   []string{"cert-manager.io/v1"},
			wantCertManager: []string{
				"Issuer/facet-webhook-selfsigned", "Certificate/facet-webhook-ca", "Issuer/facet-webhook-ca", "Certificate/facet-webhook",
			},
			wantInject: true,
			wantSecret: "facet-webhook-tls",
		},
		{
			name:   "cert-manager with the chart's own CA",
			values: "admission: {webhook: {tls: {mode: certManager}}}",
			wantCertManager: []string{
				"Issuer/facet-webhook-selfsigned", "Certificate/facet-webhook-ca", "Issuer/facet-webhook-ca", "Certificate/facet-webhook",
			},
			wantInject: true,
			wantSecret: "facet-webhook-tls",
		},
		{
			name:            "cert-manager with an existing issuer",
			values:          "admission: {webhook: {tls: {mode: certManager, certManager: {issuerRef: {name: corp-ca, kind: ClusterIssuer}}}}}",
			wantCertManager: []string{"Certificate/facet-webhook"},
			wantInject:      true,
			wantSecret:      "facet-webhook-tls",
		},
		{
			name:         "existing Secret",
			values:       "admission: {webhook: {tls: {mode: secret, secret: {name: my-tls, caBundle: " + testCABundle + "}}}}",
			wantCABundle: true,
			wantSecret:   "my-tls",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderAs(t, values(t, tc.values), releaseName, releaseNamespace, tc.apis...)
			var got []string
			for _, o := range objs {
				if strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") {
					got = append(got, o.GetKind()+"/"+o.GetName())
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.wantCertManager, ",") {
				t.Errorf("cert-manager objects %v, want %v", got, tc.wantCertManager)
			}
			if tc.name == "cert-manager with an existing issuer" {
				cert := find(t, objs, "Certificate", "facet-webhook")
				if ref := cert.Object["spec"].(map[string]any)["issuerRef"].(map[string]any); ref["name"] != "corp-ca" || ref["kind"] != "ClusterIssuer" {
					t.Errorf("issuerRef %v", ref)
				}
			}
			if len(tc.wantCertManager) > 0 {
				cert := find(t, objs, "Certificate", "facet-webhook")
				dns := cert.Object["spec"].(map[string]any)["dnsNames"].([]any)
				if len(dns) == 0 || dns[0] != "facet-webhook."+releaseNamespace+".svc" {
					t.Errorf("dnsNames %v: the API server calls facet-webhook.%s.svc", dns, releaseNamespace)
				}
			}

			vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			into(t, find(t, objs, "ValidatingWebhookConfiguration", "facet-webhook"), vwc)
			if tc.wantSelfSigned {
				checkSelfSigned(t, objs, vwc)
			}
			_, inject := vwc.Annotations["cert-manager.io/inject-ca-from"]
			if inject != tc.wantInject {
				t.Errorf("cert-manager CA injection %v, want %v", inject, tc.wantInject)
			}
			// resource: the operations sent to the webhook. A claim's and a
			// template's spec is immutable: their UPDATEs are metadata
			// writes (the scheduler's finalizer), which must not depend on
			// the webhook.
			wantOps := map[string]string{
				"resourceclaims":         "CREATE",
				"resourceclaimtemplates": "CREATE",
				"deviceclasses":          "CREATE,UPDATE",
			}
			resources := map[string]bool{}
			for _, w := range vwc.Webhooks {
				if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
					t.Errorf("%s: sideEffects %v; dry runs need None", w.Name, w.SideEffects)
				}
				if strings.Join(w.AdmissionReviewVersions, ",") != "v1" {
					t.Errorf("%s: admissionReviewVersions %v; the webhook speaks v1 only", w.Name, w.AdmissionReviewVersions)
				}
				s := w.ClientConfig.Service
				if s == nil || s.Name != "facet-webhook" || s.Namespace != releaseNamespace || s.Path == nil || *s.Path != "/validate" {
					t.Errorf("%s: clientConfig %+v", w.Name, w.ClientConfig)
				}
				if (len(w.ClientConfig.CABundle) > 0) != tc.wantCABundle {
					t.Errorf("%s: caBundle set = %v", w.Name, len(w.ClientConfig.CABundle) > 0)
				}
				if len(w.MatchConditions) != 1 || !strings.Contains(w.MatchConditions[0].Expression, "c.opaque.driver == 'gpu.facet.dev'") {
					t.Errorf("%s: matchConditions %v; only objects with a Facet config may depend on the webhook", w.Name, w.MatchConditions)
				}
				for _, r := range w.Rules {
					var ops []string
					for _, op := range r.Operations {
						ops = append(ops, string(op))
					}
					for _, res := range r.Resources {
						resources[res] = true
						if want, ok := wantOps[res]; !ok {
							t.Errorf("%s: resource %s is sent to the webhook", w.Name, res)
						} else if got := strings.Join(ops, ","); got != want {
							t.Errorf("%s: %s on %s, want %s", w.Name, res, got, want)
						}
					}
				}
			}
			for res := range wantOps {
				if !resources[res] {
					t.Errorf("%s is not sent to the webhook", res)
				}
			}

			dep := &appsv1.Deployment{}
			into(t, find(t, objs, "Deployment", "facet-webhook"), dep)
			spec := dep.Spec.Template.Spec
			if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
				t.Error("the webhook gets an API token it does not need")
			}
			if len(spec.Volumes) != 1 || spec.Volumes[0].Secret == nil || spec.Volumes[0].Secret.SecretName != tc.wantSecret {
				t.Errorf("TLS volume %+v, want Secret %s", spec.Volumes, tc.wantSecret)
			}
			c := spec.Containers[0]
			args := strings.Join(c.Args, " ")
			for _, want := range []string{"--tls-cert-file=" + c.VolumeMounts[0].MountPath + "/tls.crt", "--tls-private-key-file=" + c.VolumeMounts[0].MountPath + "/tls.key"} {
				if !strings.Contains(args, want) {
					t.Errorf("args %q lack %s", args, want)
				}
			}
			if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
				t.Errorf("readiness probe %+v", p)
			}
			sa := &corev1.ServiceAccount{}
			into(t, find(t, objs, "ServiceAccount", "facet-webhook"), sa)
			if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
				t.Error("the webhook's service account mounts a token")
			}
		})
	}
}

func TestWebhookDisabled(t *testing.T) {
	objs := render(t, values(t, "admission: {webhook: {enabled: false}}"))
	for _, o := range objs {
		if strings.Contains(o.GetName(), "webhook") || strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") {
			t.Errorf("%s %s rendered with the webhook disabled", o.GetKind(), o.GetName())
		}
	}
}

// checkSelfSigned: the chart's own Secret holds a CA and a serving
// certificate it signed for the Service's DNS names, with its key; every
// webhook of the configuration trusts that CA.
func checkSelfSigned(t *testing.T, objs []object, vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
	t.Helper()
	sec := &corev1.Secret{}
	into(t, find(t, objs, "Secret", "facet-webhook-tls"), sec)
	if sec.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret type %q, want %q", sec.Type, corev1.SecretTypeTLS)
	}
	pair, err := tls.X509KeyPair(sec.Data["tls.crt"], sec.Data["tls.key"])
	if err != nil {
		t.Fatalf("tls.crt and tls.key: %v", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(sec.Data["ca.crt"]) {
		t.Fatal("ca.crt holds no PEM certificate")
	}
	for _, name := range []string{"facet-webhook." + releaseNamespace + ".svc", "facet-webhook." + releaseNamespace + ".svc.cluster.local"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("the serving certificate for %s: %v", name, err)
		}
	}
	for _, w := range vwc.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, sec.Data["ca.crt"]) {
			t.Errorf("%s: caBundle is not the Secret's ca.crt", w.Name)
		}
	}
}

// TestSelfSignedCAIsOne: the pod mutator's configuration trusts the same
// self-signed CA as the validating webhook's: one certificate per render.
func TestSelfSignedCAIsOne(t *testing.T) {
	objs := render(t, values(t, "admission: {webhook: {mutatePods: {enabled: true}}}"))
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	into(t, find(t, objs, "ValidatingWebhookConfiguration", "facet-webhook"), vwc)
	checkSelfSigned(t, objs, vwc)
	for _, o := range ofKind(objs, "MutatingWebhookConfiguration") {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		into(t, o, mwc)
		for _, w := range mwc.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, vwc.Webhooks[0].ClientConfig.CABundle) {
				t.Errorf("%s: caBundle differs from the validating webhook's", w.Name)
			}
		}
		return
	}
	t.Fatal("no MutatingWebhookConfiguration rendered")
}
