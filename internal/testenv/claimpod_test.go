package testenv

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

func TestClaimsPod(t *testing.T) {
	var p corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(ClaimsPod("trainer", "facet-demo", PodClaim{"gpu", "train-gpu"}, PodClaim{"channel", "train-channel"})), &p); err != nil {
		t.Fatal(err)
	}
	if got := p.Spec.Containers[0].Resources.Claims; len(got) != 2 || got[0].Name != "gpu" || got[1].Name != "channel" {
		t.Errorf("container claims %v", got)
	}
	if got := p.Spec.ResourceClaims; len(got) != 2 || *got[1].ResourceClaimTemplateName != "train-channel" {
		t.Errorf("resourceClaims %v", got)
	}
	var one corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(ClaimPod("p", "ns", "req", "tmpl")), &one); err != nil || len(one.Spec.ResourceClaims) != 1 || one.Spec.Containers[0].Resources.Claims[0].Name != "req" {
		t.Errorf("ClaimPod: %+v, %v", one.Spec, err)
	}
}
