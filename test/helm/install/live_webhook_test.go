package install

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"

	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certutil "k8s.io/client-go/util/cert"
)

// servingSecret returns a kubernetes.io/tls Secret for the DNS names, as
// the chart's tls.mode=secret documents, and the base64 of its CA's PEM
// (the chart's tls.secret.caBundle).
func servingSecret(t *testing.T, ns, name string, dnsNames ...string) (manifest, caBundle string) {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(dnsNames[0], nil, dnsNames[1:])
	if err != nil {
		t.Fatal(err)
	}
	// GenerateSelfSignedCertKey's chain: the serving certificate, then its CA.
	_, ca := pem.Decode(certPEM)
	b64 := base64.StdEncoding.EncodeToString
	manifest = fmt.Sprintf("apiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata: {name: %s, namespace: %s}\ndata:\n  tls.crt: %s\n  tls.key: %s\n",
		name, ns, b64(certPEM), b64(keyPEM))
	return manifest, b64(ca)
}

// workNS is where the webhook tests write their claims and pods: the chart's
// webhooks skip the release namespace (chartNS) and kube-system.
const workNS = "facet-chart-live-work"

// webhookPort is the port of the webhook's Deployment on the host's
// network before the node's offset (helmtest's Port): not the chart's
// 8443, nor 9443, which is the API server of make e2e's round at offset
// 3000 (a webhook of the round at offset 0 then could not bind).
const webhookPort = 9543

// webhookMetricsPort is the port of its /metrics, chosen as webhookPort.
const webhookMetricsPort = 9581

// webhookValues are the values of the webhook's Deployment on the local
// node: on the host's network, reaching the API server there (its
// mutators use the API), with its webhooks confined to namespace ns so
// that other tests' claims never depend on it; then more (YAML mapping
// entries at the webhook's level).
func (r *chartRig) webhookValues(t *testing.T, ns, more string) map[string]any {
	t.Helper()
	return values(t, fmt.Sprintf(`
enabled: true
# One node, on the host's network: two replicas would want one port.
replicas: 1
hostNetwork: true
port: %d
metricsPort: %d
logVerbosity: 4
# The node has no kube-proxy: the API server is the host's 127.0.0.1.
extraEnv:
- {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}
- {name: KUBERNETES_SERVICE_PORT, value: "%d"}
namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}
%s
`, r.Port(t, webhookPort), r.Port(t, webhookMetricsPort), r.APIServerPort(), ns, more))
}

// TestLiveChartWebhookDeployment installs the chart's webhook Deployment
// (image of `make image-sim`) with each way of getting its certificate
// that needs no cert-manager: the default, which on this cluster (no
// cert-manager) is the chart's own self-signed CA and certificate, kept
// across `helm upgrade`; and tls.mode=secret as the chart documents it, a
// kubernetes.io/tls Secret for <fullname>-webhook.<namespace>.svc and its
// CA as caBundle. The API server calls the webhook through its Service (at
// the endpoints: hack/cluster/up.sh runs it with
// --enable-aggregator-routing, as there is no kube-proxy), and it refuses a
// claim with a bad Facet config and admits a good one. With the chart's own
// certificate it also renews it by `helm upgrade` once fewer than 30 days
// are left, serving without a gap (webhookRenewal), and keeps selfSigned
// under tls.mode auto when cert-manager.io/v1 appears (webhookModeKept).
func TestLiveChartWebhookDeployment(t *testing.T) {
	r := newChartRig(t)
	r.Namespace(t, workNS)
	ctx := context.Background()
	const secret = "facet-webhook-tls"
	svc := "facet-webhook." + chartNS + ".svc"
	for _, tc := range []struct {
		name string
		// tls is the values' admission.webhook.tls; "" the default.
		tls func(t *testing.T) string
	}{
		{name: "default: the chart's own certificate", tls: func(*testing.T) string { return "" }},
		{name: "an existing Secret", tls: func(t *testing.T) string {
			manifest, caBundle := servingSecret(t, chartNS, secret, svc, svc+".cluster.local")
			r.Must(t, manifest, "apply", "-f", "-")
			t.Cleanup(func() { _, _ = r.Run("", "delete", "secret", "-n", chartNS, secret) })
			return fmt.Sprintf("tls: {mode: secret, secret: {name: %s, caBundle: %s}}", secret, caBundle)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The last case's release is uninstalled, its objects deleted
			// in the background: none may linger into this one's.
			testenv.WaitFor(t, "the last release's webhook Deployment and Secret gone", 2*time.Minute, func() (bool, error) {
				_, e1 := r.Client.AppsV1().Deployments(chartNS).Get(ctx, "facet-webhook", metav1.GetOptions{})
				_, e2 := r.Client.CoreV1().Secrets(chartNS).Get(ctx, secret, metav1.GetOptions{})
				return apierrors.IsNotFound(e1) && apierrors.IsNotFound(e2), fmt.Errorf("deployment: %v, secret: %v", e1, e2)
			})
			vals := values(t, fmt.Sprintf(`
image: {repository: facet.local/facet, tag: %q, pullPolicy: Never}
deviceClasses: {enabled: false}
kubeletPlugin:
  nodeGroups: {default: null}
admission:
  policies: {enabled: false}
`, r.tag))
			vals["admission"].(map[string]any)["webhook"] = r.webhookValues(t, workNS, tc.tls(t))
			r.install(t, vals)
			r.webhookServes(ctx, t, "first")
			if got, want := r.webhookCertExpiry(t), r.servedCertificate(t).NotAfter.Unix(); got != want {
				t.Errorf("facet_webhook_certificate_expiration_timestamp_seconds %d, want the served certificate's NotAfter %d", got, want)
			}
			if tc.name != "default: the chart's own certificate" {
				return
			}
			ca := func() string {
				s, err := r.Client.CoreV1().Secrets(chartNS).Get(ctx, secret, metav1.GetOptions{})
				if err != nil {
					t.Fatalf("the chart made no Secret %s: %v", secret, err)
				}
				return string(s.Data["ca.crt"])
			}
			before := ca()
			up := action.NewUpgrade(r.cfg)
			up.Namespace, up.Timeout = chartNS, 2*time.Minute
			if _, err := up.Run(chartRelease, r.ch, vals); err != nil {
				t.Fatalf("helm upgrade: %v", err)
			}
			if ca() != before {
				t.Error("helm upgrade made a new CA: the chart must keep its self-signed certificate")
			}
			r.webhookServes(ctx, t, "after-upgrade")
			r.webhookRenewal(ctx, t, vals)
			r.webhookModeKept(ctx, t, vals)
		})
	}
}

// servedCertificate is the serving certificate the webhook presents on the
// node's port.
func (r *chartRig) servedCertificate(t *testing.T) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.Port(t, webhookPort)), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only reads the certificate presented
	if err != nil {
		t.Fatalf("dial the webhook: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// webhookRenewal: a `helm upgrade` once fewer than renewBeforeDays are
// left (the Secret's annotation moved to 10 days from now) makes a new CA
// and serving certificate, keeps the old CA in the bundle, and the webhook
// goes on answering the API server at once, while it still serves the old
// certificate from a Secret volume the kubelet has not refreshed yet, and
// after.
func (r *chartRig) webhookRenewal(ctx context.Context, t *testing.T, vals map[string]any) {
	t.Helper()
	const secret = "facet-webhook-tls"
	get := func() *corev1.Secret {
		s, err := r.Client.CoreV1().Secrets(chartNS).Get(ctx, secret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	old := get()
	oldCA, _ := pem.Decode(old.Data["ca.crt"])
	soon := time.Now().Add(10 * 24 * time.Hour).UTC().Format(time.RFC3339)
	r.Must(t, "", "annotate", "secret", "-n", chartNS, secret, "--overwrite", "gpu.facet.dev/not-after="+soon)
	up := action.NewUpgrade(r.cfg)
	up.Namespace, up.Timeout = chartNS, 2*time.Minute
	if _, err := up.Run(chartRelease, r.ch, vals); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	renewed := get()
	if bytes.Equal(renewed.Data["tls.crt"], old.Data["tls.crt"]) {
		t.Fatalf("helm upgrade with %s left did not renew the certificate", soon)
	}
	var cas [][]byte
	for rest := renewed.Data["ca.crt"]; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		cas = append(cas, b.Bytes)
	}
	if len(cas) != 2 || !bytes.Equal(cas[1], oldCA.Bytes) || bytes.Equal(cas[0], oldCA.Bytes) {
		t.Fatalf("the renewed bundle holds %d CAs; want the new one, then the old", len(cas))
	}
	oldLeaf, _ := pem.Decode(old.Data["tls.crt"])
	served := r.servedCertificate(t)
	t.Logf("renewed (%s): the webhook serves the %s certificate", r.since(), map[bool]string{true: "old", false: "new"}[bytes.Equal(served.Raw, oldLeaf.Bytes)])
	// At once, with no retry: whichever certificate the webhook serves
	// now, the API server trusts it.
	out, err := r.Run(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: renewal-bad, namespace: `+workNS+`}
spec:
  devices:
    requests:
    - {name: share, exactly: {deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 4Gi}}}}
    config:
    - opaque: {driver: gpu.facet.dev, parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, taskPriority: 7}}
`, "create", "-f", "-")
	if err == nil || !strings.Contains(out, `admission webhook "resourceclaims.gpu.facet.dev" denied the request`) {
		t.Errorf("right after the renewal, the API server and the webhook: %v: %s", err, out)
	}
	newLeaf, _ := pem.Decode(renewed.Data["tls.crt"])
	testenv.WaitFor(t, "the webhook serving the renewed certificate (the kubelet refreshes the Secret volume)", 3*time.Minute, func() (bool, error) {
		return bytes.Equal(r.servedCertificate(t).Raw, newLeaf.Bytes), nil
	})
	t.Logf("the webhook serves the renewed certificate (%s)", r.since())
	r.webhookServes(ctx, t, "after-renewal")
	renewedCert, err := x509.ParseCertificate(newLeaf.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.webhookCertExpiry(t), renewedCert.NotAfter.Unix(); got != want {
		t.Errorf("after the renewal, facet_webhook_certificate_expiration_timestamp_seconds %d, want the renewed certificate's NotAfter %d", got, want)
	}
}

// webhookCertExpiry scrapes the webhook's /metrics on the node's port for
// its certificate's expiry, in Unix seconds.
func (r *chartRig) webhookCertExpiry(t *testing.T) int64 {
	t.Helper()
	const name = "facet_webhook_certificate_expiration_timestamp_seconds"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", r.Port(t, webhookMetricsPort)), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape the webhook: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return int64(f)
		}
	}
	t.Fatalf("the webhook's /metrics (%d) has no %s:\n%s", resp.StatusCode, name, body)
	return 0
}

// webhookModeKept: cert-manager.io/v1 served (a CRD of that group, no
// cert-manager) does not switch the release's tls.mode auto from
// selfSigned: the upgrade renders no cert-manager object (which this
// cluster could not take) and the configuration still records selfSigned.
func (r *chartRig) webhookModeKept(ctx context.Context, t *testing.T, vals map[string]any) {
	t.Helper()
	crd := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: certificates.cert-manager.io}
spec:
  group: cert-manager.io
  names: {kind: Certificate, listKind: CertificateList, plural: certificates, singular: certificate}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`
	r.Must(t, crd, "apply", "-f", "-")
	gone := func() {
		_, _ = r.Run("", "delete", "crd", "certificates.cert-manager.io", "--wait=true", "--timeout=60s")
		// Later tests ask discovery whether cert-manager is installed.
		testenv.WaitFor(t, "cert-manager.io/v1 no longer served", time.Minute, func() (bool, error) {
			out, err := r.Run("", "api-resources", "--api-group=cert-manager.io", "-o", "name")
			return err == nil && strings.TrimSpace(out) == "", fmt.Errorf("%v: %s", err, out)
		})
	}
	t.Cleanup(gone)
	testenv.WaitFor(t, "cert-manager.io/v1 served", time.Minute, func() (bool, error) {
		out, err := r.Run("", "api-resources", "--api-group=cert-manager.io", "-o", "name")
		return err == nil && strings.Contains(out, "certificates.cert-manager.io"), fmt.Errorf("%v: %s", err, out)
	})
	// Helm keeps the capabilities it read first: read them again.
	r.cfg.Capabilities = nil
	up := action.NewUpgrade(r.cfg)
	up.Namespace, up.Timeout = chartNS, 2*time.Minute
	rel, err := up.Run(chartRelease, r.ch, vals)
	if err != nil {
		t.Fatalf("helm upgrade with cert-manager.io/v1 served: %v", err)
	}
	if strings.Contains(rel.Manifest, "apiVersion: cert-manager.io/") {
		t.Errorf("the upgrade switched to cert-manager:\n%s", rel.Manifest)
	}
	vwc, err := r.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "facet-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := vwc.Annotations["gpu.facet.dev/webhook-tls-mode"]; m != "selfSigned" {
		t.Errorf("the release's recorded mode %q after cert-manager.io/v1 appeared, want selfSigned", m)
	}
	gone()
	r.cfg.Capabilities = nil
	t.Logf("tls.mode auto kept selfSigned with cert-manager.io/v1 served (%s)", r.since())
}

// webhookServes waits for the webhook Deployment, then checks that it
// refuses a claim with a bad config and admits a good one (names prefixed).
func (r *chartRig) webhookServes(ctx context.Context, t *testing.T, prefix string) {
	t.Helper()
	r.explainWebhookOnFailure(t)
	testenv.WaitFor(t, "the webhook Deployment available", 2*time.Minute, func() (bool, error) {
		d, err := r.Client.AppsV1().Deployments(chartNS).Get(ctx, "facet-webhook", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return d.Status.AvailableReplicas == 1 && d.Status.UpdatedReplicas == 1 && d.Status.Replicas == 1, fmt.Errorf("status %+v", d.Status)
	})
	t.Logf("webhook Deployment available (%s)", r.since())

	claim := func(name, params string) string {
		return `apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: ` + name + `, namespace: ` + workNS + `}
spec:
  devices:
    requests:
    - name: share
      exactly:
        deviceClassName: vgpu.facet.dev
        capacity: {requests: {memory: 4Gi}}
    config:
    - opaque:
        driver: gpu.facet.dev
        parameters: ` + params + "\n"
	}
	const want = `admission webhook "resourceclaims.gpu.facet.dev" denied the request: spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority: Invalid value: 7`
	var out string
	testenv.WaitFor(t, "the webhook refusing a bad config", time.Minute, func() (bool, error) {
		var err error
		out, err = r.Run(claim(prefix+"-bad", "{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, taskPriority: 7}"), "apply", "-f", "-")
		return err != nil && strings.Contains(out, want), fmt.Errorf("%v: %s", err, out)
	})
	t.Logf("refused: %s", strings.TrimSpace(out))
	r.Must(t, claim(prefix+"-good", "{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, logLevel: 4}"), "apply", "-f", "-")
	t.Cleanup(func() { _, _ = r.Run("", "delete", "resourceclaim", "-n", workNS, prefix+"-good") })
	log := r.Must(t, "", "logs", "-n", chartNS, "deployment/facet-webhook")
	for _, w := range []string{`name="` + prefix + `-bad"`, `"Allowed" kind="ResourceClaim" namespace="` + workNS + `" name="` + prefix + `-good"`} {
		if !strings.Contains(log, w) {
			t.Errorf("the webhook pod's log lacks %s:\n%s", w, log)
		}
	}
}

// TestLiveChartWebhookDown: the chart's webhooks cannot stall scheduling.
// With the plugin and the webhook installed, a claim and a template with a
// Facet config are admitted; then the webhook is scaled to zero. A new
// hand-written claim with a config is refused (failurePolicy Fail: CREATE
// is validated), even one that carries the resourceclaim controller's
// annotation and an ownerReference to a pod; but a new pod of the
// configured template runs (its claim is made by the resourceclaim
// controller, whose claims the webhook never sees: the template was
// checked), and so does the existing claim's pod, which, once deleted, is
// deallocated and removed: the scheduler's allocation, the finalizers,
// reservedFor and the kubelet's status are UPDATEs, which the chart's
// webhook does not see.
func TestLiveChartWebhookDown(t *testing.T) {
	r := newChartRig(t)
	ctx := context.Background()
	r.Namespace(t, workNS)
	vals := r.values(t, r.tag, "mode: exclusive")
	vals["admission"].(map[string]any)["webhook"] = r.webhookValues(t, workNS, "")
	r.install(t, vals)
	plugin := r.waitPlugin(t, r.tag, 2*time.Minute)
	t.Logf("plugin pod %s Ready (%s)", plugin.Name, r.since())
	r.webhookServes(ctx, t, "down")

	const config = "    config:\n    - opaque: {driver: gpu.facet.dev, parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: GpuConfig}}\n"
	claim := func(name, meta string) string {
		return `apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: ` + name + `
  namespace: ` + workNS + "\n" + meta + `spec:
  devices:
    requests:
    - {name: gpu, exactly: {deviceClassName: gpu.facet.dev}}
` + config
	}
	r.Must(t, claim("held", ""), "apply", "-f", "-")
	t.Cleanup(func() { _, _ = r.Run("", "delete", "resourceclaim", "-n", workNS, "held", "--wait=false") })
	r.Must(t, `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: configured, namespace: `+workNS+`}
spec:
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.facet.dev}}
  `+strings.ReplaceAll(config, "\n    ", "\n      "), "apply", "-f", "-")
	if log := r.Must(t, "", "logs", "-n", chartNS, "deployment/facet-webhook"); !strings.Contains(log, `"Allowed" kind="ResourceClaimTemplate" namespace="`+workNS+`" name="configured"`) {
		t.Fatalf("the configured template did not go through the webhook:\n%s", log)
	}

	r.Must(t, "", "scale", "deployment", "-n", chartNS, "facet-webhook", "--replicas=0")
	testenv.WaitFor(t, "the webhook down: a new claim with a Facet config refused for want of it", 2*time.Minute, func() (bool, error) {
		out, err := r.Run(claim("while-down", ""), "create", "-f", "-")
		if err == nil {
			_, _ = r.Run("", "delete", "resourceclaim", "-n", workNS, "while-down")
			return false, fmt.Errorf("admitted: %s", out)
		}
		return strings.Contains(out, "failed calling webhook"), fmt.Errorf("%v: %s", err, out)
	})
	t.Logf("webhook down (%s)", r.since())

	pod := func(name, claim string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: ` + workNS + `}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: facet.local/busybox:1, imagePullPolicy: Never, command: [sleep, "86400"], resources: {claims: [{name: gpu}]}}
  resourceClaims:
  - {name: gpu, ` + claim + `}
`
	}
	r.Must(t, pod("held", "resourceClaimName: held"), "apply", "-f", "-")
	r.Must(t, pod("from-template", "resourceClaimTemplateName: configured"), "apply", "-f", "-")
	for _, name := range []string{"held", "from-template"} {
		testenv.WaitFor(t, "pod "+name+" Running with the webhook down", 2*time.Minute, func() (bool, error) {
			p, err := r.Client.CoreV1().Pods(workNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return p.Status.Phase == corev1.PodRunning, fmt.Errorf("phase %s, conditions %v", p.Status.Phase, p.Status.Conditions)
		})
	}
	fromTemplate, err := r.Client.CoreV1().Pods(workNS).Get(ctx, "from-template", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := r.claimOf(t, workNS, "from-template")
	if len(c.Spec.Devices.Config) != 1 {
		t.Errorf("the pod's claim %s has config %+v, want its template's", c.Name, c.Spec.Devices.Config)
	}
	t.Logf("pods of a configured claim and of a configured template Running with the webhook down (%s)", r.since())

	// The controller's annotation and an ownerReference to a pod do not
	// make a hand-written claim skip the webhook.
	forged := claim("forged", "  annotations: {resource.kubernetes.io/pod-claim-name: gpu}\n"+
		"  ownerReferences: [{apiVersion: v1, kind: Pod, name: from-template, uid: "+string(fromTemplate.UID)+"}]\n")
	if out, err := r.Run(forged, "create", "-f", "-"); err == nil || !strings.Contains(out, "failed calling webhook") {
		t.Errorf("a hand-written claim dressed as the pod's was admitted with the webhook down: %v\n%s", err, out)
	}

	r.Must(t, "", "delete", "pod", "-n", workNS, "held", "from-template", "--wait=true", "--timeout=90s")
	testenv.WaitFor(t, "the claim deallocated with the webhook down", 2*time.Minute, func() (bool, error) {
		c, err := r.Client.ResourceV1().ResourceClaims(workNS).Get(ctx, "held", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return c.Status.Allocation == nil && len(c.Status.ReservedFor) == 0, fmt.Errorf("allocation %v, reservedFor %v", c.Status.Allocation != nil, c.Status.ReservedFor)
	})
	r.Must(t, "", "delete", "resourceclaim", "-n", workNS, "held", "--wait=true", "--timeout=60s")
	t.Logf("claim deallocated and deleted with the webhook down (%s)", r.since())
}
