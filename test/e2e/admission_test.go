package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// admissionNamespace is this test's own namespace, so that the other tests'
// facet-demo namespace never sees the webhook registered here.
const admissionNamespace = "facet-admission"

// TestAdmission checks Facet's admission pieces on the real API server:
// the ValidatingAdmissionPolicies of deployments/admission/policies.yaml and
// the facet-webhook, run as a local process behind a
// ValidatingWebhookConfiguration with a url. Everything it registers is
// removed at the end, the webhook configuration first.
func TestAdmission(t *testing.T) {
	applyYAML(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+admissionNamespace+"}\n")
	t.Cleanup(func() { _, _ = kubectlErr("delete", "namespace", admissionNamespace, "--wait=true", "--timeout=120s") })

	t.Run("policies", testAdmissionPolicies)
	t.Run("webhook", testAdmissionWebhook)
}

// claimManifest returns a ResourceClaim or a ResourceClaimTemplate in the
// test's namespace whose spec.devices is devices (YAML indented by 4).
func claimManifest(kind, name, devices string) string {
	m := "apiVersion: resource.k8s.io/v1\nkind: " + kind + "\nmetadata: {name: " + name + ", namespace: " + admissionNamespace + "}\nspec:\n"
	if kind == "ResourceClaimTemplate" {
		return m + "  spec:\n    devices:\n" + indentLines(devices, "      ")
	}
	return m + "  devices:\n" + indentLines(devices, "    ")
}

func indentLines(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// applyManifestErr applies a manifest given inline and returns kubectl's
// output and error; args go before -f.
func applyManifestErr(t testing.TB, manifest string, args ...string) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return kubectlErr(append(append([]string{"apply"}, args...), "-f", path)...)
}

func testAdmissionPolicies(t *testing.T) {
	// The policies' rules are about vGPU shares' capacity requests, which a
	// stock 1.35 API server drops before admission sees them (so there the
	// policies refuse every vgpu.facet.dev share, which is right: it would
	// get the whole GPU).
	needGates(t, features.ConsumableCapacity)
	policies := filepath.Join(e.repo, "deployments", "admission", "policies.yaml")
	kubectl(t, "apply", "-f", policies)
	t.Cleanup(func() { _, _ = kubectlErr("delete", "-f", policies, "--ignore-not-found", "--wait=true") })

	// A policy takes a moment to reach the API server's admission chain:
	// wait until a known-bad claim and template are refused by it.
	probe := "requests:\n- name: probe\n  exactly: {deviceClassName: vgpu.facet.dev}\n"
	for kind, policy := range map[string]string{
		"ResourceClaim":         "resourceclaims.gpu.facet.dev",
		"ResourceClaimTemplate": "resourceclaimtemplates.gpu.facet.dev",
	} {
		waitFor(t, "policy "+policy+" enforced", time.Minute, func() (bool, error) {
			out, err := applyManifestErr(t, claimManifest(kind, "probe", probe), "--dry-run=server")
			return err != nil && strings.Contains(out, "ValidatingAdmissionPolicy '"+policy+"'"), fmt.Errorf("%v: %s", err, out)
		})
	}

	t.Run("the API server type-checks every expression without a warning", func(t *testing.T) {
		// kube-controller-manager's policy status controller type-checks
		// the CEL against resource.k8s.io/v1's schema, so a wrong path to
		// the requests shows up here even when no test object reaches it.
		// (Past the requests variable the values are dynamic: the
		// checker does not know capacity.requests, so the rules
		// themselves are checked by the claims below, not here.)
		for _, policy := range []string{"resourceclaims.gpu.facet.dev", "resourceclaimtemplates.gpu.facet.dev"} {
			var status struct {
				ObservedGeneration int64 `json:"observedGeneration"`
				TypeChecking       *struct {
					ExpressionWarnings []struct {
						FieldRef string `json:"fieldRef"`
						Warning  string `json:"warning"`
					} `json:"expressionWarnings"`
				} `json:"typeChecking"`
			}
			waitFor(t, "type checking of "+policy, time.Minute, func() (bool, error) {
				out, err := kubectlErr("get", "validatingadmissionpolicy", policy, "-o", "jsonpath={.status}")
				if err != nil {
					return false, fmt.Errorf("%v: %s", err, out)
				}
				if err := json.Unmarshal([]byte(out), &status); err != nil {
					return false, fmt.Errorf("status %q: %v", out, err)
				}
				return status.ObservedGeneration > 0 && status.TypeChecking != nil, fmt.Errorf("status %s", out)
			})
			for _, w := range status.TypeChecking.ExpressionWarnings {
				t.Errorf("%s: %s: %s", policy, w.FieldRef, w.Warning)
			}
		}
	})

	refused := []struct {
		name    string
		devices string
		want    []string
	}{
		{
			name:    "vgpu without capacity",
			devices: "requests:\n- name: share\n  exactly: {deviceClassName: vgpu.facet.dev}\n",
			want: []string{
				"No capacity.requests.memory in request share (deviceClassName vgpu.facet.dev)",
				"Add capacity: {requests: {memory: 4Gi}} to the request",
			},
		},
		{
			name:    "vgpu with cores but no memory",
			devices: "requests:\n- name: share\n  exactly:\n    deviceClassName: vgpu.facet.dev\n    capacity: {requests: {cores: \"20\"}}\n",
			want:    []string{"No capacity.requests.memory in request share (deviceClassName vgpu.facet.dev)"},
		},
		{
			name: "vgpu subrequest of firstAvailable without memory",
			devices: "requests:\n- name: main\n  firstAvailable:\n" +
				"  - {name: big, deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 40Gi}}}\n" +
				"  - {name: small, deviceClassName: vgpu.facet.dev}\n",
			want: []string{"No capacity.requests.memory in request main/small (deviceClassName vgpu.facet.dev)"},
		},
		{
			name:    "whole gpu with capacity",
			devices: "requests:\n- name: gpu\n  exactly:\n    deviceClassName: gpu.facet.dev\n    capacity: {requests: {memory: 10Gi}}\n",
			want: []string{
				"capacity set in request gpu (deviceClassName gpu.facet.dev)",
				"Remove capacity from the request; for a share of a GPU use deviceClassName vgpu.facet.dev",
			},
		},
		{
			name:    "mig with allocationMode All",
			devices: "requests:\n- name: mig\n  exactly: {deviceClassName: mig.facet.dev, allocationMode: All}\n",
			want: []string{
				"allocationMode: All in request mig (mig.facet.dev)",
				"Use allocationMode: ExactCount (the default) with count: N instead",
			},
		},
		{
			name:    "vgpu with allocationMode All",
			devices: "requests:\n- name: share\n  exactly:\n    deviceClassName: vgpu.facet.dev\n    allocationMode: All\n    capacity: {requests: {memory: 1Gi}}\n",
			want:    []string{"allocationMode: All in request share (vgpu.facet.dev)"},
		},
		{
			name:    "per-profile MIG class with allocationMode All",
			devices: "requests:\n- name: mig\n  exactly: {deviceClassName: mig-1g.10gb.facet.dev, allocationMode: All}\n",
			want:    []string{"allocationMode: All in request mig (mig-1g.10gb.facet.dev)"},
		},
		{
			name: "allocationMode All in a firstAvailable subrequest",
			devices: "requests:\n- name: main\n  firstAvailable:\n" +
				"  - {name: whole, deviceClassName: gpu.facet.dev}\n" +
				"  - {name: migs, deviceClassName: mig.facet.dev, allocationMode: All}\n",
			want: []string{"allocationMode: All in request main/migs (mig.facet.dev)"},
		},
		{
			name: "every problem of a claim in one refusal",
			devices: "requests:\n- name: a\n  exactly: {deviceClassName: vgpu.facet.dev}\n" +
				"- name: b\n  exactly:\n    deviceClassName: gpu.facet.dev\n    capacity: {requests: {memory: 1Gi}}\n" +
				"- name: c\n  exactly: {deviceClassName: mig.facet.dev, allocationMode: All}\n",
			want: []string{
				"No capacity.requests.memory in request a (",
				"capacity set in request b (",
				"allocationMode: All in request c (mig.facet.dev)",
			},
		},
	}
	for _, kind := range []string{"ResourceClaim", "ResourceClaimTemplate"} {
		for i, tc := range refused {
			t.Run(kind+" refused: "+tc.name, func(t *testing.T) {
				out, err := applyManifestErr(t, claimManifest(kind, fmt.Sprintf("refused-%d", i), tc.devices))
				if err == nil {
					t.Fatalf("applied, want refused:\n%s", out)
				}
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Errorf("refusal does not contain %q:\n%s", w, out)
					}
				}
			})
		}
	}

	accepted := []struct{ name, devices string }{
		{"vgpu share with memory and cores", "requests:\n- name: share\n  exactly:\n    deviceClassName: vgpu.facet.dev\n    capacity: {requests: {memory: 4Gi, cores: \"20\"}}\n"},
		{"whole gpus", "requests:\n- name: gpus\n  exactly: {deviceClassName: gpu.facet.dev, count: 2}\n"},
		{"every whole gpu", "requests:\n- name: gpus\n  exactly: {deviceClassName: gpu.facet.dev, allocationMode: All}\n"},
		{"two MIG devices of a profile class", "requests:\n- name: mig\n  exactly: {deviceClassName: mig-1g.10gb.facet.dev, count: 2}\n"},
		{"firstAvailable: a share, else a MIG device", "requests:\n- name: main\n  firstAvailable:\n" +
			"  - {name: share, deviceClassName: vgpu.facet.dev, capacity: {requests: {memory: 8Gi}}}\n" +
			"  - {name: mig, deviceClassName: mig.facet.dev}\n"},
		{"another driver's classes are not Facet's business", "requests:\n- name: other\n  exactly:\n    deviceClassName: gpu.example.com\n    allocationMode: All\n    capacity: {requests: {memory: 1Gi}}\n"},
	}
	for _, kind := range []string{"ResourceClaim", "ResourceClaimTemplate"} {
		for i, tc := range accepted {
			t.Run(kind+" accepted: "+tc.name, func(t *testing.T) {
				if out, err := applyManifestErr(t, claimManifest(kind, fmt.Sprintf("accepted-%d", i), tc.devices)); err != nil {
					t.Fatalf("refused: %v\n%s", err, out)
				}
			})
		}
	}

	t.Run("the demo manifests pass", func(t *testing.T) {
		// Server-side dry run, in this test's namespace: the demos'
		// own namespace belongs to the other tests.
		for _, dir := range []string{"gpu", "mig", "vgpu"} {
			files, _ := filepath.Glob(filepath.Join(e.repo, "demo", dir, "*.yaml"))
			for _, f := range files {
				if filepath.Base(f) == "namespace.yaml" {
					continue
				}
				data, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				m := strings.ReplaceAll(string(data), "namespace: "+namespace, "namespace: "+admissionNamespace)
				if out, err := applyManifestErr(t, m, "--dry-run=server"); err != nil {
					t.Errorf("%s refused: %v\n%s", f, err, out)
				}
			}
		}
	})
}

func testAdmissionWebhook(t *testing.T) {
	addr, caPEM, logPath := startWebhook(t, "facet-webhook-e2e.log")

	// Claims and templates only in this test's namespace; DeviceClasses
	// (cluster-scoped, so namespaceSelector does not apply) only with this
	// test's label. A webhook left behind by a crashed run cannot block
	// anyone else's objects.
	const vwc = "facet-e2e-webhook"
	caBundle := base64.StdEncoding.EncodeToString(caPEM)
	url := "https://" + addr + "/validate"
	t.Cleanup(func() { _, _ = kubectlErr("delete", "validatingwebhookconfiguration", vwc, "--ignore-not-found") })
	applyYAML(t, fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: %[1]s}
webhooks:
- name: claims.gpu.facet.dev
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 5
  clientConfig: {url: %[2]q, caBundle: %[3]s}
  namespaceSelector:
    matchLabels: {kubernetes.io/metadata.name: %[4]s}
  # As the chart registers them: a claim's and a template's spec is
  # immutable, so an UPDATE is a metadata write that must not wait on it.
  rules:
  - {apiGroups: [resource.k8s.io], apiVersions: [v1], operations: [CREATE], resources: [resourceclaims, resourceclaimtemplates]}
- name: deviceclasses.gpu.facet.dev
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 5
  clientConfig: {url: %[2]q, caBundle: %[3]s}
  objectSelector:
    matchLabels: {facet.dev/e2e-webhook: "true"}
  rules:
  - {apiGroups: [resource.k8s.io], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deviceclasses]}
`, vwc, url, caBundle, admissionNamespace))

	vgpuClaim := func(kind, name, params string) string {
		return claimManifest(kind, name, "requests:\n- name: share\n  exactly:\n    deviceClassName: vgpu.facet.dev\n    capacity: {requests: {memory: 4Gi}}\n"+
			"config:\n- requests: [share]\n  opaque:\n    driver: gpu.facet.dev\n    parameters: "+params+"\n")
	}
	const badPriority = "{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, taskPriority: 7}"
	waitFor(t, "webhook registered", time.Minute, func() (bool, error) {
		out, err := applyManifestErr(t, vgpuClaim("ResourceClaim", "probe", badPriority), "--dry-run=server")
		return err != nil && strings.Contains(out, `admission webhook "claims.gpu.facet.dev" denied the request`), fmt.Errorf("%v: %s", err, out)
	})

	refused := []struct{ name, manifest, want string }{
		{
			name:     "claim with an out-of-range taskPriority",
			manifest: vgpuClaim("ResourceClaim", "bad-priority", badPriority),
			want:     "spec.devices.config[0].opaque.parameters: VgpuConfig: taskPriority: Invalid value: 7: must be between 0 and 1, inclusive",
		},
		{
			name:     "claim with a misspelt field",
			manifest: vgpuClaim("ResourceClaim", "bad-field", "{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, corePolicy: force}"),
			want:     `spec.devices.config[0].opaque.parameters: VgpuConfig: strict decoding error: unknown field "corePolicy"`,
		},
		{
			name:     "claim with an unknown kind",
			manifest: vgpuClaim("ResourceClaim", "bad-kind", "{apiVersion: gpu.facet.dev/v1alpha1, kind: MigConfig}"),
			want:     `spec.devices.config[0].opaque.parameters: kind: Unsupported value: "MigConfig": supported values: "GpuConfig", "VgpuConfig", "ComputeDomainChannelConfig"`,
		},
		{
			name:     "template with an unsupported policy",
			manifest: vgpuClaim("ResourceClaimTemplate", "bad-policy", "{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, coreUtilizationPolicy: turbo}"),
			want:     `spec.spec.devices.config[0].opaque.parameters: VgpuConfig: coreUtilizationPolicy: Unsupported value: "turbo"`,
		},
		{
			name: "device class with a bad log level",
			manifest: `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: e2e-bad.gpu.facet.dev
  labels: {facet.dev/e2e-webhook: "true"}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.facet.dev"'}
  config:
  - opaque:
      driver: gpu.facet.dev
      parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, logLevel: 9}
`,
			want: "spec.config[0].opaque.parameters: VgpuConfig: logLevel: Invalid value: 9: must be between 0 and 4, inclusive",
		},
	}
	for _, tc := range refused {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			out, err := applyManifestErr(t, tc.manifest)
			if err == nil {
				t.Fatalf("applied, want refused:\n%s", out)
			}
			if !strings.Contains(out, tc.want) || !regexp.MustCompile(`admission webhook "(claims|deviceclasses)\.gpu\.facet\.dev" denied the request`).MatchString(out) {
				t.Errorf("refusal does not name the field as %q:\n%s", tc.want, out)
			}
		})
	}

	t.Run("valid configs are accepted", func(t *testing.T) {
		good := "{apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, taskPriority: 0, coreUtilizationPolicy: force, logLevel: 3}"
		for _, m := range []string{
			vgpuClaim("ResourceClaim", "good", good),
			vgpuClaim("ResourceClaimTemplate", "good", good),
			claimManifest("ResourceClaim", "other-driver", "requests:\n- name: x\n  exactly: {deviceClassName: gpu.example.com}\n"+
				"config:\n- opaque:\n    driver: gpu.example.com\n    parameters: {whatever: 7}\n"),
		} {
			if out, err := applyManifestErr(t, m); err != nil {
				t.Errorf("refused: %v\n%s", err, out)
			}
		}
		class := `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: e2e-good.gpu.facet.dev
  labels: {facet.dev/e2e-webhook: "true"}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.facet.dev"'}
  config:
  - opaque:
      driver: gpu.facet.dev
      parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: GpuConfig}
`
		t.Cleanup(func() { _, _ = kubectlErr("delete", "deviceclass", "e2e-good.gpu.facet.dev", "--ignore-not-found") })
		if out, err := applyManifestErr(t, class); err != nil {
			t.Errorf("refused: %v\n%s", err, out)
		}
	})

	if log, _ := os.ReadFile(logPath); !strings.Contains(string(log), `"Denied" kind="ResourceClaim"`) {
		t.Errorf("the webhook's log (%s) has no denial line", logPath)
	}
}

// webhookCerts makes a CA and a serving certificate for 127.0.0.1 with
// openssl, as hack/cluster/up.sh does, and returns the CA's PEM and the
// serving pair's files.
func webhookCerts(t *testing.T, dir string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("openssl", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	newKey := func(name string) {
		run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name)
	}
	newKey("ca.key")
	run("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=facet-e2e-webhook-ca", "-days", "1", "-sha256",
		"-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt")
	newKey("tls.key")
	run("req", "-new", "-key", "tls.key", "-subj", "/CN=facet-webhook", "-out", "tls.csr")
	ext := "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n"
	if err := os.WriteFile(filepath.Join(dir, "tls.ext"), []byte(ext), 0o644); err != nil {
		t.Fatal(err)
	}
	run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-sha256",
		"-extfile", "tls.ext", "-out", "tls.crt")
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	return caPEM, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
}
