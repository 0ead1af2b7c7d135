package helm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/testenv"
	"github.com/facet-gpu/facet/pkg/cluster/preempt/controller"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// TestLivePreemptorPolicies installs facet-preemptor's service account,
// RBAC and ValidatingAdmissionPolicies as the chart renders them, and acts
// as the preemptor with a token of that service account. The API server
// refuses its real evictions (not dry runs) in kube-system, in the release
// namespace, in preemptor.protectedNamespaces, of a DaemonSet's pod (the
// DaemonSet controller's own), of a static pod, and without the label the
// pod check selects by; it lets through the eviction of an ordinary pod,
// and an administrator's eviction of the DaemonSet's pod. Through
// pods/status the preemptor may set nominatedNodeName, and nothing else;
// RBAC gives it no get of a pod.
func TestLivePreemptorPolicies(t *testing.T) {
	l := liveCluster(t)
	ctx := context.Background()
	const ns, release = "facet-helm-preemptor", "facet-helmtest"
	const victims, protected = "facet-helm-victims", "facet-helm-protected"
	for _, n := range []string{ns, victims, protected} {
		l.Namespace(t, n)
	}
	objs := renderAs(t, values(t, `
deviceClasses: {enabled: false}
admission: {policies: {enabled: false}, webhook: {enabled: false}}
preemptor: {enabled: true, protectedNamespaces: [`+protected+`]}
`), release, ns)
	var install []object
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/component"] == "preemptor" && o.GetKind() != "Deployment" {
			install = append(install, o)
		}
	}
	manifest := stream(t, install)
	t.Cleanup(func() { _, _ = l.Run(manifest, "delete", "--ignore-not-found", "-f", "-") })
	l.Must(t, manifest, "apply", "-f", "-")
	sa := release + "-preemptor"
	tok, err := l.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](900)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(l.Config)
	cfg.BearerToken = tok.Status.Token
	preemptor := kubernetes.NewForConfigOrDie(cfg)

	// pending makes a pod that no node admits: it never runs, and its
	// eviction is a plain delete (no PodDisruptionBudget).
	pending := func(t *testing.T, namespace, name string, edit func(*corev1.Pod)) *corev1.Pod {
		t.Helper()
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: corev1.PodSpec{
				NodeSelector:                  map[string]string{"facet-helm-test/nowhere": "true"},
				AutomountServiceAccountToken:  ptr.To(false),
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers:                    []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10", ImagePullPolicy: corev1.PullNever}},
			},
		}
		if edit != nil {
			edit(p)
		}
		p, err := l.Client.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = l.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
		return p
	}
	system := pending(t, metav1.NamespaceSystem, "facet-helm-preemptor-test", nil)
	own := pending(t, ns, "facet", nil)
	prot := pending(t, protected, "monitor", nil)
	plain := pending(t, victims, "plain", nil)
	// It asks for a claim from a template that does not exist: it stays
	// pending, and it has a claim whose status could be written.
	nominee := pending(t, victims, "nominee", func(p *corev1.Pod) {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("facet-helm-no-such-template")}}
	})
	// A static pod's mirror: the annotation, on a node (the API server
	// asks for one with the annotation; this name is no node).
	mirror := pending(t, victims, "static", func(p *corev1.Pod) {
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "facet-helm-test"}
		p.Spec.NodeSelector = nil
		p.Spec.NodeName = "facet-helm-no-such-node"
	})

	// A real DaemonSet; its pod, made by the DaemonSet controller, need not
	// run.
	ds, err := l.Client.AppsV1().DaemonSets(victims).Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
				Spec: corev1.PodSpec{
					AutomountServiceAccountToken:  ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers:                    []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10", ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var agent *corev1.Pod
	testenv.WaitFor(t, "the DaemonSet's pod", time.Minute, func() (bool, error) {
		pods, err := l.Client.CoreV1().Pods(victims).List(ctx, metav1.ListOptions{LabelSelector: "app=agent"})
		if err != nil {
			return false, err
		}
		for i, p := range pods.Items {
			if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == ds.UID && p.DeletionTimestamp == nil {
				agent = &pods.Items[i]
				return true, nil
			}
		}
		return false, fmt.Errorf("%d pods", len(pods.Items))
	})

	// evict asks for p's eviction as facet-preemptor does (the label, the
	// UID precondition), or without the label.
	evict := func(client kubernetes.Interface, p *corev1.Pod, labelled, dry bool) error {
		ev := &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}},
		}
		if labelled {
			ev.Labels = map[string]string{controller.EvictionLabel: controller.EvictionLabelValue}
		}
		if dry {
			ev.DeleteOptions.DryRun = []string{metav1.DryRunAll}
		}
		return client.PolicyV1().Evictions(p.Namespace).Evict(ctx, ev)
	}
	policy := func(suffix string) string {
		return fmt.Sprintf("ValidatingAdmissionPolicy '%s-preemptor-%s'", release, suffix)
	}

	// Until the policies are loaded (the pod check's also needs the API
	// server's pod informer), the preemptor could evict anything: probe
	// with dry runs only.
	testenv.WaitFor(t, "the policies enforced", time.Minute, func() (bool, error) {
		e1 := evict(preemptor, system, true, true)
		e2 := evict(preemptor, mirror, true, true)
		return e1 != nil && strings.Contains(e1.Error(), policy("evictions")) && e2 != nil && strings.Contains(e2.Error(), policy("evicted-pods")),
			fmt.Errorf("kube-system: %v; static pod: %v", e1, e2)
	})

	for _, tc := range []struct {
		name     string
		pod      *corev1.Pod
		labelled bool
		want     string
	}{
		{"in kube-system", system, true, policy("evictions") + " with binding '" + release + "-preemptor-evictions' denied request: facet-preemptor may not evict pod kube-system/facet-helm-preemptor-test: namespace kube-system is protected (kube-system, the release namespace and preemptor.protectedNamespaces: kube-system, " + ns + ", " + protected + ")."},
		{"in the release namespace", own, true, "facet-preemptor may not evict pod " + ns + "/facet: namespace " + ns + " is protected"},
		{"in a protectedNamespace", prot, true, "facet-preemptor may not evict pod " + protected + "/monitor: namespace " + protected + " is protected"},
		{"of a DaemonSet's pod", agent, true, policy("evicted-pods") + " with binding '" + release + "-preemptor-evicted-pods' denied request: facet-preemptor may not evict pod " + victims + "/" + agent.Name + ": it is controlled by DaemonSet agent, which puts it back on the same node at once."},
		{"of a static pod", mirror, true, "facet-preemptor may not evict pod " + victims + "/static: it is a static pod (annotation kubernetes.io/config.mirror)"},
		{"without the label", plain, false, "facet-preemptor's eviction of pod " + victims + "/plain lacks the label " + controller.EvictionLabel + "=" + controller.EvictionLabelValue},
	} {
		t.Run("refused: eviction "+tc.name, func(t *testing.T) {
			err := evict(preemptor, tc.pod, tc.labelled, false)
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("eviction: %v\nwant Forbidden with %q", err, tc.want)
			}
			t.Logf("refused: %v", err)
			p, err := l.Client.CoreV1().Pods(tc.pod.Namespace).Get(ctx, tc.pod.Name, metav1.GetOptions{})
			if err != nil || p.UID != tc.pod.UID || p.DeletionTimestamp != nil {
				t.Fatalf("the pod after a refused eviction: %v, %+v", err, p.ObjectMeta)
			}
		})
	}

	t.Run("an administrator's eviction of the DaemonSet's pod is not the policies' business", func(t *testing.T) {
		if err := evict(l.Client, agent, true, true); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("allowed: eviction of an ordinary pod", func(t *testing.T) {
		if err := evict(preemptor, plain, true, false); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, "the evicted pod gone", time.Minute, func() (bool, error) {
			p, err := l.Client.CoreV1().Pods(victims).Get(ctx, "plain", metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && p.UID != plain.UID) {
				return true, nil
			}
			return false, fmt.Errorf("still there: %v", err)
		})
	})

	// status patches facet-preemptor's way (a strategic merge patch of
	// pods/status with the UID as a precondition), plus more.
	status := func(p *corev1.Pod, patch string) (*corev1.Pod, error) {
		body := fmt.Sprintf(`{"metadata":{"uid":%q%s}`, p.UID, patch)
		return preemptor.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}, "status")
	}
	t.Run("allowed: nominatedNodeName of a pending pod", func(t *testing.T) {
		got, err := status(nominee, `},"status":{"nominatedNodeName":"n1"}`)
		if err != nil || got.Status.NominatedNodeName != "n1" {
			t.Fatalf("nominate: %v, %q", err, got.Status.NominatedNodeName)
		}
	})
	for _, tc := range []struct {
		name, patch string
		pod         *corev1.Pod
		want        string
	}{
		{"a label", `,"labels":{"x":"y"}},"status":{"nominatedNodeName":"n2"}`, nominee, "also changes metadata.labels."},
		{"an annotation and a finalizer", `,"annotations":{"x":"y"},"finalizers":["example.com/x"]}`, nominee, "also changes metadata.annotations, metadata.finalizers."},
		{"the phase", `},"status":{"phase":"Failed"}`, nominee, "also changes status.phase."},
		{"a condition and a claim status", `},"status":{"conditions":[{"type":"PodScheduled","status":"True"}],"resourceClaimStatuses":[{"name":"gpu","resourceClaimName":"someone-elses"}]}`, nominee, "also changes status.conditions, status.resourceClaimStatuses."},
		{"the PodScheduled condition of a scheduled pod", `},"status":{"conditions":[{"type":"PodScheduled","status":"False"}]}`, agent, "this request to pod " + victims + "/" + agent.Name + " also changes status.conditions."},
	} {
		t.Run("refused: pods/status, "+tc.name, func(t *testing.T) {
			_, err := status(tc.pod, tc.patch)
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), policy("pod-status")) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("patch %s: %v\nwant Forbidden by %s with %q", tc.patch, err, policy("pod-status"), tc.want)
			}
			t.Logf("refused: %v", err)
		})
	}

	t.Run("RBAC: list, no get", func(t *testing.T) {
		if _, err := preemptor.CoreV1().Pods(victims).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			t.Errorf("list pods: %v", err)
		}
		if _, err := preemptor.CoreV1().Pods(victims).Get(ctx, nominee.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("get pod: %v, want Forbidden", err)
		}
	})
}
