package fit

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/computedomain"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
)

// domain finds the ComputeDomain a channel config names in namespace ns.
func (e explainer) domain(ns string, cfg *v1alpha1.ComputeDomainChannelConfig) *v1alpha1.ComputeDomain {
	for i := range e.domains {
		d := &e.domains[i]
		if d.Namespace == ns && d.Name == cfg.DomainName && string(d.UID) == cfg.DomainUID {
			return d
		}
	}
	return nil
}

// domainOf names the ComputeDomain of a claim that holds a channel, where
// the claims read say: " (ComputeDomain ns/name)".
func (e explainer) domainOf(holder occupancy.Claim) string {
	for _, c := range e.claims {
		if c.Namespace != holder.Namespace || c.Name != holder.Name {
			continue
		}
		if cfg := computedomain.ChannelConfigOf(c); cfg != nil {
			return fmt.Sprintf(" (ComputeDomain %s/%s)", c.Namespace, cfg.DomainName)
		}
	}
	return ""
}

// nodeChannel says why no IMEX channel of the node matches a channel
// request: the node has none, or its clique is not the domain's.
func (e explainer) nodeChannel(node string, r request) string {
	var clique string
	for _, ch := range e.occ.Channels {
		if ch.Node == node {
			clique = ch.Clique
		}
	}
	want := ""
	if r.channel != nil {
		if d := e.domain(r.ns, r.channel); d != nil {
			want = d.Status.Clique
		}
	}
	switch {
	case len(e.occ.NodeChannels(node)) == 0:
		return fmt.Sprintf("node %s publishes no IMEX channel (no %s device: its GPUs report no NVLink fabric clique, or its driver registers no IMEX channels)", node, occupancy.TypeIMEXChannel)
	case clique == "":
		return fmt.Sprintf("node %s's IMEX channel has no fabric clique", node)
	case want != "" && clique != want:
		return fmt.Sprintf("node %s is in clique %s, not the domain's clique %s", node, clique, want)
	}
	return fmt.Sprintf("node %s's IMEX channel is in clique %s; the request's selectors ask for another", node, clique)
}

// DomainNotes say, for each ComputeDomain channel claim among claims, its
// domain's clique and that clique's free IMEX channels, or why it has
// none: what `facetctl fit` prints under the nodes when a pod of a domain
// does not fit. Empty for claims of no domain.
func DomainNotes(in Input, claims []*resourceapi.ResourceClaim) ([]string, error) {
	occ, err := occupancy.Build(in.Slices, in.Claims, "", occupancy.KnownProfiles())
	if err != nil {
		return nil, err
	}
	e := explainer{occ: occ, domains: in.Domains}
	var out []string
	for _, c := range claims {
		cfg := computedomain.ChannelConfigOf(c)
		if cfg == nil {
			continue
		}
		ref := fmt.Sprintf("ComputeDomain %s/%s", c.Namespace, cfg.DomainName)
		d := e.domain(c.Namespace, cfg)
		if d == nil {
			out = append(out, fmt.Sprintf("%s/%s: its channel config names %s (UID %s), which does not exist: the kubelet plugin refuses the claim", c.Namespace, c.Name, ref, cfg.DomainUID))
			continue
		}
		if d.Status.Clique == "" {
			why := "the controller has not placed it yet"
			if cond := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionCliqueAssigned); cond != nil {
				why = cond.Message
			}
			out = append(out, fmt.Sprintf("%s (numNodes %d) has no clique: %s", ref, d.Spec.NumNodes, why))
			continue
		}
		line := fmt.Sprintf("%s (numNodes %d) is pinned to clique %s", ref, d.Spec.NumNodes, d.Status.Clique)
		found := false
		for _, q := range occ.Cliques {
			if q.Name != d.Status.Clique {
				continue
			}
			found = true
			free := strings.Join(q.Free, ", ")
			if free == "" {
				free = "none"
			}
			line += fmt.Sprintf(": %d of its %d nodes' IMEX channels free (%s)", len(q.Free), len(q.Nodes), free)
		}
		if !found {
			line += ": no node publishes an IMEX channel of that clique now"
		}
		if cond := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionCliqueAssigned); cond != nil && cond.Status != "True" {
			line += "; " + cond.Message
		}
		out = append(out, line)
	}
	return out, nil
}
