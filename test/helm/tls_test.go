package helm

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const (
	notAfterAnnotation = "gpu.facet.dev/not-after"
	tlsModeAnnotation  = "gpu.facet.dev/webhook-tls-mode"
	webhookSecret      = "facet-webhook-tls"
)

// pemCerts parses every certificate of a PEM bundle.
func pemCerts(t *testing.T, b []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return out
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// tlsState is the chart's self-signed Secret and the CA bundles of its
// webhook configurations, as rendered.
type tlsState struct {
	secret   object
	ca, cert []*x509.Certificate
	notAfter time.Time
}

func selfSignedState(t *testing.T, objs []object) tlsState {
	t.Helper()
	o := find(t, objs, "Secret", webhookSecret)
	sec := &corev1.Secret{}
	into(t, o, sec)
	s := tlsState{secret: o, ca: pemCerts(t, sec.Data["ca.crt"]), cert: pemCerts(t, sec.Data["tls.crt"])}
	if len(s.cert) != 1 || len(s.ca) == 0 {
		t.Fatalf("Secret %s: %d certificates in tls.crt, %d in ca.crt", webhookSecret, len(s.cert), len(s.ca))
	}
	var err error
	if s.notAfter, err = time.Parse(time.RFC3339, sec.Annotations[notAfterAnnotation]); err != nil {
		t.Fatalf("Secret %s: annotation %s: %v", webhookSecret, notAfterAnnotation, err)
	}
	// Every webhook configuration trusts exactly the Secret's bundle.
	for _, kind := range []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"} {
		for _, c := range ofKind(objs, kind) {
			whs, _, _ := unstructured.NestedSlice(c.Object, "webhooks")
			for _, w := range whs {
				b, _, _ := unstructured.NestedString(w.(map[string]any), "clientConfig", "caBundle")
				if b != o.Object["data"].(map[string]any)["ca.crt"] {
					t.Errorf("%s %s: caBundle is not the Secret's ca.crt", kind, c.GetName())
				}
			}
		}
	}
	return s
}

// verifies: the serving certificate chains to the bundle for the
// Service's name.
func (s tlsState) verifies(cert *x509.Certificate) error {
	pool := x509.NewCertPool()
	for _, c := range s.ca {
		pool.AddCert(c)
	}
	_, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "facet-webhook." + releaseNamespace + ".svc"})
	return err
}

// withNotAfter is the Secret as a lookup would find it, with its
// annotation set to v ("": removed, as an earlier chart left it).
func withNotAfter(s tlsState, v string) *unstructured.Unstructured {
	u := s.secret.DeepCopy()
	ann := u.GetAnnotations()
	delete(ann, notAfterAnnotation)
	if v != "" {
		ann[notAfterAnnotation] = v
	}
	u.SetAnnotations(ann)
	return u
}

// TestSelfSignedCertificateLifetime: the chart's own CA and serving
// certificate last validityDays (365 by default, at most a year), and the
// Secret records when the serving certificate expires, never later than
// it does.
func TestSelfSignedCertificateLifetime(t *testing.T) {
	for _, tc := range []struct {
		values string
		days   int
	}{
		{"", 365},
		{"admission: {webhook: {tls: {selfSigned: {validityDays: 30, renewBeforeDays: 7}}}}", 30},
	} {
		t.Run(fmt.Sprint(tc.days, " days"), func(t *testing.T) {
			s := selfSignedState(t, render(t, values(t, tc.values)))
			want := time.Duration(tc.days) * 24 * time.Hour
			for _, c := range append(s.ca, s.cert...) {
				if d := c.NotAfter.Sub(c.NotBefore); d < want-time.Second || d > want+time.Second {
					t.Errorf("%s: valid %s, want %s", c.Subject.CommonName, d, want)
				}
			}
			if na := s.cert[0].NotAfter; s.notAfter.After(na) || na.Sub(s.notAfter) > 5*time.Second {
				t.Errorf("annotation %s %s, certificate's notAfter %s", notAfterAnnotation, s.notAfter, na)
			}
		})
	}
}

// TestSelfSignedRenewal renders `helm upgrade` on a cluster that holds the
// Secret an earlier render made: it is kept while more than
// renewBeforeDays are left, and renewed otherwise, the new bundle holding
// the new CA and the one before, so that the old serving certificate the
// webhook still has in its volume keeps verifying.
func TestSelfSignedRenewal(t *testing.T) {
	const vals = "admission: {webhook: {mutatePods: {enabled: true}}}"
	first := selfSignedState(t, render(t, values(t, vals)))
	days := func(d int) string {
		return time.Now().Add(time.Duration(d) * 24 * time.Hour).UTC().Format(time.RFC3339)
	}
	// renewed is a Secret after one renewal: two CAs in its bundle.
	renewed := selfSignedState(t, renderIn(t, values(t, vals), fakeCluster{objects: []*unstructured.Unstructured{withNotAfter(first, days(3))}, upgrade: true}, releaseName, releaseNamespace))
	for _, tc := range []struct {
		name string
		// values: vals where empty.
		values string
		old    tlsState
		// notAfter is the old Secret's annotation.
		notAfter string
		renew    bool
	}{
		{name: "a year left: kept", old: first, notAfter: days(365)},
		{name: "31 days left: kept", old: first, notAfter: days(31)},
		{name: "29 days left: renewed", old: first, notAfter: days(29), renew: true},
		{name: "expired: renewed", old: first, notAfter: days(-1), renew: true},
		{name: "an earlier chart's Secret, no annotation: renewed", old: first, notAfter: "", renew: true},
		{name: "an annotation it cannot read: renewed", old: first, notAfter: "soon", renew: true},
		{name: "renewBeforeDays 120, 100 days left: renewed", values: "admission: {webhook: {mutatePods: {enabled: true}, tls: {selfSigned: {renewBeforeDays: 120}}}}", old: first, notAfter: days(100), renew: true},
		{name: "the next renewal drops the CA before the last", old: renewed, notAfter: days(10), renew: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := vals
			if tc.values != "" {
				v = tc.values
			}
			got := selfSignedState(t, renderIn(t, values(t, v), fakeCluster{objects: []*unstructured.Unstructured{withNotAfter(tc.old, tc.notAfter)}, upgrade: true}, releaseName, releaseNamespace))
			oldData := tc.old.secret.Object["data"].(map[string]any)
			gotData := got.secret.Object["data"].(map[string]any)
			if !tc.renew {
				if !maps.Equal(oldData, gotData) || got.notAfter.Format(time.RFC3339) != tc.notAfter {
					t.Errorf("renewed, or its annotation changed (%s, was %s)", got.notAfter.Format(time.RFC3339), tc.notAfter)
				}
				return
			}
			if gotData["tls.crt"] == oldData["tls.crt"] || gotData["tls.key"] == oldData["tls.key"] {
				t.Fatal("not renewed")
			}
			if len(got.ca) != 2 || !got.ca[1].Equal(tc.old.ca[0]) || got.ca[0].Equal(tc.old.ca[0]) {
				t.Errorf("bundle of %d CAs, want the new one and the previous (%s)", len(got.ca), tc.old.ca[0].NotBefore)
			}
			if err := got.verifies(got.cert[0]); err != nil {
				t.Errorf("the new certificate: %v", err)
			}
			if err := got.verifies(tc.old.cert[0]); err != nil {
				t.Errorf("the previous certificate, which the webhook serves until its volume is refreshed: %v", err)
			}
			if left := time.Until(got.notAfter); left < 364*24*time.Hour {
				t.Errorf("the renewed certificate has %s left", left)
			}
		})
	}
}

// webhookConfiguration is a ValidatingWebhookConfiguration of the release
// as a lookup finds it, with annotations.
func webhookConfiguration(ann map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("admissionregistration.k8s.io/v1")
	u.SetKind("ValidatingWebhookConfiguration")
	u.SetName("facet-webhook")
	u.SetAnnotations(ann)
	return u
}

// TestWebhookTLSModeSticks: tls.mode auto resolves once, at install, and
// then keeps the mode the release records on its webhook configuration:
// cert-manager appearing or going switches nothing; an explicit mode does.
func TestWebhookTLSModeSticks(t *testing.T) {
	const certManager = "cert-manager.io/v1"
	recorded := func(mode string) []*unstructured.Unstructured {
		return []*unstructured.Unstructured{webhookConfiguration(map[string]string{tlsModeAnnotation: mode})}
	}
	for _, tc := range []struct {
		name, mode string
		cluster    fakeCluster
		want       string // the mode, or the error
	}{
		{"install without cert-manager", "auto", fakeCluster{objects: []*unstructured.Unstructured{}}, "selfSigned"},
		{"install with cert-manager", "auto", fakeCluster{apis: []string{certManager}, objects: []*unstructured.Unstructured{}}, "certManager"},
		{"cert-manager installed after a selfSigned release: kept", "auto", fakeCluster{apis: []string{certManager}, objects: recorded("selfSigned"), upgrade: true}, "selfSigned"},
		{"a certManager release: kept", "auto", fakeCluster{apis: []string{certManager}, objects: recorded("certManager"), upgrade: true}, "certManager"},
		{"cert-manager gone under a certManager release: refused", "auto", fakeCluster{objects: recorded("certManager"), upgrade: true},
			"admission.webhook.tls.mode=auto: this release's webhook certificate comes from cert-manager (ValidatingWebhookConfiguration facet-webhook, annotation gpu.facet.dev/webhook-tls-mode), but the cluster no longer serves cert-manager.io/v1"},
		{"an earlier chart's certManager release", "auto", fakeCluster{apis: []string{certManager}, upgrade: true,
			objects: []*unstructured.Unstructured{webhookConfiguration(map[string]string{"cert-manager.io/inject-ca-from": releaseNamespace + "/facet-webhook"})}}, "certManager"},
		{"an earlier chart's selfSigned release, cert-manager installed since", "auto", fakeCluster{apis: []string{certManager}, upgrade: true,
			objects: []*unstructured.Unstructured{webhookConfiguration(nil)}}, "selfSigned"},
		{"a secret release set back to auto: resolved afresh", "auto", fakeCluster{objects: recorded("secret"), upgrade: true}, "selfSigned"},
		{"switched when asked: certManager", "certManager", fakeCluster{apis: []string{certManager}, objects: recorded("selfSigned"), upgrade: true}, "certManager"},
		{"switched when asked: selfSigned", "selfSigned", fakeCluster{apis: []string{certManager}, objects: recorded("certManager"), upgrade: true}, "selfSigned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := renderErrIn(t, values(t, "admission: {webhook: {tls: {mode: "+tc.mode+"}}}"), releaseName, releaseNamespace, tc.cluster)
			if strings.Contains(tc.want, " ") {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			objs := parseRendered(t, out)
			vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			into(t, find(t, objs, "ValidatingWebhookConfiguration", "facet-webhook"), vwc)
			if got := vwc.Annotations[tlsModeAnnotation]; got != tc.want {
				t.Errorf("mode %q, want %q", got, tc.want)
			}
			var certManagerObjs, secrets int
			for _, o := range objs {
				if strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/") {
					certManagerObjs++
				}
				if o.GetKind() == "Secret" && o.GetName() == webhookSecret {
					secrets++
				}
			}
			if (certManagerObjs > 0) != (tc.want == "certManager") || (secrets > 0) != (tc.want == "selfSigned") {
				t.Errorf("%d cert-manager objects, %d chart Secrets for mode %s", certManagerObjs, secrets, tc.want)
			}
		})
	}
}

// TestWebhookTLSGitOps: the settings docs/operations.md gives for GitOps
// tools that render with `helm template` and cannot look up the Secret
// (certManager, secret) render the same objects every time; auto (on a
// cluster without cert-manager) and selfSigned make a new CA on every
// render there, which is why the docs steer such tools away from them.
func TestWebhookTLSGitOps(t *testing.T) {
	for _, tc := range []struct {
		tls    string
		stable bool
	}{
		{"{mode: certManager}", true},
		{"{mode: certManager, certManager: {issuerRef: {name: corp-ca, kind: ClusterIssuer}}}", true},
		{"{mode: secret, secret: {name: my-tls, caBundle: " + testCABundle + "}}", true},
		{"{mode: auto}", false},
		{"{mode: selfSigned}", false},
	} {
		t.Run(tc.tls, func(t *testing.T) {
			v := "admission: {webhook: {mutatePods: {enabled: true}, tls: " + tc.tls + "}}"
			a, err := renderErr(t, values(t, v), releaseName, releaseNamespace)
			if err != nil {
				t.Fatal(err)
			}
			b, err := renderErr(t, values(t, v), releaseName, releaseNamespace)
			if err != nil {
				t.Fatal(err)
			}
			var differ []string
			for f := range a {
				if a[f] != b[f] {
					differ = append(differ, f)
				}
			}
			if (len(differ) == 0) != tc.stable {
				t.Errorf("two renders differ in %v; stable: %v", differ, tc.stable)
			}
		})
	}
}
