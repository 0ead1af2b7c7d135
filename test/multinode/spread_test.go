package multinode

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSpread checks that pods whose whole-GPU claims every GPU node can
// serve are placed as the scheduler's spreading rules say, and that each
// claim is allocated from the pool of the node its pod landed on. The rules
// decide: without them, pods without CPU or memory requests score the same
// on every node and land wherever the scheduler's tie-break puts them.
func TestSpread(t *testing.T) {
	gpuHosts := []string{h100.name, a100.name, l4.name}
	// Only the GPU nodes count as domains: topology spreading honours the
	// pod's node affinity, and localhost can serve no claim.
	onGPUNodes := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: gpuHosts}},
		}}},
	}}
	for _, tc := range []struct {
		name string
		pods int
		// perNode is how many pods each GPU node must get.
		perNode int
		spread  func(pod *corev1.Pod, selector *metav1.LabelSelector)
	}{
		{
			name: "topology spread, maxSkew 1: 6 pods, 2 per node", pods: 6, perNode: 2,
			spread: func(pod *corev1.Pod, sel *metav1.LabelSelector) {
				pod.Spec.Affinity = onGPUNodes.DeepCopy()
				pod.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
					MaxSkew: 1, TopologyKey: corev1.LabelHostname,
					WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: sel,
				}}
			},
		},
		{
			name: "pod anti-affinity: 3 pods, 1 per node", pods: 3, perNode: 1,
			spread: func(pod *corev1.Pod, sel *metav1.LabelSelector) {
				pod.Spec.Affinity = onGPUNodes.DeepCopy()
				pod.Spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{LabelSelector: sel, TopologyKey: corev1.LabelHostname}},
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			labels := map[string]string{"app": "spread"}
			sel := &metav1.LabelSelector{MatchLabels: labels}
			for i := range tc.pods {
				createPod(t, ns, fmt.Sprintf("spread-%d", i), request{class: "gpu.facet.dev"}, func(pod *corev1.Pod) {
					pod.Labels = labels
					tc.spread(pod, sel)
				})
			}
			perNode := map[string]int{}
			devices := map[string][]string{}
			for i := range tc.pods {
				pod := waitRunning(t, ns, fmt.Sprintf("spread-%d", i))
				perNode[pod.Spec.NodeName]++
				got := checkOn(t, pod, pod.Spec.NodeName)
				for _, d := range got {
					if slices.Contains(devices[pod.Spec.NodeName], d) {
						t.Errorf("device %s of %s allocated twice", d, pod.Spec.NodeName)
					}
				}
				devices[pod.Spec.NodeName] = append(devices[pod.Spec.NodeName], got...)
			}
			t.Logf("pods per node %v, devices %v", perNode, devices)
			want := map[string]int{}
			for _, h := range gpuHosts {
				want[h] = tc.perNode
			}
			if !maps.Equal(perNode, want) {
				t.Errorf("pods per node %v, want %v", perNode, want)
			}
		})
	}
}
