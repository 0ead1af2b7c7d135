package fit

import (
	"context"
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// FeaturesOf is the allocator a scheduler with these gates runs: the beta
// features of 1.35 (on by default) plus the alpha ones the cluster
// enforces.
func FeaturesOf(s features.Set) structured.Features {
	return structured.Features{
		PrioritizedList:        true,
		DeviceBindingAndStatus: true,
		AdminAccess:            true,
		PartitionableDevices:   s.Has(features.PartitionableDevices),
		ConsumableCapacity:     s.Has(features.ConsumableCapacity),
		DeviceTaints:           s.Has(features.DeviceTaints),
	}
}

// Input is the cluster as its scheduler sees it.
type Input struct {
	Slices  []*resourceapi.ResourceSlice
	Classes []*resourceapi.DeviceClass
	// Claims are the cluster's claims; those with status.allocation hold
	// their devices.
	Claims   []*resourceapi.ResourceClaim
	Features structured.Features
	// Profiles sizes MIG placements for the explanations; nil: the MIG
	// tables Facet knows.
	Profiles occupancy.ProfileTable
	// Domains are the cluster's ComputeDomains (occupancy.ReadDomains),
	// for the explanation of a channel claim: its domain's clique.
	Domains []v1alpha1.ComputeDomain
}

// NodeResult says whether the claims fit on one node.
type NodeResult struct {
	Node string
	Fits bool
	// Devices are the allocation where they fit: "ns/claim request: device".
	Devices []string
	// Why are the reasons, where they do not fit, one per request and GPU.
	Why []string
}

// Check runs the upstream allocator for the claims (together, as for one
// pod) on each node with Facet devices, or only on node when it is set,
// against what the cluster's claims already hold. Where they do not fit it
// explains why from the occupancy model, since the allocator says only
// that they do not.
func Check(ctx context.Context, in Input, node string, claims []*resourceapi.ResourceClaim) ([]NodeResult, error) {
	profiles := in.Profiles
	if profiles == nil {
		profiles = occupancy.KnownProfiles()
	}
	occ, err := occupancy.Build(in.Slices, in.Claims, node, profiles)
	if err != nil {
		return nil, err
	}
	cluster := NewCluster(in.Slices, in.Classes)
	cluster.Features = &in.Features
	for _, c := range in.Claims {
		if c.Status.Allocation != nil {
			cluster.Record(c.Status.Allocation)
		}
	}
	// The claims are asked about as if new: a claim read from the cluster
	// may carry its own allocation, which would only count against itself.
	fresh := make([]*resourceapi.ResourceClaim, len(claims))
	for i, c := range claims {
		fresh[i] = c.DeepCopy()
		fresh[i].Status = resourceapi.ResourceClaimStatus{}
	}
	nodes := occ.Nodes()
	if node != "" {
		nodes = []string{node}
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("no ResourceSlices of driver %s: no node offers Facet GPUs", names.Driver)
	}
	e := explainer{occ: occ, cluster: cluster, domains: in.Domains, claims: in.Claims, cache: cel.NewCache(100, cel.Features{EnableConsumableCapacity: in.Features.ConsumableCapacity})}
	var out []NodeResult
	for _, n := range nodes {
		r := NodeResult{Node: n}
		results, err := cluster.Try(ctx, n, fresh...)
		switch {
		case err != nil:
			r.Why = []string{fmt.Sprintf("the allocator failed: %v", err)}
		case results != nil:
			r.Fits = true
			for i, res := range results {
				for _, d := range res.Devices.Results {
					desc := fmt.Sprintf("%s/%s %s: %s", fresh[i].Namespace, fresh[i].Name, d.Request, d.Device)
					if d.ShareID != nil {
						desc += " (share" + consumed(d.ConsumedCapacity) + ")"
					}
					r.Devices = append(r.Devices, desc)
				}
			}
		default:
			r.Why, err = e.explain(ctx, n, fresh)
			if err != nil {
				return nil, err
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// consumed formats a share's consumed capacity, sorted by name.
func consumed(c map[resourceapi.QualifiedName]resource.Quantity) string {
	var parts []string
	for k, q := range c {
		parts = append(parts, fmt.Sprintf(" %s %s", k, q.String()))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// Write prints node results for an operator.
func Write(w interface{ Write([]byte) (int, error) }, results []NodeResult) {
	fits := 0
	for _, r := range results {
		if r.Fits {
			fits++
		}
	}
	if fits == 0 {
		fmt.Fprintf(w, "does not fit on any of %d node(s)\n", len(results))
	} else {
		fmt.Fprintf(w, "fits on %d of %d node(s)\n", fits, len(results))
	}
	for _, r := range results {
		if r.Fits {
			fmt.Fprintf(w, "\nfits on node %s:\n", r.Node)
			for _, d := range r.Devices {
				fmt.Fprintf(w, "  %s\n", d)
			}
			continue
		}
		fmt.Fprintf(w, "\ndoes not fit on node %s:\n", r.Node)
		for _, why := range r.Why {
			fmt.Fprintf(w, "  %s\n", why)
		}
	}
}
