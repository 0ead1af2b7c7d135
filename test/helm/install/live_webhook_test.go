package install

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	certutil "k8s.io/client-go/util/cert"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// TestLiveChartWebhookDeployment installs the chart's webhook Deployment
// (image of `make image-sim`) with its certificate set up as the chart
// documents for tls.mode=secret: a kubernetes.io/tls Secret for
// <fullname>-webhook.<namespace>.svc and its CA as caBundle. The API server
// calls it through its Service (at the endpoints: hack/cluster/up.sh runs
// it with --enable-aggregator-routing, as there is no kube-proxy), and it
// refuses a claim with a bad Facet config and admits a good one.
func TestLiveChartWebhookDeployment(t *testing.T) {
	r := newChartRig(t)
	ctx := context.Background()
	const secret = "facet-webhook-tls"
	svc := "facet-webhook." + chartNS + ".svc"
	manifest, caBundle := servingSecret(t, chartNS, secret, svc, svc+".cluster.local")
	r.must(t, manifest, "apply", "-f", "-")
	vals := values(t, fmt.Sprintf(`
image: {repository: facet.local/facet, tag: %q, pullPolicy: Never}
deviceClasses: {enabled: false}
kubeletPlugin:
  nodeGroups: {default: null}
admission:
  policies: {enabled: false}
  webhook:
    enabled: true
    # One node, on the host's network: two replicas would want one port.
    replicas: 1
    hostNetwork: true
    port: 9443
    logVerbosity: 4
    # Only this test's namespace: other tests' claims never depend on it.
    namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}
    tls:
      mode: secret
      secret: {name: %s, caBundle: %s}
`, r.tag, chartNS, secret, caBundle))
	r.install(t, vals)
	testenv.WaitFor(t, "the webhook Deployment available", 2*time.Minute, func() (bool, error) {
		d, err := r.client.AppsV1().Deployments(chartNS).Get(ctx, "facet-webhook", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return d.Status.AvailableReplicas == 1, fmt.Errorf("status %+v", d.Status)
	})
	t.Logf("webhook Deployment available (%s)", r.since())

	claim := func(name, params string) string {
		return `apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: ` + name + `, namespace: ` + chartNS + `}
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
		out, err = r.run(claim("bad", "{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, taskPriority: 7}"), "apply", "-f", "-")
		return err != nil && strings.Contains(out, want), fmt.Errorf("%v: %s", err, out)
	})
	t.Logf("refused: %s", strings.TrimSpace(out))
	r.must(t, claim("good", "{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, logLevel: 4}"), "apply", "-f", "-")
	log := r.must(t, "", "logs", "-n", chartNS, "deployment/facet-webhook")
	for _, w := range []string{`name="bad"`, `"Allowed" kind="ResourceClaim" namespace="` + chartNS + `" name="good"`} {
		if !strings.Contains(log, w) {
			t.Errorf("the webhook pod's log lacks %s:\n%s", w, log)
		}
	}
}
