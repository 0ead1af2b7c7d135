package multinode

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSpread checks that pods whose whole-GPU claims every GPU node can
// serve are placed as kube-scheduler scores and filters the nodes, and that
// each claim is allocated from the pool of the node its pod landed on.
//
// The rows build on each other: scoring alone spreads the pods (the
// NodeResourcesFit plugin's LeastAllocated score counts 100m CPU and
// 200 MiB for a pod without requests, and the nodes are alike), a preferred
// node affinity outweighs that, and a spread constraint or pod
// (anti-)affinity outweighs both. So a row passes only if that row's rule
// decided the placement.
func TestSpread(t *testing.T) {
	gpuHosts := []string{h100.name, a100.name, l4.name}
	// Only the GPU nodes count as topology domains: spreading honours the
	// pod's required node affinity, and localhost can serve no claim.
	onGPUNodes := func(pod *corev1.Pod) {
		if pod.Spec.Affinity == nil {
			pod.Spec.Affinity = &corev1.Affinity{}
		}
		if pod.Spec.Affinity.NodeAffinity == nil {
			pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
		}
		pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: gpuHosts}},
		}}}
	}
	preferH100 := func(pod *corev1.Pod) {
		onGPUNodes(pod)
		pod.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.PreferredSchedulingTerm{{
			Weight: 100,
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{h100.name},
			}}},
		}}
	}
	const pending = "" // the key of pods that stay Pending
	for _, tc := range []struct {
		name string
		pods int
		edit func(pod *corev1.Pod, sel *metav1.LabelSelector)
		// want is how many pods each node gets; together: all pods on
		// one GPU node, whichever.
		want     map[string]int
		together bool
	}{
		{
			name: "scoring alone: 6 pods, 2 per node", pods: 6,
			edit: func(pod *corev1.Pod, _ *metav1.LabelSelector) { onGPUNodes(pod) },
			want: map[string]int{h100.name: 2, a100.name: 2, l4.name: 2},
		},
		{
			name: "preferred node affinity outscores spreading: 6 pods on node-h100", pods: 6,
			edit: func(pod *corev1.Pod, _ *metav1.LabelSelector) { preferH100(pod) },
			want: map[string]int{h100.name: 6},
		},
		{
			name: "topology spread, maxSkew 1, over preferred node affinity: 2 per node", pods: 6,
			edit: func(pod *corev1.Pod, sel *metav1.LabelSelector) {
				preferH100(pod)
				pod.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
					MaxSkew: 1, TopologyKey: corev1.LabelHostname,
					WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: sel,
				}}
			},
			want: map[string]int{h100.name: 2, a100.name: 2, l4.name: 2},
		},
		{
			name: "pod affinity: 4 pods together on one node", pods: 4,
			edit: func(pod *corev1.Pod, sel *metav1.LabelSelector) {
				onGPUNodes(pod)
				pod.Spec.Affinity.PodAffinity = &corev1.PodAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{LabelSelector: sel, TopologyKey: corev1.LabelHostname}},
				}
			},
			together: true,
		},
		{
			name: "pod anti-affinity: 4 pods, 1 per node, the fourth Pending", pods: 4,
			edit: func(pod *corev1.Pod, sel *metav1.LabelSelector) {
				preferH100(pod)
				pod.Spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{LabelSelector: sel, TopologyKey: corev1.LabelHostname}},
				}
			},
			want: map[string]int{h100.name: 1, a100.name: 1, l4.name: 1, pending: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			labels := map[string]string{"app": "spread"}
			sel := &metav1.LabelSelector{MatchLabels: labels}
			for i := range tc.pods {
				createPod(t, ns, fmt.Sprintf("spread-%d", i), request{class: "gpu.facet.dev"}, func(pod *corev1.Pod) {
					pod.Labels = labels
					tc.edit(pod, sel)
				})
			}
			got := map[string]int{}
			devices := map[string][]string{}
			for i := range tc.pods {
				pod := waitSettled(t, ns, fmt.Sprintf("spread-%d", i))
				if pod.Status.Phase != corev1.PodRunning {
					got[pending]++
					continue
				}
				got[pod.Spec.NodeName]++
				for _, d := range checkOn(t, pod, pod.Spec.NodeName) {
					if slices.Contains(devices[pod.Spec.NodeName], d) {
						t.Errorf("device %s of %s allocated twice", d, pod.Spec.NodeName)
					}
					devices[pod.Spec.NodeName] = append(devices[pod.Spec.NodeName], d)
				}
			}
			t.Logf("pods per node %v, devices %v", got, devices)
			switch {
			case tc.together:
				if len(got) != 1 || got[pending] != 0 {
					t.Errorf("pods per node %v, want all %d on one node", got, tc.pods)
				}
			case !maps.Equal(got, tc.want):
				t.Errorf("pods per node %v, want %v", got, tc.want)
			}
		})
	}
}

// waitSettled waits until the pod runs or the scheduler has found no node
// for it, and returns it.
func waitSettled(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	waitFor(t, "pod "+ns+"/"+name+" Running or unschedulable", 2*time.Minute, func() (bool, error) {
		pod = getPod(t, ns, name)
		if pod.Status.Phase == corev1.PodRunning {
			return true, nil
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, fmt.Errorf("phase %s on %q, conditions %v", pod.Status.Phase, pod.Spec.NodeName, pod.Status.Conditions)
	})
	return pod
}
