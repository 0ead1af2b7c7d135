package occupancy

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// Read lists what occupancy is computed from: Facet's ResourceSlices (of
// one node's pool when node is set) and every ResourceClaim; the claims
// are filtered by Build, since a claim's allocation is not selectable.
func Read(ctx context.Context, client kubernetes.Interface, node string) ([]*resourceapi.ResourceSlice, []*resourceapi.ResourceClaim, error) {
	sel := fields.Set{resourceapi.ResourceSliceSelectorDriver: names.Driver}
	if node != "" {
		sel[resourceapi.ResourceSliceSelectorNodeName] = node
	}
	sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		return nil, nil, fmt.Errorf("list ResourceSlices of driver %s: %w", names.Driver, err)
	}
	cl, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	var slices []*resourceapi.ResourceSlice
	for i := range sl.Items {
		// The fake clientset does not apply field selectors; the API
		// server does. Filtering again costs nothing.
		s := &sl.Items[i]
		if s.Spec.Driver == names.Driver && (node == "" || s.Spec.Pool.Name == node) {
			slices = append(slices, s)
		}
	}
	claims := make([]*resourceapi.ResourceClaim, len(cl.Items))
	for i := range cl.Items {
		claims[i] = &cl.Items[i]
	}
	return slices, claims, nil
}
