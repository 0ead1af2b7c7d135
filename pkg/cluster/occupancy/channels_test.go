package occupancy

import (
	"bytes"
	"io"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/internal/occupancy/occtest"
)

const fabric = "5e1c7a44-0f1b-4b8e-9c1d-2a3b4c5d6e7f"

// rack is five one-GPU trays: n1-n3 in clique 1, n4 in clique 2, n5's
// channel without a clique.
func rack(t *testing.T) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, n := range []struct {
		name   string
		clique int64
	}{{"n1", 1}, {"n2", 1}, {"n3", 1}, {"n4", 2}, {"n5", -1}} {
		out = append(out, occtest.WithChannel(occtest.Slices(t, occtest.Node{Name: n.name, Model: "H100-SXM5-80GB", GPUs: 1}), fabric, n.clique)...)
	}
	return out
}

// TestChannels: the IMEX channels and cliques from slices and claims: a
// held channel is not free, a tainted one neither, a channel without
// fabric attributes has no clique; Build models them beside the GPUs
// (a channel has no GPU index, which Build requires of a GPU's devices).
func TestChannels(t *testing.T) {
	slices := rack(t)
	// n3's channel is tainted.
	for _, s := range slices {
		if s.Spec.Pool.Name == "n3" {
			for i := range s.Spec.Devices {
				if s.Spec.Devices[i].Name == "imex-channel" {
					s.Spec.Devices[i].Taints = []resourceapi.DeviceTaint{{Key: "gpu.facet.dev/unhealthy", Value: "fabric", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
				}
			}
		}
	}
	claims := []*resourceapi.ResourceClaim{occtest.Allocated("ml/train-0", occtest.Result("n1", "imex-channel")), occtest.Allocated("ml/gpu", occtest.Result("n2", "gpu-0"))}
	c, err := Build(slices, claims, "", KnownProfiles())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range c.Cliques {
		got = append(got, q.Name+" nodes="+strings.Join(q.Nodes, ",")+" free="+strings.Join(q.Free, ","))
	}
	want := []string{fabric + ".1 nodes=n1,n2,n3 free=n2", fabric + ".2 nodes=n4 free=n4"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("cliques\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(c.GPUs) != 5 || len(c.Channels) != 5 {
		t.Errorf("%d GPUs, %d channels; want 5 and 5", len(c.GPUs), len(c.Channels))
	}
	if ch := c.Channel("n1", "imex-channel"); ch == nil || ch.Holder == nil || ch.Holder.String() != "ml/train-0" {
		t.Errorf("n1's channel: %+v", ch)
	}
	if d := c.NodeChannels("n1"); len(d) != 1 || len(d[0].Holders) != 1 {
		t.Errorf("n1's channel devices: %+v", d)
	}
	if ch := c.Channel("n5", "imex-channel"); ch == nil || ch.Clique != "" {
		t.Errorf("n5's channel: %+v", ch)
	}
	// One node's view.
	one, err := Build(slices, claims, "n4", KnownProfiles())
	if err != nil {
		t.Fatal(err)
	}
	if len(one.Channels) != 1 || len(one.Cliques) != 1 || one.Cliques[0].Name != fabric+".2" {
		t.Errorf("n4 alone: channels %v, cliques %v", one.Channels, one.Cliques)
	}
}

// TestTableDomains: the sections of cliques and compute domains, in the
// table and in the picture alike.
func TestTableDomains(t *testing.T) {
	slices := rack(t)
	claims := []*resourceapi.ResourceClaim{occtest.Allocated("ml/train-0", occtest.Result("n1", "imex-channel"))}
	c, err := Build(slices, claims, "", KnownProfiles())
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	c.Domains = DomainsOf([]v1alpha1.ComputeDomain{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train"}, Spec: v1alpha1.ComputeDomainSpec{NumNodes: 2},
			Status: v1alpha1.ComputeDomainStatus{Status: v1alpha1.ComputeDomainNotReady, Clique: fabric + ".1", Nodes: []v1alpha1.ComputeDomainNode{
				{Name: "n2", Index: 1, Status: v1alpha1.ComputeDomainNotReady}, {Name: "n1", Index: 0, Status: v1alpha1.ComputeDomainReady}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "big"}, Spec: v1alpha1.ComputeDomainSpec{NumNodes: 8},
			Status: v1alpha1.ComputeDomainStatus{Conditions: []metav1.Condition{{Type: v1alpha1.ConditionCliqueAssigned, Status: metav1.ConditionFalse, Message: "no clique has 8 IMEX channels available"}}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "old", DeletionTimestamp: &now}, Spec: v1alpha1.ComputeDomainSpec{NumNodes: 1},
			Status: v1alpha1.ComputeDomainStatus{Status: v1alpha1.ComputeDomainReady, Clique: fabric + ".2", Nodes: []v1alpha1.ComputeDomainNode{{Name: "n4", Status: v1alpha1.ComputeDomainReady}}}},
	})
	for name, render := range map[string]func(io.Writer, *Cluster) error{"table": Table, "picture": Picture} {
		var out bytes.Buffer
		if err := render(&out, c); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s:\n%s", name, out.String())
		for _, want := range []string{
			"NVLink fabric cliques (IMEX channels, one per node; a ComputeDomain runs in one clique):",
			fabric + ".1  2 of 3 channels free  n2 n3",
			fabric + ".2  1 of 1 channels free  n4",
			"  and 1 channel(s) without fabricClusterUUID and fabricCliqueID, in no clique",
			"DOMAIN    CLIQUE",
			"ml/big    -",
			"0/8    -: no clique has 8 IMEX channels available",
			"ml/old    " + fabric + ".2  1/1    Ready, deleted: waiting for its pods",
			"ml/train  " + fabric + ".1  1/2    NotReady",
			"n1, n2 (not ready)",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("the %s lacks %q", name, want)
			}
		}
	}
}
