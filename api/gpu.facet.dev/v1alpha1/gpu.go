package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GpuConfig is the config kind for whole GPUs and MIG devices. Nothing about
// them is configurable yet, so it has no fields besides apiVersion and kind:
// it is accepted, so that a DeviceClass or a claim may name it, and fields
// can be added to it later without a new kind. Any field in it is an
// unknown field, hence a decoding error.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`
}

// NewGpuConfig returns a GpuConfig with its apiVersion and kind set.
func NewGpuConfig() *GpuConfig {
	return &GpuConfig{TypeMeta: typeMeta(GpuConfigKind)}
}

// Default sets apiVersion and kind; there is nothing else to default.
func (c *GpuConfig) Default() {
	c.TypeMeta = typeMeta(GpuConfigKind)
}

// Validate has nothing to check: a GpuConfig has no fields, and strict
// decoding already refuses any.
func (c *GpuConfig) Validate() error {
	return nil
}
