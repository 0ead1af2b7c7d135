package computedomain

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
)

// clique is a clique named <fabric>.<id> of n nodes, free of them free.
func clique(id int64, n, free int) occupancy.Clique {
	q := occupancy.Clique{Name: fabric + "." + string(rune('0'+id)), ClusterUUID: fabric, CliqueID: id}
	for i := range n {
		node := q.Name + "-n" + string(rune('a'+i))
		q.Nodes = append(q.Nodes, node)
		if i < free {
			q.Free = append(q.Free, node)
		}
	}
	return q
}

// TestChoose: best fit among the cliques with enough available channels,
// ties by name; where none fits, the most available, ties by name, and
// Fits false; other domains' reservations count against a clique.
func TestChoose(t *testing.T) {
	name := func(id int64) string { return clique(id, 0, 0).Name }
	for _, tc := range []struct {
		name      string
		cliques   []occupancy.Clique
		reserved  map[string]int
		numNodes  int
		want      string // clique name; "" none
		available int
		fits      bool
		why       string // a part of Why
	}{
		{name: "best fit: the fewest free that still hold the domain",
			cliques: []occupancy.Clique{clique(1, 18, 18), clique(2, 18, 5), clique(3, 18, 3)}, numNodes: 4,
			want: name(2), available: 5, fits: true, why: "5 of its 18 nodes' IMEX channels available, 4 needed"},
		{name: "an exact fit beats a larger one",
			cliques: []occupancy.Clique{clique(1, 8, 8), clique(2, 8, 4)}, numNodes: 4, want: name(2), available: 4, fits: true},
		{name: "ties by name",
			cliques: []occupancy.Clique{clique(3, 4, 4), clique(1, 4, 4), clique(2, 4, 4)}, numNodes: 2, want: name(1), available: 4, fits: true},
		{name: "no clique fits: the one with the most free, pods beyond stay Pending",
			cliques: []occupancy.Clique{clique(1, 4, 2), clique(2, 4, 3)}, numNodes: 4,
			want: name(2), available: 3, why: "no clique has 4 IMEX channels available: the most, 3 of 4, are in clique " + name(2)},
		{name: "no clique fits, ties by name",
			cliques: []occupancy.Clique{clique(2, 4, 1), clique(1, 4, 1)}, numNodes: 2, want: name(1), available: 1},
		{name: "reservations of domains pinned there count",
			cliques: []occupancy.Clique{clique(1, 4, 4), clique(2, 8, 6)}, reserved: map[string]int{name(1): 2}, numNodes: 3,
			want: name(2), available: 6, fits: true},
		{name: "reserved beyond free: nothing available, said so",
			cliques: []occupancy.Clique{clique(1, 4, 2)}, reserved: map[string]int{name(1): 3}, numNodes: 1,
			want: name(1), available: 0, why: "(2 free, 3 of them kept for other domains pinned there)"},
		{name: "no clique at all",
			numNodes: 1, why: "no node publishes an IMEX channel with a fabric clique"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Choose(tc.cliques, tc.reserved, tc.numNodes)
			if got.Clique.Name != tc.want || got.Available != tc.available || got.Fits != tc.fits {
				t.Errorf("Choose: clique %q available %d fits %t; want %q %d %t (%s)", got.Clique.Name, got.Available, got.Fits, tc.want, tc.available, tc.fits, got.Why)
			}
			if !strings.Contains(got.Why, tc.why) {
				t.Errorf("Why %q lacks %q", got.Why, tc.why)
			}
		})
	}
}

// TestReserved: a fitted domain pinned to a clique keeps numNodes less
// its allocated claims; deleted, unfitted and the placed domain keep none.
func TestReserved(t *testing.T) {
	q := fabric + ".1"
	a := pinned(domain("a", 4), q, true)
	b := pinned(domain("b", 2), q, true)
	unfit := pinned(domain("unfit", 3), q, false)
	deleted := pinned(domain("deleted", 5), q, true)
	deleted.DeletionTimestamp = &deleted.CreationTimestamp
	claims := []*resourceapi.ResourceClaim{
		channelClaim(a, "a-0", "n1", "p0"), channelClaim(a, "a-1", "n2", ""), channelClaim(a, "a-2", "", ""), // 2 allocated
		channelClaim(b, "b-0", "n3", "p1"), channelClaim(b, "b-1", "n4", "p2"), // all allocated
	}
	got := Reserved([]*v1alpha1.ComputeDomain{a, b, unfit, deleted}, claims, "")
	if got[q] != 2 || len(got) != 1 {
		t.Errorf("Reserved %v, want %s: 2 (a: 4 less 2 allocated)", got, q)
	}
	if got := Reserved([]*v1alpha1.ComputeDomain{a, b}, claims, a.UID); got[q] != 0 {
		t.Errorf("the domain placed reserves nothing for itself: %v", got)
	}
}

// TestClaimsOf: a domain's claims are its namespace's with its UID in the
// channel config; other configs, other domains and bad configs are not.
func TestClaimsOf(t *testing.T) {
	a, b := domain("a", 2), domain("b", 2)
	other := channelClaim(a, "elsewhere", "", "")
	other.Namespace = "team"
	gpu := channelClaim(a, "gpu", "", "")
	gpu.Spec.Devices.Config[0].Opaque.Parameters = runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"GpuConfig"}`)}
	bad := channelClaim(a, "bad", "", "")
	bad.Spec.Devices.Config[0].Opaque.Parameters = runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomainChannelConfig","domainUID":"uid-a","bogus":1}`)}
	foreign := channelClaim(a, "foreign", "", "")
	foreign.Spec.Devices.Config[0].Opaque.Driver = "other.example.com"
	claims := []*resourceapi.ResourceClaim{channelClaim(a, "a-1", "", ""), channelClaim(b, "b-0", "", ""), channelClaim(a, "a-0", "", ""), other, gpu, bad, foreign}
	var got []string
	for _, c := range ClaimsOf(a, claims) {
		got = append(got, c.Name)
	}
	if strings.Join(got, ",") != "a-0,a-1" {
		t.Errorf("ClaimsOf(a) = %v, want a-0,a-1", got)
	}
	if cfg := ChannelConfigOf(claims[0]); cfg == nil || cfg.DomainName != "a" || cfg.AllocationMode != "Single" || cfg.DomainUID != "uid-a" {
		t.Errorf("ChannelConfigOf: %+v", cfg)
	}
	if ChannelConfigOf(foreign) != nil || ChannelConfigOf(gpu) != nil || ChannelConfigOf(bad) != nil {
		t.Error("a config of another driver or kind, or one that does not decode, is no channel config")
	}
}

// TestParseClique: status.clique back into its UUID and ID.
func TestParseClique(t *testing.T) {
	for _, tc := range []struct {
		in, uuid string
		id       int64
		err      bool
	}{
		{in: fabric + ".3", uuid: fabric, id: 3},
		{in: "a.b.c.12", uuid: "a.b.c", id: 12},
		{in: "nodot", err: true},
		{in: ".1", err: true},
		{in: fabric + ".x", err: true},
		{in: fabric + ".-1", err: true},
	} {
		q, err := ParseClique(tc.in)
		if (err != nil) != tc.err || (!tc.err && (q.ClusterUUID != tc.uuid || q.CliqueID != tc.id || q.Name != tc.in)) {
			t.Errorf("ParseClique(%q) = %+v, %v", tc.in, q, err)
		}
	}
}
