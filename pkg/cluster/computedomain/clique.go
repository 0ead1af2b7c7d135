package computedomain

import (
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// Choice is where a domain goes.
type Choice struct {
	// Clique is the clique the template selects: the best fit, or the one
	// with the most available channels where none fits. Zero (Name "")
	// where no node publishes a channel with a clique.
	Clique occupancy.Clique
	// Available is the clique's free channels less those other domains
	// pinned there still need.
	Available int
	// Fits: Available >= numNodes.
	Fits bool
	// Why says so in words, for the condition and the Event.
	Why string
}

// Choose pins a domain of numNodes nodes to a clique. reserved is, per
// clique name, how many of its free channels other domains pinned there
// have not taken yet (Reserved). Among the cliques with numNodes
// available channels it takes the one with the fewest (best fit: whole
// cliques stay free for larger domains), ties by name; where none has
// enough, the one with the most, ties by name, and Fits is false.
func Choose(cliques []occupancy.Clique, reserved map[string]int, numNodes int) Choice {
	if len(cliques) == 0 {
		return Choice{Why: fmt.Sprintf("no node publishes an IMEX channel with a fabric clique (a device of type %s, driver %s): "+
			"no node has GB200-class NVLink fabric GPUs whose fabric is attached, or its driver registers no IMEX channels", occupancy.TypeIMEXChannel, names.Driver)}
	}
	sorted := append([]occupancy.Clique(nil), cliques...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	avail := func(q occupancy.Clique) int { return max(len(q.Free)-reserved[q.Name], 0) }
	var best, most *occupancy.Clique
	for i := range sorted {
		q := &sorted[i]
		a := avail(*q)
		if a >= numNodes && (best == nil || a < avail(*best)) {
			best = q
		}
		if most == nil || a > avail(*most) {
			most = q
		}
	}
	if best != nil {
		a := avail(*best)
		return Choice{Clique: *best, Available: a, Fits: true,
			Why: fmt.Sprintf("pinned to clique %s: %d of its %d nodes' IMEX channels available, %d needed", best.Name, a, len(best.Nodes), numNodes)}
	}
	a := avail(*most)
	why := fmt.Sprintf("no clique has %d IMEX channels available: the most, %d of %d, are in clique %s", numNodes, a, len(most.Nodes), most.Name)
	if r := reserved[most.Name]; r > 0 {
		why += fmt.Sprintf(" (%d free, %d of them kept for other domains pinned there)", len(most.Free), r)
	}
	why += fmt.Sprintf("; pinned there: %d of the domain's pods can run, the rest stay Pending until channels there are freed", a)
	return Choice{Clique: *most, Available: a, Why: why}
}

// Reserved is, per clique, how many channels the domains pinned there with
// a fit (condition CliqueAssigned True) still need: numNodes less their
// claims that are allocated. Domains being deleted and the domain skip
// (the one being placed) reserve nothing.
func Reserved(domains []*v1alpha1.ComputeDomain, claims []*resourceapi.ResourceClaim, skip types.UID) map[string]int {
	allocated := map[types.UID]int{}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		if cfg := ChannelConfigOf(c); cfg != nil {
			allocated[types.UID(cfg.DomainUID)]++
		}
	}
	out := map[string]int{}
	for _, d := range domains {
		if d.UID == skip || d.DeletionTimestamp != nil || d.Status.Clique == "" || !conditionTrue(d, v1alpha1.ConditionCliqueAssigned) {
			continue
		}
		if need := int(d.Spec.NumNodes) - allocated[d.UID]; need > 0 {
			out[d.Status.Clique] += need
		}
	}
	return out
}

// ChannelConfigOf is the ComputeDomainChannelConfig of a claim's spec (the
// one the domain's template gives its claims, or a hand-written claim's),
// nil where it has none or it does not decode.
func ChannelConfigOf(c *resourceapi.ResourceClaim) *v1alpha1.ComputeDomainChannelConfig {
	for _, e := range c.Spec.Devices.Config {
		if e.Opaque == nil || e.Opaque.Driver != names.Driver || !strings.Contains(string(e.Opaque.Parameters.Raw), v1alpha1.ComputeDomainChannelConfigKind) {
			continue
		}
		cfg, err := v1alpha1.Decode(e.Opaque.Parameters.Raw)
		if err != nil {
			continue
		}
		if cd, ok := cfg.(*v1alpha1.ComputeDomainChannelConfig); ok {
			return cd
		}
	}
	return nil
}

// ClaimsOf are the claims of the domain: in its namespace, with its
// channel config naming its UID.
func ClaimsOf(cd *v1alpha1.ComputeDomain, claims []*resourceapi.ResourceClaim) []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for _, c := range claims {
		if c.Namespace != cd.Namespace {
			continue
		}
		if cfg := ChannelConfigOf(c); cfg != nil && cfg.DomainUID == string(cd.UID) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// conditionTrue reports whether the domain's condition t is True.
func conditionTrue(cd *v1alpha1.ComputeDomain, t string) bool {
	for _, c := range cd.Status.Conditions {
		if c.Type == t {
			return c.Status == "True"
		}
	}
	return false
}
