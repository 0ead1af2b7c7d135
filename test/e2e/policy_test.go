package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/facet-gpu/facet/pkg/model/features"
)

// extendedResourcePod is a pod as written for NVIDIA's device plugin: no
// claim, only an extended resource in its container's limits.
func extendedResourcePod(name, resourceName string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptrTo(int64(1)),
			Containers: []corev1.Container{{
				Name:            "cuda",
				Image:           "facet.local/busybox:1",
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sleep", "86400"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceName(resourceName): resource.MustParse("1"),
				}},
			}},
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

// extendedResourceClaim returns the claim the scheduler created for a
// pod's extended resources.
func extendedResourceClaim(t *testing.T, pod *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil {
		t.Fatalf("%s: no status.extendedResourceClaimStatus", pod.Name)
	}
	c, err := e.client.ResourceV1().ResourceClaims(pod.Namespace).Get(context.Background(), st.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Annotations[resourceapi.ExtendedResourceClaimAnnotation] != "true" {
		t.Errorf("claim %s lacks the %s annotation: %v", c.Name, resourceapi.ExtendedResourceClaimAnnotation, c.Annotations)
	}
	if ref := metav1.GetControllerOf(c); ref == nil || ref.Kind != "Pod" || ref.UID != pod.UID {
		t.Errorf("claim %s is not owned by pod %s: %v", c.Name, pod.Name, c.OwnerReferences)
	}
	t.Logf("%s: scheduler-made claim %s, requests %s, mappings %+v", pod.Name, c.Name, requestsOf(c), st.RequestMappings)
	return c
}

func requestsOf(c *resourceapi.ResourceClaim) string {
	var out []string
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil {
			out = append(out, fmt.Sprintf("%s: %d x %s", r.Name, r.Exactly.Count, r.Exactly.DeviceClassName))
		}
	}
	return strings.Join(out, ", ")
}

// TestPolicy: extended resources backed by Facet's DeviceClasses, the
// tier examples against the apiserver's validation, and ResourceQuota per
// DeviceClass.
func TestPolicy(t *testing.T) {
	needGates(t, features.PartitionableDevices, features.ConsumableCapacity, features.ExtendedResource)
	ctx := context.Background()
	setupNamespace(t)

	t.Run("the apiserver accepts every example", func(t *testing.T) {
		out := kubectl(t, "apply", "--dry-run=server", "-R", "-f", filepath.Join(e.repo, "demo", "examples"))
		t.Logf("%s", out)
		// The classes Facet ships, with their extended resource names, as
		// stored (a field that a gate turns off is dropped silently).
		for class, want := range map[string]string{
			"gpu.facet.dev":            "nvidia.com/gpu",
			"mig-1g.10gb.facet.dev":    "nvidia.com/mig-1g.10gb",
			"mig-1g.10gb.me.facet.dev": "nvidia.com/mig-1g.10gb.me",
			"mig-7g.180gb.facet.dev":   "nvidia.com/mig-7g.180gb",
		} {
			cl, err := e.client.ResourceV1().DeviceClasses().Get(ctx, class, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := cl.Spec.ExtendedResourceName; got == nil || *got != want {
				t.Errorf("class %s: extendedResourceName %v, want %s", class, got, want)
			}
		}
	})

	p := startPlugin(t, "dgx-h100", demoModes...)
	deleteNamespaceAtEnd(t)
	waitModes(t, demoMode)
	gpus := publishedGPUs(t)

	t.Run("an unchanged pod asking nvidia.com/gpu runs on a Facet GPU", func(t *testing.T) {
		if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, extendedResourcePod("plain-gpu", "nvidia.com/gpu"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := waitPodRunning(t, "plain-gpu")
		claim := extendedResourceClaim(t, pod)
		if got := requestsOf(claim); got != "container-0-request-0: 1 x gpu.facet.dev" {
			t.Errorf("claim requests %s", got)
		}
		// Allocated a whole gpu-<i> of Facet's, prepared, and the
		// container has exactly that GPU's /dev/nvidia<i>.
		checkAllocatedPod(t, pod, claim, gpus, 1)
	})

	t.Run("an unchanged pod asking nvidia.com/mig-1g.10gb runs on a carved MIG instance", func(t *testing.T) {
		if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, extendedResourcePod("plain-mig", "nvidia.com/mig-1g.10gb"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := waitPodRunning(t, "plain-mig")
		claim := extendedResourceClaim(t, pod)
		if got := requestsOf(claim); got != "container-0-request-0: 1 x mig-1g.10gb.facet.dev" {
			t.Errorf("claim requests %s", got)
		}
		if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("claim %s: allocation %+v", claim.Name, claim.Status.Allocation)
		}
		device := claim.Status.Allocation.Devices.Results[0].Device
		if !strings.Contains(device, "-mig-1g10gb-") {
			t.Fatalf("allocated %s, want a 1g.10gb MIG device", device)
		}
		if n := len(simInstances(t)); n != 1 {
			t.Errorf("%d MIG instances carved, want 1", n)
		}
		env := envOf(execIn(t, "plain-mig", "", "env"))
		if !strings.HasPrefix(env["FACET_GPU_UUIDS"], "MIG-") || env["FACET_DEVICES"] != device {
			t.Errorf("container env: %v", env)
		}
	})

	t.Run("the scheduler's claims go with their pods", func(t *testing.T) {
		var names []string
		for _, pod := range []string{"plain-gpu", "plain-mig"} {
			pd, err := e.client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
			if err != nil || pd.Status.ExtendedResourceClaimStatus == nil {
				t.Fatalf("%s: %v", pod, err)
			}
			names = append(names, pd.Status.ExtendedResourceClaimStatus.ResourceClaimName)
			kubectl(t, "delete", "pod", "-n", namespace, pod, "--wait=true", "--timeout=120s")
		}
		for _, n := range names {
			waitFor(t, "claim "+n+" deleted", 2*time.Minute, func() (bool, error) {
				_, err := e.client.ResourceV1().ResourceClaims(namespace).Get(ctx, n, metav1.GetOptions{})
				return apierrors.IsNotFound(err), err
			})
		}
		waitFor(t, "MIG instance destroyed", time.Minute, func() (bool, error) { return len(simInstances(t)) == 0, nil })
	})
	if t.Failed() {
		t.Logf("plugin log:\n%s", p.logText())
		t.FailNow()
	}

	t.Run("the notebook tier's admission rules refuse what its class cannot", func(t *testing.T) {
		for _, f := range []string{"tier-classes.yaml", "notebook-admission.yaml"} {
			path := filepath.Join(e.repo, "demo", "examples", f)
			kubectl(t, "apply", "-f", path)
			t.Cleanup(func() { _, _ = kubectlErr("delete", "--ignore-not-found", "-f", path) })
		}
		notebook := func(name string, caps map[resourceapi.QualifiedName]resource.Quantity, config string) *resourceapi.ResourceClaim {
			req := resourceapi.ExactDeviceRequest{DeviceClassName: "notebook-vgpu.facet.dev"}
			if caps != nil {
				req.Capacity = &resourceapi.CapacityRequirements{Requests: caps}
			}
			c := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "vgpu", Exactly: &req}}}},
			}
			if config != "" {
				c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
					Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(config)}},
				}}}
			}
			return c
		}
		caps := func(mem, cores string) map[resourceapi.QualifiedName]resource.Quantity {
			return map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(mem), "cores": resource.MustParse(cores)}
		}
		// The policy takes effect once the API server has loaded it: retry
		// a claim that must be refused until it is.
		n := 0
		var msg string
		waitFor(t, "notebook policy in force", time.Minute, func() (bool, error) {
			n++
			_, err := e.client.ResourceV1().ResourceClaims(namespace).Create(ctx, notebook(fmt.Sprintf("probe-%d", n), caps("16Gi", "25"), ""), metav1.CreateOptions{})
			if err == nil {
				_ = e.client.ResourceV1().ResourceClaims(namespace).Delete(ctx, fmt.Sprintf("probe-%d", n), metav1.DeleteOptions{})
				return false, fmt.Errorf("16Gi notebook claim accepted")
			}
			msg = err.Error()
			return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), err
		})
		t.Logf("16Gi notebook share: %s", msg)
		if !strings.Contains(msg, "at most 8Gi of memory and 25 cores") || !strings.Contains(msg, "request vgpu") {
			t.Errorf("message: %s", msg)
		}
		for _, tc := range []struct {
			name   string
			claim  *resourceapi.ResourceClaim
			refuse string
		}{
			{"8Gi and 25 cores", notebook("nb-ok", caps("8Gi", "25"), ""), ""},
			{"no capacity", notebook("nb-whole", nil, ""), "at most 8Gi of memory and 25 cores"},
			{"30 cores", notebook("nb-cores", caps("4Gi", "30"), ""), "at most 8Gi of memory and 25 cores"},
			{"HAMi-core off", notebook("nb-off", caps("8Gi", "25"), `{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"VgpuConfig","enforcement":"disabled"}`), "may not turn HAMi-core off"},
		} {
			_, err := e.client.ResourceV1().ResourceClaims(namespace).Create(ctx, tc.claim, metav1.CreateOptions{})
			switch {
			case tc.refuse == "" && err != nil:
				t.Errorf("%s: refused: %v", tc.name, err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Errorf("%s: %v, want refused with %q", tc.name, err, tc.refuse)
			case err != nil:
				t.Logf("%s: %v", tc.name, err)
			}
		}
		// A template is checked when it is created (and each claim made
		// from it again).
		tmpl, _, _ := strings.Cut(readFile(t, filepath.Join(e.repo, "demo", "examples", "notebook.yaml")), "\n---\n") // the template, not the pod
		tmpl = strings.ReplaceAll(strings.ReplaceAll(tmpl, "memory: 8Gi", "memory: 9Gi"), "name: notebook-tier", "name: notebook-too-big")
		// The template policy is a policy of its own, which the API server
		// may load after the claims' one: retry until it is in force.
		var out string
		waitFor(t, "notebook template policy in force", time.Minute, func() (bool, error) {
			var err error
			out, err = applyYAMLErr(t, tmpl)
			if err == nil {
				_, _ = kubectlErr("delete", "resourceclaimtemplate", "-n", namespace, "notebook-too-big", "--ignore-not-found")
				return false, fmt.Errorf("9Gi notebook template accepted: %s", strings.TrimSpace(out))
			}
			return true, nil
		})
		if !strings.Contains(out, "at most 8Gi of memory and 25 cores") {
			t.Errorf("9Gi notebook template refused, but not by the notebook rule: %s", out)
		} else {
			t.Logf("9Gi notebook template: %s", strings.TrimSpace(out))
		}
	})

	t.Run("quota refuses claims over the namespace's budget", func(t *testing.T) {
		kubectl(t, "apply", "-n", namespace, "-f", filepath.Join(e.repo, "deployments", "quota", "team.yaml"))
		waitFor(t, "quota status", time.Minute, func() (bool, error) {
			q, err := e.client.CoreV1().ResourceQuotas(namespace).Get(ctx, "facet-devices", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return len(q.Status.Hard) == len(q.Spec.Hard), fmt.Errorf("status.hard %v", q.Status.Hard)
		})
		create := func(name, class string, caps map[resourceapi.QualifiedName]resource.Quantity) error {
			req := resourceapi.ExactDeviceRequest{DeviceClassName: class}
			if caps != nil {
				req.Capacity = &resourceapi.CapacityRequirements{Requests: caps}
			}
			_, err := e.client.ResourceV1().ResourceClaims(namespace).Create(ctx, &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "r", Exactly: &req}}}},
			}, metav1.CreateOptions{})
			return err
		}
		refused := func(err error, what string, want ...string) {
			t.Helper()
			if err == nil || !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v, want refused by quota", what, err)
				return
			}
			t.Logf("%s: %v", what, err)
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: message lacks %q", what, w)
				}
			}
		}
		for i := 1; i <= 2; i++ {
			if err := create(fmt.Sprintf("mig-%d", i), "mig.facet.dev", nil); err != nil {
				t.Fatalf("MIG claim %d of 2: %v", i, err)
			}
		}
		refused(create("mig-3", "mig.facet.dev", nil), "third MIG claim",
			"exceeded quota: facet-devices, requested: mig.facet.dev.deviceclass.resource.k8s.io/devices=1, used: mig.facet.dev.deviceclass.resource.k8s.io/devices=2, limited: mig.facet.dev.deviceclass.resource.k8s.io/devices=2")
		share := map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Gi"), "cores": resource.MustParse("10")}
		for i := 1; i <= 4; i++ {
			if err := create(fmt.Sprintf("vgpu-%d", i), "vgpu.facet.dev", share); err != nil {
				t.Fatalf("vGPU claim %d of 4: %v", i, err)
			}
		}
		refused(create("vgpu-5", "vgpu.facet.dev", share), "fifth vGPU share",
			"requested: vgpu.facet.dev.deviceclass.resource.k8s.io/devices=1, used: vgpu.facet.dev.deviceclass.resource.k8s.io/devices=4, limited: vgpu.facet.dev.deviceclass.resource.k8s.io/devices=4")
		// A profile class is not counted under mig.facet.dev: it needs its own line.
		refused(create("by-profile", "mig-1g.10gb.facet.dev", nil), "claim through a profile class",
			"limited: mig-1g.10gb.facet.dev.deviceclass.resource.k8s.io/devices=0")
		// A whole GPU through a claim is also counted as requests.nvidia.com/gpu.
		refused(create("whole", "gpu.facet.dev", nil), "whole-GPU claim",
			"limited: gpu.facet.dev.deviceclass.resource.k8s.io/devices=0", "requests.nvidia.com/gpu=0")

		// A pod asking nvidia.com/gpu is refused when it is created.
		_, err := e.client.CoreV1().Pods(namespace).Create(ctx, extendedResourcePod("plain-gpu-quota", "nvidia.com/gpu"), metav1.CreateOptions{})
		refused(err, "pod asking nvidia.com/gpu", "requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=0")

		// A pod asking nvidia.com/mig-1g.10gb is let in (the quota has no
		// line for that resource); the claim the scheduler makes for it is
		// refused, so the pod stays Pending.
		if _, err := e.client.CoreV1().Pods(namespace).Create(ctx, extendedResourcePod("plain-mig-quota", "nvidia.com/mig-1g.10gb"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitEventLogged(t, "plain-mig-quota", "FailedScheduling", "mig-1g.10gb.facet.dev.deviceclass.resource.k8s.io/devices")

		// A pod whose template's claim is over the quota: the claim is
		// never created.
		kubectl(t, "apply", "-f", filepath.Join(e.repo, "demo", "mig", "one-1g10gb.yaml"))
		waitEventLogged(t, "one-1g10gb", "FailedResourceClaimCreation", "exceeded quota: facet-devices")
		for _, pod := range []string{"plain-mig-quota", "one-1g10gb"} {
			pd, err := e.client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
			if err != nil || pd.Status.Phase != corev1.PodPending || pd.Spec.NodeName != "" {
				t.Errorf("%s: %v, phase %s, node %q: want Pending, unscheduled", pod, err, pd.Status.Phase, pd.Spec.NodeName)
			}
		}
		if n := len(simInstances(t)); n != 0 {
			t.Errorf("%d MIG instances carved", n)
		}
	})
}

// waitEventLogged is waitEvent that logs the event's message.
func waitEventLogged(t *testing.T, pod, reason, contains string) {
	t.Helper()
	waitFor(t, reason+" event for "+pod, 2*time.Minute, func() (bool, error) {
		evs, err := e.client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == reason && strings.Contains(ev.Message, contains) {
				t.Logf("%s: %s event: %s", pod, reason, ev.Message)
				return true, nil
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		return false, fmt.Errorf("events %v", seen)
	})
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// applyYAMLErr applies a manifest given inline and returns kubectl's output
// and error, for manifests that should be refused.
func applyYAMLErr(t testing.TB, manifest string) (string, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return kubectlErr("apply", "-f", path)
}
