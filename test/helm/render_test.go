// Package helm tests Facet's Helm chart (deployments/helm/facet) by rendering
// it with Helm as a Go library, as `helm install` would, and checking what
// comes out. With a running local API server (hack/e2e.sh's environment:
// KUBECONFIG, FACET_RUN_DIR, FACET_BIN_DIR), live_test.go also sends every
// rendered object through a server-side dry run and tests the ResourceSlice
// node restriction for real.
//
//	cd test/helm && go test ./...
package helm

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/test/helm/helmtest"
)

var (
	repoRoot = filepath.Join("..", "..")
	chartDir = filepath.Join(repoRoot, "deployments", "helm", "facet")
)

const (
	releaseName      = "facet"
	releaseNamespace = "facet-system"
	kubeVersion      = "v1.35.4"
)

func loadChart(t testing.TB) *chart.Chart { return helmtest.LoadChart(t, chartDir) }

// values parses YAML values, as given with -f.
func values(t testing.TB, y string) map[string]any { return helmtest.Values(t, y) }

// renderErr renders the chart as `helm install` would (values merged with
// the chart's, checked against values.schema.json, then the templates),
// for release name and namespace, on a cluster that serves Kubernetes'
// APIs and apis ("cert-manager.io/v1"), as `helm template` renders: lookup
// finds nothing.
func renderErr(t testing.TB, vals map[string]any, name, namespace string, apis ...string) (map[string]string, error) {
	t.Helper()
	return renderErrIn(t, vals, name, namespace, fakeCluster{apis: apis})
}

// fakeCluster is the cluster a render sees: the APIs it serves besides
// Kubernetes' and, where objects is not nil, what lookup finds (as `helm
// install` and `helm upgrade` see a real one); upgrade renders as `helm
// upgrade` does.
type fakeCluster struct {
	apis    []string
	objects []*unstructured.Unstructured
	upgrade bool
}

// renderErrIn is renderErr on cluster c.
func renderErrIn(t testing.TB, vals map[string]any, name, namespace string, c fakeCluster) (map[string]string, error) {
	t.Helper()
	ch := loadChart(t)
	caps := chartutil.DefaultCapabilities.Copy()
	caps.APIVersions = append(caps.APIVersions, c.apis...)
	caps.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "35"}
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: name, Namespace: namespace, Revision: 1, IsInstall: !c.upgrade, IsUpgrade: c.upgrade,
	}, caps)
	if err != nil {
		return nil, err
	}
	if c.objects == nil {
		return engine.Render(ch, top)
	}
	return engine.RenderWithClientProvider(ch, top, newLookupClients(c.objects))
}

// object is one rendered object and the template it came from.
type object struct {
	*unstructured.Unstructured
	template string
}

// render renders with the given values and returns the objects, in a
// stable order. It fails the test on any error.
func render(t testing.TB, vals map[string]any) []object {
	t.Helper()
	return renderAs(t, vals, releaseName, releaseNamespace)
}

func renderAs(t testing.TB, vals map[string]any, name, namespace string, apis ...string) []object {
	t.Helper()
	return renderIn(t, vals, fakeCluster{apis: apis}, name, namespace)
}

// renderIn renders on cluster c, failing the test on any error.
func renderIn(t testing.TB, vals map[string]any, c fakeCluster, name, namespace string) []object {
	t.Helper()
	out, err := renderErrIn(t, vals, name, namespace, c)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return parseRendered(t, out)
}

// parseRendered splits rendered templates into objects, in a stable order.
func parseRendered(t testing.TB, out map[string]string) []object {
	t.Helper()
	var files []string
	for f := range out {
		files = append(files, f)
	}
	sort.Strings(files)
	var objs []object
	for _, f := range files {
		if strings.HasSuffix(f, "NOTES.txt") || strings.HasPrefix(filepath.Base(f), "_") {
			continue
		}
		docs, err := splitYAML(out[f])
		if err != nil {
			t.Fatalf("%s: %v\n%s", f, err, out[f])
		}
		for _, d := range docs {
			objs = append(objs, object{d, f})
		}
	}
	return objs
}

// splitYAML parses a YAML stream into objects, skipping empty documents.
func splitYAML(s string) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(s)))
	var out []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range strings.Split(string(doc), "\n") {
		if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") || t == "---" {
			continue
		}
		b.WriteString(l + "\n")
	}
	return b.Bytes()
}

func ofKind(objs []object, kind string) []object {
	var out []object
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func find(t testing.TB, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %q rendered", kind, name)
	return object{}
}

// into converts an object to a typed API object.
func into(t testing.TB, o object, typed any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, typed, true); err != nil {
		t.Fatalf("%s %s (%s): %v", o.GetKind(), o.GetName(), o.template, err)
	}
}

func TestChartMetadata(t *testing.T) {
	c := loadChart(t)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !chartutil.IsCompatibleRange(c.Metadata.KubeVersion, kubeVersion) {
		t.Errorf("kubeVersion %q does not admit %s", c.Metadata.KubeVersion, kubeVersion)
	}
	if chartutil.IsCompatibleRange(c.Metadata.KubeVersion, "v1.34.0") {
		t.Errorf("kubeVersion %q admits 1.34, which lacks what Facet needs", c.Metadata.KubeVersion)
	}
}

// TestEveryObjectIsWellFormed renders the main configurations and checks
// that every object has a kind, a name, and a namespace exactly when it is
// namespaced.
func TestEveryObjectIsWellFormed(t *testing.T) {
	clusterScoped := map[string]bool{
		"ClusterRole": true, "ClusterRoleBinding": true, "DeviceClass": true,
		"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
		"ValidatingWebhookConfiguration": true, "MutatingWebhookConfiguration": true,
		"CustomResourceDefinition": true,
	}
	for name, vals := range configurations(t) {
		t.Run(name, func(t *testing.T) {
			seen := map[string]bool{}
			for _, o := range render(t, vals) {
				id := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
				if o.GetKind() == "" || o.GetAPIVersion() == "" || o.GetName() == "" {
					t.Errorf("%s: object without apiVersion, kind or name: %v", o.template, o.Object)
				}
				if seen[id] {
					t.Errorf("%s: %s rendered twice", o.template, id)
				}
				seen[id] = true
				if ns := o.GetNamespace(); clusterScoped[o.GetKind()] != (ns == "") {
					t.Errorf("%s: %s has namespace %q", o.template, id, ns)
				} else if ns != "" && ns != releaseNamespace {
					t.Errorf("%s: %s is not in the release namespace", o.template, id)
				}
			}
		})
	}
}

// configurations are the value sets most tests render.
func configurations(t testing.TB) map[string]map[string]any {
	return map[string]map[string]any{
		"defaults": values(t, ""),
		"node groups and secret TLS": values(t, `
networkPolicy: {enabled: true}
kubeletPlugin:
  nodeGroups:
    shared: {mode: shared, gpuOrder: spread}
    mixed: {mode: mig, gpuModes: "4-7=dynamic", destroyUnownedMIG: true, extraArgs: ["--kube-api-burst=200"]}
admission:
  webhook:
    tls:
      mode: secret
      secret: {name: facet-webhook-tls, caBundle: `+testCABundle+`}
`),
		"driver under /usr/local/nvidia": values(t, `
kubeletPlugin:
  driver: {root: /usr/local/nvidia, nvmlLibrary: /usr/local/nvidia/lib64/libnvidia-ml.so.1}
`),
		"minimal": values(t, `
deviceClasses: {enabled: false}
kubeletPlugin:
  nodeRestriction: {enabled: false}
  hamiCore: {enabled: false}
  serviceAccount: {create: false, name: existing}
admission:
  policies: {enabled: false}
  webhook: {enabled: false}
`),
		"pod mutator with its own table": values(t, `
admission:
  webhook:
    mutatePods:
      enabled: true
      mode: always
      failurePolicy: Ignore
      excludeNamespaces: [kube-system, monitoring]
      namespaceSelector:
        matchLabels: {gpu: "yes"}
        matchExpressions: [{key: tier, operator: NotIn, values: [system]}]
      extendedResourceMap:
        devices:
        - {resource: nvidia.com/gpu, deviceClassName: gpu.facet.dev}
        - {resource: example.com/accel-*, deviceClassName: accel-*.facet.dev}
        vgpus:
        - {count: volcano.sh/vgpu-number, memory: volcano.sh/vgpu-memory, deviceClassName: vgpu-slot.facet.dev}
`),
		"preemptor": values(t, `
preemptor:
  enabled: true
  replicas: 1
  maxEvictionsPerMinute: 0
  observeOnly: true
  protectedNamespaces: [monitoring]
  tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}]
`),
		"external issuer and GPU Operator paths on RHEL": values(t, `
kubeletPlugin:
  driver:
    root: /run/nvidia/driver
    devRoot: /run/nvidia/driver
    nvmlLibrary: /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1
    nvidiaCDIHookPath: /usr/local/nvidia/toolkit/nvidia-cdi-hook
  nvidiaCDIHook: {install: false}
admission:
  webhook:
    replicas: 1
    mutateClaims: {enabled: false}
    resourceClaimControllerUsers: []
    tls:
      certManager:
        issuerRef: {name: cluster-ca, kind: ClusterIssuer}
`),
		"webhook scoped, both mutators, Kueue": values(t, `
admission:
  webhook:
    excludeNamespaces: [kube-system, monitoring]
    namespaceSelector:
      matchLabels: {gpu: "yes"}
      matchExpressions: [{key: tier, operator: NotIn, values: [system]}]
    resourceClaimControllerUsers: [system:kube-controller-manager]
    extraEnv: [{name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}]
    mutateClaims: {failurePolicy: Fail, timeoutSeconds: 3}
    mutatePods: {enabled: true, kueue: "on"}
`),
	}
}

// testCABundle is base64 of a throwaway self-signed CA certificate (PEM).
const testCABundle = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJrRENDQVRXZ0F3SUJBZ0lVQk91YU5XRDBXRDdmdUxNS0RLT2ZBMGp2WGg0d0NnWUlLb1pJemowRUF3SXcKSFRFYk1Ca0dBMVVFQXd3U1ptRmpaWFF0YUdWc2JTMTBaWE4wTFdOaE1CNFhEVEkyTVRFeU1URXpOREUxTWxvWApEVE0yTVRFeE9ERXpOREUxTWxvd0hURWJNQmtHQTFVRUF3d1NabUZqWlhRdGFHVnNiUzEwWlhOMExXTmhNRmt3CkV3WUhLb1pJemowQ0FRWUlLb1pJemowREFRY0RRZ0FFaXVsSFZBSHBGUFZIQ0lRSlZtTTFDMy9mSm5RNmlGaGwKUTM0NnRSdTFNdXhTeTN6M1NZN21sTERlZkc5MTZkR2prUVoyUUFnam15QzBFN21idE9Tc2RhTlRNRkV3SFFZRApWUjBPQkJZRUZCMWlHOHA1VDl4bGhuMGVDVGp2L2dtd1dIeUtNQjhHQTFVZEl3UVlNQmFBRkIxaUc4cDVUOXhsCmhuMGVDVGp2L2dtd1dIeUtNQThHQTFVZEV3RUIvd1FGTUFNQkFmOHdDZ1lJS29aSXpqMEVBd0lEU1FBd1JnSWgKQUtOUStINDN5bnZLOU05VEk2bFRVY2FWUVM4ODdjMnZmaHVnT2RmcHdMb2VBaUVBMk12dVVCaWZNMnlNem5uUApwWkJzY2FHN0V4cjJXRk9wMEVpd0JoL1ViOTA9Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K"
