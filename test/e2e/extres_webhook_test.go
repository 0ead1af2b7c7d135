package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/webhook"
)

// mutateLabel selects the pods this test's webhook configuration sends to
// the pod mutator, so that one left behind by a crashed run cannot touch
// another test's pods.
const mutateLabel = "facet.dev/e2e-mutate"

// TestExtendedResourceWebhook runs facet-webhook's pod mutator as a local
// process behind a MutatingWebhookConfiguration with a url, on the node as
// hack/cluster/up.sh started it:
//   - with DRAExtendedResource off (stock 1.35), an unchanged
//     `nvidia.com/gpu: 1` pod is rewritten into a claim from a template, runs
//     with one Facet GPU, and its claim is deleted with it;
//   - with the gate on (1.36, 1.37), the webhook leaves that pod to the
//     scheduler's extended-resource mapping;
//   - whatever the gate, an unchanged Volcano pod (volcano.sh/vgpu-number,
//     vgpu-memory, vgpu-cores) and an unchanged HAMi pod (nvidia.com/gpu
//     with gpumem and gpucores) are rewritten into vGPU slot claims and run
//     with their sizes as HAMi-core limits: no DeviceClass can map a size.
//
// Whether the gate is on is read as the webhook reads it: from whether the
// API server kept the DeviceClasses' extendedResourceName.
func TestExtendedResourceWebhook(t *testing.T) {
	ctx := context.Background()
	setupNamespace(t)
	class, err := e.client.ResourceV1().DeviceClasses().Get(ctx, "gpu.facet.dev", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gateOn := class.Spec.ExtendedResourceName != nil
	if gateOn {
		t.Logf("DRAExtendedResource on: gpu.facet.dev kept extendedResourceName %s", *class.Spec.ExtendedResourceName)
	} else {
		t.Log("DRAExtendedResource off: the API server dropped gpu.facet.dev's extendedResourceName")
	}

	addr, caPEM, logPath := startWebhook(t, "facet-webhook-mutate-e2e.log",
		"--mutate-pods", "--kubeconfig", e.kubeconfig, "--extended-resource-recheck-interval", "2s", "-v", "4")

	// GPU 4 in vGPU slots (40 GiB/50 % and two of 20 GiB/25 %), for the
	// Volcano and HAMi pods; the others whole.
	p := startPlugin(t, "dgx-h100", "--mode", "exclusive", "--gpu-modes", "4=slots", "--gpu-slots", "4=1x40Gi/50+2")
	deleteNamespaceAtEnd(t)
	registerPodMutator(t, "facet-e2e-mutate-pods", addr, caPEM, logPath, `
  matchConditions:
  - name: asksForMappedExtendedResource
    expression: >-
      (object.spec.containers + object.spec.?initContainers.orValue([])).exists(c,
      has(c.resources) && has(c.resources.limits) &&
      c.resources.limits.exists(k, k in ['nvidia.com/gpu', 'nvidia.com/gpumem', 'nvidia.com/gpucores',
      'volcano.sh/vgpu-number', 'volcano.sh/vgpu-memory', 'volcano.sh/vgpu-cores'] || k.startsWith('nvidia.com/mig-')))`)

	gpuPod := func(name, amount string) *corev1.Pod {
		pod := extendedResourcePod(name, "nvidia.com/gpu")
		pod.Labels = map[string]string{mutateLabel: "true"}
		pod.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = resource.MustParse(amount)
		return pod
	}
	if log, _ := os.ReadFile(logPath); !strings.Contains(string(log), map[bool]string{true: "DRAExtendedResource is on", false: "DRAExtendedResource is off"}[gateOn]) {
		t.Errorf("the webhook's log (%s) does not say the gate is %v:\n%s", logPath, gateOn, log)
	}
	waitFor(t, "slices: 7 whole GPUs and 3 vGPU slots", time.Minute, func() (bool, error) {
		n := map[string]int{}
		for _, s := range ourSlices(t) {
			for _, d := range s.Spec.Devices {
				n[*d.Attributes["mode"].StringValue]++
			}
		}
		return n["exclusive"] == 7 && n["slots"] == 3 && len(n) == 2, fmt.Errorf("devices by mode: %v", n)
	})
	gpus := publishedGPUs(t)

	t.Run("unchanged Volcano and HAMi vGPU pods become vGPU slot claims and run with their sizes", func(t *testing.T) {
		vgpuPod := func(name string, limits map[string]string) *corev1.Pod {
			pod := extendedResourcePod(name, "volcano.sh/vgpu-number")
			pod.Labels = map[string]string{mutateLabel: "true"}
			pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{}
			for n, v := range limits {
				pod.Spec.Containers[0].Resources.Limits[corev1.ResourceName(n)] = resource.MustParse(v)
			}
			return pod
		}
		for _, tc := range []struct {
			name     string
			limits   map[string]string
			mem, sm  string // the HAMi-core limits the container gets
			minCores int64  // of the slot it gets
		}{
			{"volcano-vgpu", map[string]string{"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "2000", "volcano.sh/vgpu-cores": "20"}, "2000m", "20", 20},
			{"hami-vgpu", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "50"}, "3000m", "50", 50},
		} {
			created, err := e.client.CoreV1().Pods(namespace).Create(ctx, vgpuPod(tc.name, tc.limits), metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if left := created.Spec.Containers[0].Resources.Limits; len(left) != 0 {
				t.Errorf("%s: limits left after the rewrite: %v", tc.name, left)
			}
			if len(created.Spec.ResourceClaims) != 1 || created.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil {
				t.Fatalf("%s: resourceClaims %+v", tc.name, created.Spec.ResourceClaims)
			}
			t.Logf("%s rewritten: %s", tc.name, created.Annotations[webhook.RewrittenAnnotation])
			pod := waitPodRunning(t, tc.name)
			claim := podClaims(t, pod)[created.Spec.ResourceClaims[0].Name]
			if claim == nil || claim.Status.Allocation == nil {
				t.Fatalf("%s: no allocated claim %s", tc.name, created.Spec.ResourceClaims[0].Name)
			}
			if got := requestsOf(claim); got != "devices: 1 x vgpu-slot.facet.dev" {
				t.Errorf("%s: claim requests %s", tc.name, got)
			}
			dev := claim.Status.Allocation.Devices.Results[0].Device
			if !strings.HasPrefix(dev, "gpu-4-slot-") {
				t.Errorf("%s: got device %s, want a slot of gpu-4", tc.name, dev)
			}
			if cores := slotCores(t, dev); cores < tc.minCores {
				t.Errorf("%s: slot %s has %d %% of the SMs, the pod asked for %d", tc.name, dev, cores, tc.minCores)
			}
			env := envOf(execIn(t, tc.name, "", "env"))
			if env["CUDA_DEVICE_MEMORY_LIMIT_0"] != tc.mem || env["CUDA_DEVICE_SM_LIMIT_0"] != tc.sm {
				t.Errorf("%s: HAMi-core limits %q %q, want %s %s", tc.name, env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_0"], tc.mem, tc.sm)
			}
		}
	})

	if gateOn {
		t.Run("gate on: the pod is left to the scheduler's extended-resource mapping", func(t *testing.T) {
			created, err := e.client.CoreV1().Pods(namespace).Create(ctx, gpuPod("er-gpu", "1"), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(created.Spec.ResourceClaims) != 0 || created.Annotations[webhook.RewrittenAnnotation] != "" {
				t.Fatalf("the webhook rewrote the pod: %+v", created.Spec.ResourceClaims)
			}
			pod := waitPodRunning(t, "er-gpu")
			checkAllocatedPod(t, pod, extendedResourceClaim(t, pod), gpus, 1)
		})
		return
	}

	t.Run("a malformed amount is refused, naming the container and the resource", func(t *testing.T) {
		_, err := e.client.CoreV1().Pods(namespace).Create(ctx, gpuPod("half-gpu", "500m"), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), `container "cuda": nvidia.com/gpu: 500m is not a whole number`) {
			t.Fatalf("got %v, want a refusal from the webhook", err)
		}
	})

	t.Run("gate off: nvidia.com/gpu becomes a pod-owned claim and runs on a Facet GPU", func(t *testing.T) {
		created, err := e.client.CoreV1().Pods(namespace).Create(ctx, gpuPod("er-gpu", "1"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := created.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; ok {
			t.Errorf("nvidia.com/gpu is still in the limits: %v", created.Spec.Containers[0].Resources.Limits)
		}
		if len(created.Spec.ResourceClaims) != 1 || created.Spec.ResourceClaims[0].ResourceClaimTemplateName == nil {
			t.Fatalf("resourceClaims %+v", created.Spec.ResourceClaims)
		}
		tmplName := *created.Spec.ResourceClaims[0].ResourceClaimTemplateName
		t.Logf("rewritten: %s", created.Annotations[webhook.RewrittenAnnotation])
		tmpl, err := e.client.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, tmplName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if tmpl.Labels[webhook.ManagedByLabel] != webhook.ManagedByValue {
			t.Errorf("template %s labels %v", tmplName, tmpl.Labels)
		}

		pod := waitPodRunning(t, "er-gpu")
		claims := podClaims(t, pod)
		if len(claims) != 1 {
			t.Fatalf("%d claims: %v", len(claims), claims)
		}
		claim := claims[created.Spec.ResourceClaims[0].Name]
		if claim == nil {
			t.Fatalf("no claim for %s: %v", created.Spec.ResourceClaims[0].Name, claims)
		}
		if ref := metav1.GetControllerOf(claim); ref == nil || ref.Kind != "Pod" || ref.UID != pod.UID {
			t.Errorf("claim %s is not owned by the pod: %v", claim.Name, claim.OwnerReferences)
		}
		if got := requestsOf(claim); got != "devices: 1 x gpu.facet.dev" {
			t.Errorf("claim requests %s", got)
		}
		checkAllocatedPod(t, pod, claim, gpus, 1)

		if err := e.client.CoreV1().Pods(namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "claim "+claim.Name+" garbage-collected", 2*time.Minute, func() (bool, error) {
			_, err := e.client.ResourceV1().ResourceClaims(namespace).Get(ctx, claim.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), err
		})
		if _, err := e.client.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, tmplName, metav1.GetOptions{}); err != nil {
			t.Errorf("the shared template is gone with the pod: %v", err)
		}
	})
	if t.Failed() {
		log, _ := os.ReadFile(logPath)
		t.Logf("webhook log:\n%s\nplugin log:\n%s", log, p.logText())
	}
}

// startWebhook runs bin/facet-webhook (make build) as a local process until
// t ends, serving on 127.0.0.1 with a certificate of its own CA
// (webhookCerts), with args, its log in RUN_DIR/logs/logName. It returns
// its address, the CA's PEM and the log's path.
func startWebhook(t *testing.T, logName string, args ...string) (addr string, caPEM []byte, logPath string) {
	t.Helper()
	caPEM, certFile, keyFile := webhookCerts(t, t.TempDir())
	logPath = filepath.Join(e.runDir, "logs", logName)
	addr = testenv.StartWebhook(t, filepath.Join(e.repo, "bin", "facet-webhook"), logPath, certFile, keyFile, caPEM, args...)
	return addr, caPEM, logPath
}

// registerPodMutator puts the pod mutator at addr (startWebhook, logging
// to logPath) behind the MutatingWebhookConfiguration name, for the pods
// of the test's namespace labelled mutateLabel, with extra (YAML at a
// webhook's keys' indentation, e.g. matchConditions, or ""). It deletes the
// configuration when t ends: call it after deleteNamespaceAtEnd, so that
// the namespace goes after it, and after startWebhook, so that the process
// stops after it. It returns once the API server's admission chain sends
// the mutator a dry run of a pod asking for nvidia.com/gpu: 1.
func registerPodMutator(t *testing.T, name, addr string, caPEM []byte, logPath, extra string) {
	t.Helper()
	t.Cleanup(func() { _, _ = kubectlErr("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found") })
	applyYAML(t, fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: %[1]s}
webhooks:
- name: pods.gpu.facet.dev
  admissionReviewVersions: [v1]
  sideEffects: NoneOnDryRun
  failurePolicy: Fail
  reinvocationPolicy: IfNeeded
  timeoutSeconds: 10
  clientConfig: {url: %[2]q, caBundle: %[3]s}
  namespaceSelector:
    matchLabels: {kubernetes.io/metadata.name: %[4]s}
  objectSelector:
    matchLabels: {%[5]s: "true"}
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods], scope: Namespaced}%[6]s
`, name, "https://"+addr+webhook.MutatePath, base64.StdEncoding.EncodeToString(caPEM), namespace, mutateLabel, extra))
	probe := extendedResourcePod("probe", "nvidia.com/gpu")
	probe.Labels = map[string]string{mutateLabel: "true"}
	// The configuration takes a moment to reach the API server's admission
	// chain.
	waitFor(t, "pod mutator registered", time.Minute, func() (bool, error) {
		if _, err := e.client.CoreV1().Pods(namespace).Create(context.Background(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			return false, err
		}
		log, _ := os.ReadFile(logPath)
		return strings.Contains(string(log), `name="probe"`), fmt.Errorf("the webhook has not seen the probe pod")
	})
}

// slotCores is the cores capacity (percent of the SMs) of the vGPU slot
// device of that name in this node's slices.
func slotCores(t *testing.T, device string) int64 {
	t.Helper()
	for _, s := range ourSlices(t) {
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				c := d.Capacity["cores"]
				return c.Value.Value()
			}
		}
	}
	t.Fatalf("no device %s in the slices", device)
	return 0
}
