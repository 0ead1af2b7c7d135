package imex

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
)

// PeerList is the peer list of a domain's status.nodes: each node's
// ipAddress, one a line, ordered by index (a missing index leaves no
// line: the others keep their order, as the controller keeps indexes
// stable). Errors name the entry: an index out of 0..numNodes-1, one
// that two entries share, an address that is not an IP address, a name
// that two entries share. numNodes is the domain's spec.numNodes.
func PeerList(nodes []v1alpha1.ComputeDomainNode, numNodes int32) ([]byte, error) {
	p := field.NewPath("status", "nodes")
	var errs field.ErrorList
	byIndex := map[int32]int{}
	byName := map[string]int{}
	for i, n := range nodes {
		ip := p.Index(i)
		if n.Index < 0 || n.Index >= numNodes {
			errs = append(errs, field.Invalid(ip.Child("index"), n.Index, fmt.Sprintf("node %s: must be 0 to spec.numNodes-1 (%d)", n.Name, numNodes-1)))
		} else if j, dup := byIndex[n.Index]; dup {
			errs = append(errs, field.Duplicate(ip.Child("index"), fmt.Sprintf("%d (node %s, as status.nodes[%d], node %s)", n.Index, n.Name, j, nodes[j].Name)))
		} else {
			byIndex[n.Index] = i
		}
		if j, dup := byName[n.Name]; dup {
			errs = append(errs, field.Duplicate(ip.Child("name"), fmt.Sprintf("%s (as status.nodes[%d])", n.Name, j)))
		} else {
			byName[n.Name] = i
		}
		if _, err := netip.ParseAddr(n.IPAddress); err != nil {
			errs = append(errs, field.Invalid(ip.Child("ipAddress"), n.IPAddress, fmt.Sprintf("node %s: not an IP address", n.Name)))
		}
	}
	if err := errs.ToAggregate(); err != nil {
		return nil, err
	}
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b v1alpha1.ComputeDomainNode) int { return int(a.Index - b.Index) })
	var b bytes.Buffer
	for _, n := range sorted {
		b.WriteString(n.IPAddress)
		b.WriteByte('\n')
	}
	return b.Bytes(), nil
}

// findNode is node's entry in d's status.nodes, or nil.
func findNode(d *v1alpha1.ComputeDomain, node string) *v1alpha1.ComputeDomainNode {
	for i := range d.Status.Nodes {
		if d.Status.Nodes[i].Name == node {
			return &d.Status.Nodes[i]
		}
	}
	return nil
}

// SimulatedReadiness is the stand-in's verdict on d for node: ready when
// the peer list is well formed (PeerList), holds spec.numNodes entries
// and node's among them. The reason, when not ready, says what lacks,
// naming the domain, e.g. "ComputeDomain ml/train: the peer list holds 3
// of spec.numNodes 4 nodes (node-a, node-b, node-c)".
func SimulatedReadiness(d *v1alpha1.ComputeDomain, node string) (bool, string) {
	name := d.Namespace + "/" + d.Name
	if _, err := PeerList(d.Status.Nodes, d.Spec.NumNodes); err != nil {
		return false, fmt.Sprintf("ComputeDomain %s: %v", name, err)
	}
	names := make([]string, 0, len(d.Status.Nodes))
	for _, n := range d.Status.Nodes {
		names = append(names, n.Name)
	}
	listed := strings.Join(names, ", ")
	if listed == "" {
		listed = "none"
	}
	if findNode(d, node) == nil {
		return false, fmt.Sprintf("ComputeDomain %s: node %s is not in status.nodes (%s)", name, node, listed)
	}
	if int32(len(d.Status.Nodes)) != d.Spec.NumNodes {
		return false, fmt.Sprintf("ComputeDomain %s: the peer list holds %d of spec.numNodes %d nodes (%s)", name, len(d.Status.Nodes), d.Spec.NumNodes, listed)
	}
	return true, ""
}
