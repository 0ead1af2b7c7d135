package occupancy

import (
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// TypeIMEXChannel is the `type` attribute of the device by which a node
// offers IMEX channels to compute domains (docs/design/compute-domains.md):
// one per node whose driver registers the channels' major and whose GPUs
// report a fabric clique, published with the GPUs' fabricClusterUUID and
// fabricCliqueID.
const TypeIMEXChannel = names.KindIMEXChannel

// Channel is one node's imex-channel device and the claim that holds it.
type Channel struct {
	Node   string `json:"node"`
	Device string `json:"device"`
	// Clique is "<fabricClusterUUID>.<fabricCliqueID>"
	// (v1alpha1.CliqueName); empty where the device carries neither.
	Clique      string `json:"clique,omitempty"`
	ClusterUUID string `json:"-"`
	CliqueID    int64  `json:"-"`
	// Holder is the claim allocated the device; nil: free.
	Holder *Claim `json:"holder,omitempty"`
	// Taints are the device's taints, as "key=value:effect".
	Taints []string `json:"taints,omitempty"`
}

// Clique is one NVLink fabric clique of the cluster: the nodes whose
// imex-channel devices carry its cluster UUID and clique ID.
type Clique struct {
	// Name is "<fabricClusterUUID>.<fabricCliqueID>".
	Name        string `json:"name"`
	ClusterUUID string `json:"clusterUUID"`
	CliqueID    int64  `json:"cliqueID"`
	// Nodes are the clique's nodes, sorted; Free those whose channel no
	// claim holds.
	Nodes []string `json:"nodes"`
	Free  []string `json:"free"`
}

// Channels lists the imex-channel devices of Facet's slices (one node's
// when node is set) with the claims allocated them, by node. Unlike Build
// it never fails: a device without fabric attributes has no clique, and a
// claim's result for a device no slice publishes is skipped, so that the
// compute-domain controller places domains whatever else the slices hold.
func Channels(slices []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim, node string) []*Channel {
	byID := map[[2]string]*Channel{}
	var out []*Channel
	for _, s := range slices {
		if s.Spec.Driver != names.Driver || (node != "" && s.Spec.Pool.Name != node) {
			continue
		}
		for _, dev := range s.Spec.Devices {
			d := Device{Device: dev}
			if d.Attr(names.AttrType) != TypeIMEXChannel {
				continue
			}
			ch := &Channel{Node: s.Spec.Pool.Name, Device: dev.Name, ClusterUUID: d.Attr(names.AttrFabricCluster), CliqueID: -1}
			if a, ok := dev.Attributes[names.AttrFabricClique]; ok && a.IntValue != nil {
				ch.CliqueID = *a.IntValue
			}
			if ch.ClusterUUID != "" && ch.CliqueID >= 0 {
				ch.Clique = fmt.Sprintf("%s.%d", ch.ClusterUUID, ch.CliqueID)
			}
			for _, t := range dev.Taints {
				ch.Taints = append(ch.Taints, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
			}
			byID[[2]string{ch.Node, ch.Device}] = ch
			out = append(out, ch)
		}
	}
	for _, cl := range claims {
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.Driver != names.Driver {
				continue
			}
			if ch := byID[[2]string{r.Pool, r.Device}]; ch != nil {
				ch.Holder = &Claim{Namespace: cl.Namespace, Name: cl.Name}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].Device < out[j].Device
	})
	return out
}

// Cliques groups channels by clique, sorted by name; channels without a
// clique are left out. A node counts once, free where none of its channels
// in the clique is held (a node publishes one imex-channel device).
func Cliques(channels []*Channel) []Clique {
	byName := map[string]*Clique{}
	held := map[[2]string]bool{}
	for _, ch := range channels {
		if ch.Clique == "" {
			continue
		}
		c := byName[ch.Clique]
		if c == nil {
			c = &Clique{Name: ch.Clique, ClusterUUID: ch.ClusterUUID, CliqueID: ch.CliqueID}
			byName[ch.Clique] = c
		}
		if len(c.Nodes) == 0 || c.Nodes[len(c.Nodes)-1] != ch.Node {
			c.Nodes = append(c.Nodes, ch.Node)
		}
		if ch.Holder != nil || len(ch.Taints) > 0 {
			held[[2]string{ch.Clique, ch.Node}] = true
		}
	}
	out := make([]Clique, 0, len(byName))
	for _, c := range byName {
		for _, n := range c.Nodes {
			if !held[[2]string{c.Name, n}] {
				c.Free = append(c.Free, n)
			}
		}
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
