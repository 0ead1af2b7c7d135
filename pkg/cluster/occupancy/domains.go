package occupancy

import (
	"context"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
)

// Domain is one ComputeDomain as occupancy shows it: where the controller
// pinned it and how many of its nodes' IMEX daemons are ready.
type Domain struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	NumNodes  int32  `json:"numNodes"`
	// Clique is status.clique: empty until the controller has chosen.
	Clique string `json:"clique,omitempty"`
	// Nodes are status.nodes' names, by index; Ready those whose daemon
	// is ready.
	Nodes []string `json:"nodes,omitempty"`
	Ready []string `json:"ready,omitempty"`
	// Status is status.status (Ready, NotReady, or empty before the
	// controller's first look).
	Status string `json:"status,omitempty"`
	// Why is the CliqueAssigned condition's message where it is not True:
	// why the domain has no clique that fits it.
	Why string `json:"why,omitempty"`
	// Deleting: deleted, waiting for its pods to end (its finalizer).
	Deleting bool `json:"deleting,omitempty"`
}

func (d Domain) String() string { return d.Namespace + "/" + d.Name }

// DomainsOf is the occupancy view of ComputeDomains, sorted by namespace
// and name.
func DomainsOf(list []v1alpha1.ComputeDomain) []Domain {
	out := make([]Domain, 0, len(list))
	for i := range list {
		cd := &list[i]
		d := Domain{Namespace: cd.Namespace, Name: cd.Name, NumNodes: cd.Spec.NumNodes, Clique: cd.Status.Clique,
			Status: string(cd.Status.Status), Deleting: cd.DeletionTimestamp != nil}
		nodes := append([]v1alpha1.ComputeDomainNode(nil), cd.Status.Nodes...)
		sort.Slice(nodes, func(i, j int) bool { return nodes[i].Index < nodes[j].Index })
		for _, n := range nodes {
			d.Nodes = append(d.Nodes, n.Name)
			if n.Status == v1alpha1.ComputeDomainReady {
				d.Ready = append(d.Ready, n.Name)
			}
		}
		for _, c := range cd.Status.Conditions {
			if c.Type == v1alpha1.ConditionCliqueAssigned && c.Status != metav1.ConditionTrue {
				d.Why = c.Message
			}
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// ComputeDomains is the resource of the ComputeDomain CRD.
var ComputeDomains = v1alpha1.SchemeGroupVersion.WithResource(v1alpha1.ComputeDomainResource)

// ReadDomains lists every ComputeDomain. A cluster without the CRD has
// none: nil, no error.
func ReadDomains(ctx context.Context, client dynamic.Interface) ([]v1alpha1.ComputeDomain, error) {
	list, err := client.Resource(ComputeDomains).Namespace(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list ComputeDomains: %w", err)
	}
	out := make([]v1alpha1.ComputeDomain, len(list.Items))
	for i := range list.Items {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &out[i]); err != nil {
			return nil, fmt.Errorf("ComputeDomain %s/%s: %w", list.Items[i].GetNamespace(), list.Items[i].GetName(), err)
		}
	}
	return out, nil
}
