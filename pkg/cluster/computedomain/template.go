package computedomain

import (
	"encoding/json"
	"fmt"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// AnnotationClique on the template names the clique its selector pins,
// for an operator reading it.
const AnnotationClique = names.Driver + "/clique"

// CliqueSelector is the CEL expression that keeps a channel request in the
// clique: the imex-channel device's fabricClusterUUID and fabricCliqueID,
// as the kubelet plugin publishes them from the GPUs'
// nvmlDeviceGetGpuFabricInfo.
func CliqueSelector(q occupancy.Clique) string {
	return fmt.Sprintf(`device.attributes[%q].%s == %s && device.attributes[%q].%s == %d`,
		names.Driver, names.AttrFabricCluster, strconv.Quote(q.ClusterUUID), names.Driver, names.AttrFabricClique, q.CliqueID)
}

// Template is the channel ResourceClaimTemplate of the domain, pinned to
// the clique: one request of DeviceClass imex-channel.facet.dev whose
// selector is CliqueSelector, and the opaque ComputeDomainChannelConfig
// the kubelet plugin reads at prepare. It is owned by the domain (deleted
// with it by the garbage collector should the controller not run), and
// its claims carry the domain's label.
func Template(cd *v1alpha1.ComputeDomain, q occupancy.Clique) (*resourceapi.ResourceClaimTemplate, error) {
	cfg := v1alpha1.NewComputeDomainChannelConfig(cd.Name, string(cd.UID), cd.Spec.Channel.AllocationMode)
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("ComputeDomain %s/%s: channel config: %w", cd.Namespace, cd.Name, err)
	}
	labels := map[string]string{Label: string(cd.UID)}
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            cd.Spec.Channel.ResourceClaimTemplate.Name,
			Namespace:       cd.Namespace,
			Labels:          labels,
			Annotations:     map[string]string{AnnotationClique: q.Name},
			OwnerReferences: []metav1.OwnerReference{OwnerOf(cd)},
		},
		Spec: resourceapi.ResourceClaimTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{
					Name: Request,
					Exactly: &resourceapi.ExactDeviceRequest{
						DeviceClassName: DeviceClass,
						AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
						Count:           1,
						Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: CliqueSelector(q)}}},
					},
				}},
				Config: []resourceapi.DeviceClaimConfiguration{{
					Requests: []string{Request},
					DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
						Driver:     names.Driver,
						Parameters: runtime.RawExtension{Raw: raw},
					}},
				}},
			}},
		},
	}, nil
}

// OwnerOf is the owner reference of what the domain owns in its namespace:
// the controller's, blocking the domain's foreground deletion until the
// object is gone.
func OwnerOf(cd *v1alpha1.ComputeDomain) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         v1alpha1.SchemeGroupVersion.String(),
		Kind:               v1alpha1.ComputeDomainKind,
		Name:               cd.Name,
		UID:                cd.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

// OwnedBy reports whether the domain controls the object.
func OwnedBy(o metav1.Object, cd *v1alpha1.ComputeDomain) bool {
	ref := metav1.GetControllerOf(o)
	return ref != nil && ref.UID == cd.UID
}

// SameTemplate reports whether an existing template is the desired one:
// the same clique, selector, class and channel config. (The API server
// keeps a template's spec immutable, so a change is a delete and a
// create; it may re-encode the config's JSON, so the config is compared
// decoded.)
func SameTemplate(have, want *resourceapi.ResourceClaimTemplate) bool {
	if have.Annotations[AnnotationClique] != want.Annotations[AnnotationClique] {
		return false
	}
	h, w := have.Spec.Spec.Devices, want.Spec.Spec.Devices
	if len(h.Requests) != 1 || h.Requests[0].Exactly == nil || len(h.Config) != 1 ||
		!equality.Semantic.DeepEqual(h.Requests[0].Exactly.Selectors, w.Requests[0].Exactly.Selectors) ||
		h.Requests[0].Exactly.DeviceClassName != w.Requests[0].Exactly.DeviceClassName {
		return false
	}
	hc := ChannelConfigOf(&resourceapi.ResourceClaim{Spec: have.Spec.Spec})
	wc := ChannelConfigOf(&resourceapi.ResourceClaim{Spec: want.Spec.Spec})
	return hc != nil && wc != nil && *hc == *wc
}
