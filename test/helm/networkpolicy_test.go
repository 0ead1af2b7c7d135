package helm

import (
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestNetworkPolicy: off by default; on, every pod of the chart outside the
// host's network is selected by exactly one policy, which lets it receive
// only on the ports it serves and send only to the API server (the webhook
// only with a mutator, facet-mps never).
func TestNetworkPolicy(t *testing.T) {
	if got := ofKind(render(t, values(t, "")), "NetworkPolicy"); len(got) != 0 {
		t.Fatalf("%d NetworkPolicies by default, want none", len(got))
	}
	for name, tc := range map[string]struct {
		values        string
		webhookEgress bool
	}{
		"the claim mutator (default)": {"", true},
		"no webhook mutator":          {"admission: {webhook: {mutateClaims: {enabled: false}}}", false},
	} {
		t.Run(name, func(t *testing.T) { checkNetworkPolicies(t, tc.values, tc.webhookEgress) })
	}
}

func checkNetworkPolicies(t *testing.T, extra string, webhookEgress bool) {
	objs := render(t, values(t, "networkPolicy: {enabled: true, apiServer: {cidrs: [10.0.0.1/32], ports: [6443]}}\npreemptor: {enabled: true}\n"+extra))
	var policies []*networkingv1.NetworkPolicy
	for _, o := range ofKind(objs, "NetworkPolicy") {
		np := &networkingv1.NetworkPolicy{}
		into(t, o, np)
		policies = append(policies, np)
	}
	want := map[string]struct {
		ports  []int
		egress bool
	}{"kubelet-plugin": {[]int{8081}, true}, "mps": {nil, false}, "hami-core": {nil, false}, "webhook": {[]int{8443, 8082}, webhookEgress}, "preemptor": {[]int{8080}, true}, "node-check": {nil, true}, "controller": {[]int{8080}, true}}
	for _, o := range objs {
		spec, ok := podSpecOf(t, o)
		if !ok || spec.HostNetwork {
			continue
		}
		if _, ok := want[o.GetLabels()["app.kubernetes.io/component"]]; !ok {
			t.Errorf("%s/%s: no policy decided here for component %q", o.GetKind(), o.GetName(), o.GetLabels()["app.kubernetes.io/component"])
		}
		podLabels := labels.Set(o.GetLabels())
		if o.GetKind() != "Pod" {
			podLabels = labels.Set{}
			for k, v := range o.Object["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)["labels"].(map[string]any) {
				podLabels[k] = v.(string)
			}
		}
		var selecting []*networkingv1.NetworkPolicy
		for _, np := range policies {
			if labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(podLabels) {
				selecting = append(selecting, np)
			}
		}
		if len(selecting) != 1 {
			t.Errorf("%s/%s: %d policies select its pods, want 1", o.GetKind(), o.GetName(), len(selecting))
			continue
		}
		np := selecting[0]
		w := want[podLabels["app.kubernetes.io/component"]]
		var ports []int
		for _, in := range np.Spec.Ingress {
			if len(in.From) != 0 {
				t.Errorf("%s: ingress from %v; the API server and the kubelet come from addresses the chart cannot know", np.Name, in.From)
			}
			for _, p := range in.Ports {
				ports = append(ports, p.Port.IntValue())
			}
		}
		if !slices.Equal(ports, w.ports) {
			t.Errorf("%s: ingress ports %v, want %v only", np.Name, ports, w.ports)
		}
		if got := len(np.Spec.Egress) > 0; got != w.egress {
			t.Errorf("%s: egress %v, want some: %v", np.Name, np.Spec.Egress, w.egress)
		}
		for _, e := range np.Spec.Egress {
			if len(e.Ports) != 1 || e.Ports[0].Port.IntValue() != 6443 || len(e.To) != 1 || e.To[0].IPBlock == nil || e.To[0].IPBlock.CIDR != "10.0.0.1/32" {
				t.Errorf("%s: egress %+v, want the API server's 10.0.0.1/32:6443 only", np.Name, e)
			}
		}
		if len(np.Spec.PolicyTypes) != 2 {
			t.Errorf("%s: policyTypes %v, want Ingress and Egress", np.Name, np.Spec.PolicyTypes)
		}
	}
}
