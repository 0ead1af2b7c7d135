package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/facet-gpu/facet/pkg/model/names"
)

const (
	// GroupName is the API group of Facet's opaque configs. It is also the
	// driver name that OpaqueDeviceConfiguration.Driver must carry for a
	// config to be meant for Facet.
	GroupName = names.Driver
	// Version is this package's API version.
	Version = "v1alpha1"

	// VgpuConfigKind is the kind of VgpuConfig.
	VgpuConfigKind = "VgpuConfig"
	// GpuConfigKind is the kind of GpuConfig.
	GpuConfigKind = "GpuConfig"
)

// SchemeGroupVersion is the group and version of the types in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

// typeMeta is a config's apiVersion and kind, which New and Default set.
func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: SchemeGroupVersion.String(), Kind: kind}
}

var (
	// SchemeBuilder registers this package's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers the config kinds and nothing else. It deliberately
// does not call metav1.AddToGroupVersion: these types are never served, and
// the meta types it would add (WatchEvent, and the unversioned Status and
// *Options kinds, which a scheme resolves for any group and version) would
// otherwise decode as valid parameters.
func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&VgpuConfig{},
		&GpuConfig{},
		&ComputeDomainChannelConfig{},
	)
	return nil
}

var (
	// ServedSchemeBuilder registers the served kinds (ComputeDomain and its
	// list) with the meta types a client needs to list and watch them. It
	// is apart from SchemeBuilder so that Decode, whose scheme must hold
	// the opaque config kinds only, never accepts a served kind as
	// parameters.
	ServedSchemeBuilder = runtime.NewSchemeBuilder(addServedTypes)
	// AddServedToScheme adds the served kinds to a client's scheme.
	AddServedToScheme = ServedSchemeBuilder.AddToScheme
)

func addServedTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&ComputeDomain{},
		&ComputeDomainList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
