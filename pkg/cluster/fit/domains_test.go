package fit

import (
	"bytes"
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/internal/occupancy/occtest"
	"github.com/facet-gpu/facet/pkg/cluster/computedomain"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/features"
)

const fabric = "5e1c7a44-0f1b-4b8e-9c1d-2a3b4c5d6e7f"

// channelClass is the DeviceClass of IMEX channels, as the chart ships it.
var channelClass = &resourceapi.DeviceClass{
	ObjectMeta: metav1.ObjectMeta{Name: computedomain.DeviceClass},
	Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: `device.driver == "gpu.facet.dev" && device.attributes["gpu.facet.dev"].type == "imex-channel"`}}}},
}

func trainDomain(name string, n int32, clique string) *v1alpha1.ComputeDomain {
	cd := &v1alpha1.ComputeDomain{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, UID: types.UID("uid-" + name)},
		Spec:       v1alpha1.ComputeDomainSpec{NumNodes: n, Channel: v1alpha1.ComputeDomainChannelSpec{ResourceClaimTemplate: v1alpha1.ComputeDomainResourceClaimTemplate{Name: name + "-channel"}}},
	}
	cd.Status.Clique = clique
	return cd
}

// domainClaim is the claim the resourceclaim controller makes for pod from
// the domain's channel template, pinned to clique id.
func domainClaim(t *testing.T, cd *v1alpha1.ComputeDomain, id int64, name string) *resourceapi.ResourceClaim {
	t.Helper()
	tpl, err := computedomain.Template(cd, occupancy.Clique{Name: cd.Status.Clique, ClusterUUID: fabric, CliqueID: id})
	if err != nil {
		t.Fatal(err)
	}
	c := FromTemplate(tpl, name)
	c.Namespace = cd.Namespace
	return c
}

// TestCheckComputeDomain: a pod of a domain fits only on a node of the
// domain's clique whose channel is free; elsewhere the explanation names
// the node's clique or the channel's holder and its domain, and the
// domain notes name the domain's clique and its free channels.
func TestCheckComputeDomain(t *testing.T) {
	var slices []*resourceapi.ResourceSlice
	for _, n := range []struct {
		name   string
		clique int64
	}{{"n1", 1}, {"n2", 2}, {"n3", 1}} {
		slices = append(slices, occtest.WithChannel(occtest.Slices(t, occtest.Node{Name: n.name, Model: "H100-SXM5-80GB", GPUs: 1}), fabric, n.clique)...)
	}
	slices = append(slices, occtest.Slices(t, occtest.Node{Name: "n4", Model: "H100-SXM5-80GB", GPUs: 1})...)
	train := trainDomain("train", 2, fabric+".1")
	other := trainDomain("other", 1, fabric+".1")
	held := domainClaim(t, other, 1, "other-0")
	held.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n3", "imex-channel")}}}
	in := Input{Slices: slices, Classes: append(classes(t), channelClass), Claims: []*resourceapi.ResourceClaim{held},
		Features: FeaturesOf(features.AllOn("test")), Domains: []v1alpha1.ComputeDomain{*train, *other}}
	pod := domainClaim(t, train, 1, "worker-1-channel")
	res, err := Check(context.Background(), in, "", []*resourceapi.ResourceClaim{pod})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	Write(&out, res)
	t.Logf("\n%s", out.String())
	fits := map[string]bool{}
	for _, r := range res {
		fits[r.Node] = r.Fits
	}
	if !fits["n1"] || fits["n2"] || fits["n3"] || fits["n4"] {
		t.Errorf("fits %v, want n1 only", fits)
	}
	for _, want := range []string{
		"fits on node n1:\n  ml/worker-1-channel channel: imex-channel",
		"node n2 is in clique " + fabric + ".2, not the domain's clique " + fabric + ".1",
		"imex-channel: held by ml/other-0 (ComputeDomain ml/other) (one channel claim of one ComputeDomain per node)",
		"node n4 publishes no IMEX channel",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the explanation lacks %q", want)
		}
	}

	// The domain's clique full: its notes say so.
	full := domainClaim(t, other, 1, "other-1")
	full.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", "imex-channel")}}}
	in.Claims = append(in.Claims, full)
	unplaced := trainDomain("big", 9, "")
	unplaced.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionCliqueAssigned, Status: metav1.ConditionFalse, Message: "no node publishes an IMEX channel"}}
	in.Domains = append(in.Domains, *unplaced)
	ghost := trainDomain("ghost", 1, fabric+".1")
	notes, err := DomainNotes(in, []*resourceapi.ResourceClaim{pod, domainClaim(t, unplaced, 1, "big-0"), domainClaim(t, ghost, 1, "ghost-0"), ask("gpu.facet.dev", nil)})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ComputeDomain ml/train (numNodes 2) is pinned to clique " + fabric + ".1: 0 of its 2 nodes' IMEX channels free (none)",
		"ComputeDomain ml/big (numNodes 9) has no clique: no node publishes an IMEX channel",
		"ml/ghost-0: its channel config names ComputeDomain ml/ghost (UID uid-ghost), which does not exist: the kubelet plugin refuses the claim",
	}
	if strings.Join(notes, "\n") != strings.Join(want, "\n") {
		t.Errorf("notes\n%s\nwant\n%s", strings.Join(notes, "\n"), strings.Join(want, "\n"))
	}
}

// TestPodClaimsWith: a template not in the file comes from the source; one
// in neither fails naming the claim entry.
func TestPodClaimsWith(t *testing.T) {
	s, err := Decode(strings.NewReader(`
apiVersion: v1
kind: Pod
metadata: {name: worker-0, namespace: ml}
spec:
  containers: [{name: c, image: busybox}]
  resourceClaims:
  - {name: channel, resourceClaimTemplateName: train-channel}
`))
	if err != nil {
		t.Fatal(err)
	}
	cd := trainDomain("train", 2, fabric+".1")
	tpl, err := computedomain.Template(cd, occupancy.Clique{Name: cd.Status.Clique, ClusterUUID: fabric, CliqueID: 1})
	if err != nil {
		t.Fatal(err)
	}
	source := func(ns, name string) (*resourceapi.ResourceClaimTemplate, error) {
		if ns == "ml" && name == "train-channel" {
			return tpl, nil
		}
		return nil, context.Canceled
	}
	claims, _, err := s.PodClaimsWith(s.Pods[0], source)
	if err != nil || len(claims) != 1 || claims[0].Name != "worker-0-channel" || computedomain.ChannelConfigOf(claims[0]) == nil {
		t.Fatalf("claims %v, %v", claims, err)
	}
	if _, _, err := s.PodClaims(s.Pods[0]); err == nil || !strings.Contains(err.Error(), "ResourceClaimTemplate train-channel is not in the file") {
		t.Errorf("without a source: %v", err)
	}
	s.Pods[0].Spec.ResourceClaims[0].ResourceClaimTemplateName = ptrTo("absent")
	if _, _, err := s.PodClaimsWith(s.Pods[0], source); err == nil || !strings.Contains(err.Error(), "pod worker-0: claim channel:") {
		t.Errorf("absent everywhere: %v", err)
	}
}

func ptrTo(s string) *string { return &s }
