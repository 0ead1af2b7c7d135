package helm

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
				if len(w.MatchConditions) == 0 || !strings.Contains(w.MatchConditions[0].Expression, "c.opaque.driver == 'gpu.facet.dev'") {
					t.Errorf("%s: matchConditions %v; only objects with a Facet config may depend on the webhook", w.Name, w.MatchConditions)
				}
				// A pod's claim made by the resourceclaim controller from
				// its template (checked at the template's CREATE) never
				// waits on the webhook; no other object skips it so.
				wantConditions := 1
				if w.Name == "resourceclaims.gpu.facet.dev" {
					wantConditions = 2
					checkNotClaimController(t, w.Name, w.MatchConditions, defaultControllerUsers)
				}
				if len(w.MatchConditions) != wantConditions {
					t.Errorf("%s: %d matchConditions, want %d: %v", w.Name, len(w.MatchConditions), wantConditions, w.MatchConditions)
				}
				if w.Name == "deviceclasses.gpu.facet.dev" {
					if w.NamespaceSelector != nil {
						t.Errorf("%s: namespaceSelector %v on a cluster-scoped kind", w.Name, w.NamespaceSelector)
					}
				} else if got := excludedNamespaces(w.NamespaceSelector); !slices.Equal(got, []string{"kube-system", releaseNamespace}) {
					t.Errorf("%s: excluded namespaces %v, want kube-system and the release's", w.Name, got)
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
			// The certificate's expiry, for the FacetWebhookCertificate* alerts.
			if !slices.Contains(c.Args, "--metrics-addr=:8082") || !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 8082 }) {
				t.Errorf("args %q, ports %+v: want /metrics served on port 8082, named metrics", args, c.Ports)
			}
		})
	}
}

// defaultControllerUsers are the identities of the resourceclaim
// controller by default: its service account (kube-controller-manager
// --use-service-account-credentials, as kubeadm runs it and as
// hack/cluster/up.sh does) and the controller-manager's own.
var defaultControllerUsers = []string{"system:serviceaccount:kube-system:resource-claim-controller", "system:kube-controller-manager"}

// checkNotClaimController: the matchConditions skip requests of exactly
// users, by the user the API server authenticated (request.userInfo), and
// by nothing in the object.
func checkNotClaimController(t *testing.T, webhook string, conds []admissionregistrationv1.MatchCondition, users []string) {
	t.Helper()
	var got []admissionregistrationv1.MatchCondition
	for _, c := range conds {
		if c.Name == "notByResourceClaimController" {
			got = append(got, c)
		}
	}
	if len(users) == 0 {
		if len(got) != 0 {
			t.Errorf("%s: %v with no users", webhook, got)
		}
		return
	}
	list, _ := json.Marshal(users)
	if want := "!(request.userInfo.username in " + string(list) + ")"; len(got) != 1 || got[0].Expression != want {
		t.Errorf("%s: matchConditions %v, want notByResourceClaimController: %s", webhook, conds, want)
	}
}

// excludedNamespaces are the names a namespaceSelector's
// kubernetes.io/metadata.name NotIn expression excludes.
func excludedNamespaces(sel *metav1.LabelSelector) []string {
	if sel == nil {
		return nil
	}
	for _, e := range sel.MatchExpressions {
		if e.Key == "kubernetes.io/metadata.name" && e.Operator == metav1.LabelSelectorOpNotIn {
			return e.Values
		}
	}
	return nil
}

// TestWebhookAPIAccess: the webhook gets an API token only for its
// mutators: by default the claim mutator's, with a Role to dry-run claims
// in the release namespace (its probe for firstAvailable) and nothing
// else; with neither mutator, no token and no role.
func TestWebhookAPIAccess(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		wantToken    bool
	}{
		{"defaults: the claim mutator", "", true},
		{"no mutator", "admission: {webhook: {mutateClaims: {enabled: false}}}", false},
		{"the pod mutator only", "admission: {webhook: {mutateClaims: {enabled: false}, mutatePods: {enabled: true}}}", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, values(t, tc.values))
			dep := &appsv1.Deployment{}
			into(t, find(t, objs, "Deployment", "facet-webhook"), dep)
			spec := dep.Spec.Template.Spec
			sa := &corev1.ServiceAccount{}
			into(t, find(t, objs, "ServiceAccount", "facet-webhook"), sa)
			for what, token := range map[string]*bool{"pod": spec.AutomountServiceAccountToken, "service account": sa.AutomountServiceAccountToken} {
				if token == nil || *token != tc.wantToken {
					t.Errorf("%s mounts a token: %v, want %v", what, token, tc.wantToken)
				}
			}
			args := strings.Join(spec.Containers[0].Args, " ")
			if got := strings.Contains(args, "--namespace="+releaseNamespace); got != tc.wantToken {
				t.Errorf("args %q: --namespace=%s %v, want %v", args, releaseNamespace, got, tc.wantToken)
			}
			var roles []string
			for _, o := range objs {
				if (o.GetKind() == "Role" || o.GetKind() == "RoleBinding") && o.GetLabels()["app.kubernetes.io/component"] == "webhook" {
					roles = append(roles, o.GetKind()+"/"+o.GetName())
				}
			}
			if !tc.wantToken {
				if len(roles) != 0 {
					t.Errorf("%v without a mutator", roles)
				}
				return
			}
			role := &rbacv1.Role{}
			into(t, find(t, objs, "Role", "facet-webhook-probe"), role)
			if role.Namespace != releaseNamespace || len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"resourceclaims"}) ||
				!slices.Equal(role.Rules[0].Verbs, []string{"create"}) || len(role.Rules[0].ResourceNames) != 0 {
				t.Errorf("Role %+v: create resourceclaims in %s, nothing else", role, releaseNamespace)
			}
			binding := &rbacv1.RoleBinding{}
			into(t, find(t, objs, "RoleBinding", "facet-webhook-probe"), binding)
			if binding.RoleRef.Name != role.Name || binding.RoleRef.Kind != "Role" || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "facet-webhook" {
				t.Errorf("RoleBinding %+v", binding)
			}
		})
	}
}

// TestWebhookScope: the namespaces and users the webhooks skip, as set.
func TestWebhookScope(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		wantExcluded []string
		wantLabels   map[string]string
		wantUsers    []string
	}{
		{name: "defaults", wantExcluded: []string{"kube-system", releaseNamespace}, wantUsers: defaultControllerUsers},
		{name: "own exclusions, selector and controller identity",
			values:       `admission: {webhook: {excludeNamespaces: [kube-system, monitoring], namespaceSelector: {matchLabels: {gpu: "yes"}, matchExpressions: [{key: tier, operator: NotIn, values: [system]}]}, resourceClaimControllerUsers: ["system:serviceaccount:kube-system:generic-garbage-collector"]}}`,
			wantExcluded: []string{"kube-system", "monitoring", releaseNamespace}, wantLabels: map[string]string{"gpu": "yes"},
			wantUsers: []string{"system:serviceaccount:kube-system:generic-garbage-collector"}},
		{name: "no controller identity: every configured claim is checked", values: "admission: {webhook: {resourceClaimControllerUsers: []}}",
			wantExcluded: []string{"kube-system", releaseNamespace}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, values(t, tc.values))
			var hooks []admissionregistrationv1.ValidatingWebhook
			vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			into(t, find(t, objs, "ValidatingWebhookConfiguration", "facet-webhook"), vwc)
			hooks = append(hooks, vwc.Webhooks...)
			mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
			into(t, find(t, objs, "MutatingWebhookConfiguration", "facet-webhook-claims"), mwc)
			for _, w := range mwc.Webhooks {
				hooks = append(hooks, admissionregistrationv1.ValidatingWebhook{Name: w.Name, NamespaceSelector: w.NamespaceSelector, MatchConditions: w.MatchConditions, Rules: w.Rules})
			}
			for _, w := range hooks {
				if w.Name == "deviceclasses.gpu.facet.dev" {
					continue
				}
				if got := excludedNamespaces(w.NamespaceSelector); !slices.Equal(got, tc.wantExcluded) {
					t.Errorf("%s: excluded %v, want %v", w.Name, got, tc.wantExcluded)
				}
				if !maps.Equal(w.NamespaceSelector.MatchLabels, tc.wantLabels) {
					t.Errorf("%s: matchLabels %v, want %v", w.Name, w.NamespaceSelector.MatchLabels, tc.wantLabels)
				}
				if tc.wantLabels != nil && len(w.NamespaceSelector.MatchExpressions) != 2 {
					t.Errorf("%s: matchExpressions %v, want the exclusion and the values' own", w.Name, w.NamespaceSelector.MatchExpressions)
				}
				claims := slices.ContainsFunc(w.Rules, func(r admissionregistrationv1.RuleWithOperations) bool {
					return slices.Contains(r.Resources, "resourceclaims")
				})
				users := tc.wantUsers
				if !claims {
					users = nil
				}
				checkNotClaimController(t, w.Name, w.MatchConditions, users)
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

// TestSelfSignedCAIsOne: the pod and claim mutators' configurations trust
// the same self-signed CA as the validating webhook's: one certificate per
// render.
func TestSelfSignedCAIsOne(t *testing.T) {
	objs := render(t, values(t, "admission: {webhook: {mutatePods: {enabled: true}}}"))
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	into(t, find(t, objs, "ValidatingWebhookConfiguration", "facet-webhook"), vwc)
	checkSelfSigned(t, objs, vwc)
	mwcs := ofKind(objs, "MutatingWebhookConfiguration")
	if len(mwcs) != 2 {
		t.Fatalf("%d MutatingWebhookConfigurations rendered, want the pods' and the claims'", len(mwcs))
	}
	for _, o := range mwcs {
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		into(t, o, mwc)
		for _, w := range mwc.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, vwc.Webhooks[0].ClientConfig.CABundle) {
				t.Errorf("%s: caBundle differs from the validating webhook's", w.Name)
			}
		}
	}
}
