package fit

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
)

// Live reads the cluster's Facet slices (one node's when node is set),
// DeviceClasses and claims. Features are the caller's to set: detection
// (features.Detect) needs rights that listing does not.
func Live(ctx context.Context, client kubernetes.Interface, node string) (Input, error) {
	slices, claims, err := occupancy.Read(ctx, client, node)
	if err != nil {
		return Input{}, err
	}
	cl, err := client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return Input{}, fmt.Errorf("list DeviceClasses: %w", err)
	}
	classes := make([]*resourceapi.DeviceClass, len(cl.Items))
	for i := range cl.Items {
		classes[i] = &cl.Items[i]
	}
	return Input{Slices: slices, Classes: classes, Claims: claims}, nil
}

// Template reads a ResourceClaimTemplate a pod names (a TemplateSource).
func Template(ctx context.Context, client kubernetes.Interface) TemplateSource {
	return func(namespace, name string) (*resourceapi.ResourceClaimTemplate, error) {
		t, err := client.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("ResourceClaimTemplate %s/%s is neither in the file nor in the cluster: %w", namespace, name, err)
		}
		return t, nil
	}
}

// Claim reads one claim a pod names.
func Claim(ctx context.Context, client kubernetes.Interface, namespace, name string) (*resourceapi.ResourceClaim, error) {
	c, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s: %w", namespace, name, err)
	}
	return c, nil
}
