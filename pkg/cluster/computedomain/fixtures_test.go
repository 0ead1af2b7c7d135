package computedomain

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// golden compares got, as YAML, with testdata/name (rewritten with
// -update).
func golden(t *testing.T, name string, got any) {
	t.Helper()
	out, err := yaml.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if string(want) != string(out) {
		t.Errorf("%s differs (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", path, out, want)
	}
}

const (
	fabric = "5e1c7a44-0f1b-4b8e-9c1d-2a3b4c5d6e7f"
	ns     = "ml"
)

// domain is a ComputeDomain of n nodes whose template is <name>-channel.
func domain(name string, n int32) *v1alpha1.ComputeDomain {
	return &v1alpha1.ComputeDomain{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.ComputeDomainKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), Generation: 1,
			CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))},
		Spec: v1alpha1.ComputeDomainSpec{NumNodes: n, Channel: v1alpha1.ComputeDomainChannelSpec{
			ResourceClaimTemplate: v1alpha1.ComputeDomainResourceClaimTemplate{Name: name + "-channel"},
			AllocationMode:        v1alpha1.ChannelAllocationSingle,
		}},
	}
}

// pinned is the domain pinned to clique q with the condition fits says.
func pinned(cd *v1alpha1.ComputeDomain, clique string, fits bool) *v1alpha1.ComputeDomain {
	cd.Status.Clique = clique
	st := metav1.ConditionFalse
	if fits {
		st = metav1.ConditionTrue
	}
	cd.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionCliqueAssigned, Status: st, Reason: "x", Message: "x"}}
	return cd
}

// channelSlice is node's slice of its one imex-channel device in
// clique <fabric>.<clique>; clique < 0: without fabric attributes.
func channelSlice(node string, clique int64) *resourceapi.ResourceSlice {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		names.AttrType: {StringValue: ptr.To("imex-channel")},
	}
	if clique >= 0 {
		attrs[names.AttrFabricCluster] = resourceapi.DeviceAttribute{StringValue: ptr.To(fabric)}
		attrs[names.AttrFabricClique] = resourceapi.DeviceAttribute{IntValue: ptr.To(clique)}
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.facet.dev-imex"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   names.Driver,
			Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
			Devices:  []resourceapi.Device{{Name: "imex-channel", Attributes: attrs}},
		},
	}
}

// channelClaim is a claim of the domain (its template's config); on node
// it is allocated the node's channel, and reserved for pod where pod is
// set.
func channelClaim(cd *v1alpha1.ComputeDomain, name, node, pod string) *resourceapi.ResourceClaim {
	raw, _ := json.Marshal(v1alpha1.NewComputeDomainChannelConfig(cd.Name, string(cd.UID), ""))
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cd.Namespace, UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: Request, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: DeviceClass}}},
			Config: []resourceapi.DeviceClaimConfiguration{{Requests: []string{Request}, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: names.Driver, Parameters: runtime.RawExtension{Raw: raw}}}}},
		}},
	}
	if node != "" {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: Request, Driver: names.Driver, Pool: node, Device: "imex-channel"}}}}
	}
	if pod != "" {
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID("uid-" + pod)}}
	}
	return c
}

// node is a Node with an InternalIP, labelled for the domain of uid ("":
// not labelled).
func node(name, ip, uid string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if uid != "" {
		n.Labels = map[string]string{Label: uid}
	}
	if ip != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}
	}
	return n
}

// daemonPod is the domain's daemon pod on node, Ready or not, with
// restarts of its imex container.
func daemonPod(cd *v1alpha1.ComputeDomain, nodeName string, ready bool, restarts int32) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: DaemonSetName(cd) + "-" + nodeName, Namespace: "facet-system", UID: types.UID("pod-" + nodeName),
			Labels: map[string]string{Label: string(cd.UID)}},
		Spec: corev1.PodSpec{NodeName: nodeName},
		Status: corev1.PodStatus{
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: Container, RestartCount: restarts,
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}}},
		},
	}
}

// claimFrom is the claim the resourceclaim controller makes from tpl.
func claimFrom(tpl *resourceapi.ResourceClaimTemplate) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: tpl.Namespace, Name: "pod-channel", Labels: tpl.Spec.Labels}, Spec: tpl.Spec.Spec}
}

func equalYAML(t *testing.T, a, b any) bool {
	t.Helper()
	x, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(x) == string(y)
}
