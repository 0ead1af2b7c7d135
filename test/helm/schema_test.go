package helm

import (
	"strings"
	"testing"
)

// TestValuesRejected: values.schema.json (and the templates' own checks)
// refuse bad values at `helm install` time, naming what is wrong.
func TestValuesRejected(t *testing.T) {
	tests := []struct {
		name, values string
		want         []string // substrings of the error
	}{
		{"misspelt top-level key", "kubeletplugin: {}", []string{"kubeletplugin"}},
		{"misspelt nested key", "kubeletPlugin: {stateDirectory: /x}", []string{"stateDirectory"}},
		{"unknown mode", "kubeletPlugin: {nodeGroups: {default: {mode: turbo}}}", []string{"nodeGroups/default/mode", "must be one of"}},
		{"bad per-GPU modes", `kubeletPlugin: {nodeGroups: {default: {gpuModes: "0-3=turbo"}}}`, []string{"gpuModes"}},
		{"per-GPU modes without an index", `kubeletPlugin: {nodeGroups: {default: {gpuModes: "mig"}}}`, []string{"gpuModes"}},
		{"unknown order", "kubeletPlugin: {nodeGroups: {default: {gpuOrder: random}}}", []string{"gpuOrder"}},
		{"unknown group field", "kubeletPlugin: {nodeGroups: {default: {modes: mig}}}", []string{"modes"}},
		{"group name that is no label value", "kubeletPlugin: {nodeGroups: {GPU_nodes: {mode: mig}}}", []string{"GPU_nodes"}},
		{"relative state dir", "kubeletPlugin: {stateDir: var/lib/facet}", []string{"stateDir"}},
		{"relative driver root", "kubeletPlugin: {driver: {root: run/nvidia/driver}}", []string{"driver/root"}},
		{"NVML outside the driver root", "kubeletPlugin: {driver: {root: /run/nvidia/driver, nvmlLibrary: /usr/lib64/libnvidia-ml.so.1}}", []string{"nvmlLibrary /usr/lib64/libnvidia-ml.so.1 is not under kubeletPlugin.driver.root /run/nvidia/driver"}},
		{"NVML beside the driver root", "kubeletPlugin: {driver: {root: /usr/local/nvidia, nvmlLibrary: /usr/local/nvidia2/lib64/libnvidia-ml.so.1}}", []string{"is not under kubeletPlugin.driver.root"}},
		{"hook not named nvidia-cdi-hook", "kubeletPlugin: {driver: {nvidiaCDIHookPath: /usr/bin/nvidia-ctk}, nvidiaCDIHook: {install: false}}", []string{"nvidiaCDIHookPath"}},
		{"a hook path and the installed hook", "kubeletPlugin: {driver: {nvidiaCDIHookPath: /usr/bin/nvidia-cdi-hook}}", []string{"nvidiaCDIHook.install puts Facet's nvidia-cdi-hook at /var/lib/facet-cdi-hook/nvidia-cdi-hook"}},
		{"relative hook directory", "kubeletPlugin: {nvidiaCDIHook: {hostDir: var/lib/hook}}", []string{"hostDir"}},
		{"GPU node term with an unknown operator", "kubeletPlugin: {gpuNodeSelectorTerms: [{matchExpressions: [{key: nvidia.com/gpu.present, operator: Equals, values: [\"true\"]}]}]}", []string{"operator"}},
		{"GPU node term misspelt", "kubeletPlugin: {gpuNodeSelectorTerms: [{matchExpression: [{key: nvidia.com/gpu.present, operator: Exists}]}]}", []string{"matchExpression"}},
		{"GPU node labels as a map", "kubeletPlugin: {nodeGroups: {default: {gpuNodeSelectorTerms: {nvidia.com/gpu.present: \"true\"}}}}", []string{"gpuNodeSelectorTerms"}},
		{"critical pods quota that is no quantity", "criticalPodsQuota: {pods: lots}", []string{"criticalPodsQuota/pods"}},
		{"extra argument that is no flag", "kubeletPlugin: {extraArgs: [mig]}", []string{"extraArgs"}},
		{"zero QPS", "kubeletPlugin: {kubeAPI: {qps: 0}}", []string{"qps"}},
		{"bad pull policy", "kubeletPlugin: {hamiCore: {image: {pullPolicy: Sometimes}}}", []string{"pullPolicy"}},
		{"relative HAMi-core source", "kubeletPlugin: {hamiCore: {librarySource: libvgpu.so}}", []string{"librarySource"}},
		{"HAMi-core digest without algorithm", "kubeletPlugin: {hamiCore: {image: {digest: 0123}}}", []string{"digest"}},
		{"HAMi-core library hash not hex", "kubeletPlugin: {hamiCore: {librarySHA256: nothex}}", []string{"librarySHA256"}},
		{"HAMi-core install that is no boolean", `kubeletPlugin: {hamiCore: {install: "no"}}`, []string{"hamiCore/install"}},
		{"HAMi-core resources as a string", "kubeletPlugin: {hamiCore: {resources: small}}", []string{"hamiCore/resources"}},
		{"hook installer resources as a string", "kubeletPlugin: {nvidiaCDIHook: {resources: small}}", []string{"nvidiaCDIHook/resources"}},
		{"bad failure policy", "admission: {webhook: {failurePolicy: Maybe}}", []string{"failurePolicy"}},
		{"unknown TLS mode", "admission: {webhook: {tls: {mode: helm}}}", []string{"tls/mode"}},
		{"secret TLS without a Secret", "admission: {webhook: {tls: {mode: secret, secret: {caBundle: " + testCABundle + "}}}}", []string{"admission.webhook.tls.secret.name is required"}},
		{"secret TLS without a CA", "admission: {webhook: {tls: {mode: secret, secret: {name: tls}}}}", []string{"admission.webhook.tls.secret.caBundle is required"}},
		{"a self-signed certificate longer than a year", "admission: {webhook: {tls: {selfSigned: {validityDays: 3650}}}}", []string{"validityDays", "365"}},
		{"renewal no earlier than the validity", "admission: {webhook: {tls: {selfSigned: {validityDays: 30, renewBeforeDays: 30}}}}", []string{"admission.webhook.tls.selfSigned.renewBeforeDays (30) must be less than validityDays (30)"}},
		{"CA that is no base64", "admission: {webhook: {tls: {mode: secret, secret: {name: tls, caBundle: '-----BEGIN'}}}}", []string{"caBundle"}},
		{"unknown pod mutator mode", "admission: {webhook: {mutatePods: {mode: sometimes}}}", []string{"mutatePods/mode"}},
		{"unknown Kueue mode", "admission: {webhook: {mutatePods: {kueue: yes}}}", []string{"mutatePods/kueue"}},
		{"claim mutator's bad failure policy", "admission: {webhook: {mutateClaims: {failurePolicy: Maybe}}}", []string{"mutateClaims/failurePolicy"}},
		{"claim mutator misspelt", "admission: {webhook: {mutateClaim: {enabled: false}}}", []string{"mutateClaim"}},
		{"controller user with a quote", `admission: {webhook: {resourceClaimControllerUsers: ["system:x' || true || '"]}}`, []string{"resourceClaimControllerUsers"}},
		{"webhook namespace selector misspelt", "admission: {webhook: {namespaceSelector: {matchLabel: {a: b}}}}", []string{"matchLabel"}},
		{"excluded namespaces as a string", "admission: {webhook: {excludeNamespaces: kube-system}}", []string{"excludeNamespaces"}},
		{"misspelt table field", "admission: {webhook: {mutatePods: {extendedResourceMap: {devices: [{resource: nvidia.com/gpu, class: gpu.facet.dev}]}}}}", []string{"class"}},
		{"table resource without a domain", "admission: {webhook: {mutatePods: {extendedResourceMap: {devices: [{resource: gpu, deviceClassName: gpu.facet.dev}]}}}}", []string{"resource"}},
		{"vGPU entry without a class", "admission: {webhook: {mutatePods: {extendedResourceMap: {vgpus: [{count: volcano.sh/vgpu-number}]}}}}", []string{"deviceClassName"}},
		{"IMEX environment without a name", "computeDomains: {imex: {extraEnv: [{value: x}]}}", []string{"imex/extraEnv/0", "name"}},
		{"IMEX environment that sets NODE_NAME", "computeDomains: {imex: {extraEnv: [{name: NODE_NAME, value: node-a}]}}", []string{"imex/extraEnv/0/name"}},
		{"negative eviction cap", "preemptor: {maxEvictionsPerMinute: -1}", []string{"maxEvictionsPerMinute"}},
		{"eviction cap that is no number", "preemptor: {maxEvictionsPerMinute: ten}", []string{"maxEvictionsPerMinute"}},
		{"observe-only that is no boolean", `preemptor: {observeOnly: "yes"}`, []string{"observeOnly"}},
		{"protected namespaces as a string", "preemptor: {protectedNamespaces: monitoring}", []string{"protectedNamespaces"}},
		{"protected namespace that is no name", "preemptor: {protectedNamespaces: [Monitoring]}", []string{"protectedNamespaces"}},
		{"issuer of an unknown kind", "admission: {webhook: {tls: {certManager: {issuerRef: {name: x, kind: Vault}}}}}", []string{"kind"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := renderErr(t, values(t, tc.values), releaseName, releaseNamespace)
			if err == nil {
				t.Fatalf("values accepted:\n%s", tc.values)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestValuesAccepted(t *testing.T) {
	for name, vals := range configurations(t) {
		t.Run(name, func(t *testing.T) {
			if _, err := renderErr(t, vals, releaseName, releaseNamespace); err != nil {
				t.Fatal(err)
			}
		})
	}
}
