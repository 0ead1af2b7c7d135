package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
)

// Hand-written deep copies (deepcopy-gen is not available offline). Keep
// them in step with the types: TestDeepCopyCoversEveryField fails when a
// VgpuConfig field is not copied.

// DeepCopyInto copies c into out.
func (c *VgpuConfig) DeepCopyInto(out *VgpuConfig) {
	*out = *c
	out.TypeMeta = c.TypeMeta
	if c.Enforcement != nil {
		v := *c.Enforcement
		out.Enforcement = &v
	}
	if c.CoreUtilizationPolicy != nil {
		v := *c.CoreUtilizationPolicy
		out.CoreUtilizationPolicy = &v
	}
	if c.TaskPriority != nil {
		v := *c.TaskPriority
		out.TaskPriority = &v
	}
	if c.LogLevel != nil {
		v := *c.LogLevel
		out.LogLevel = &v
	}
	if c.Memory != nil {
		v := c.Memory.DeepCopy()
		out.Memory = &v
	}
	if c.Cores != nil {
		v := *c.Cores
		out.Cores = &v
	}
}

// DeepCopy returns a deep copy of c.
func (c *VgpuConfig) DeepCopy() *VgpuConfig {
	if c == nil {
		return nil
	}
	out := new(VgpuConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (c *VgpuConfig) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies c into out.
func (c *GpuConfig) DeepCopyInto(out *GpuConfig) {
	*out = *c
	out.TypeMeta = c.TypeMeta
}

// DeepCopy returns a deep copy of c.
func (c *GpuConfig) DeepCopy() *GpuConfig {
	if c == nil {
		return nil
	}
	out := new(GpuConfig)
	c.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (c *GpuConfig) DeepCopyObject() runtime.Object {
	if c := c.DeepCopy(); c != nil {
		return c
	}
	return nil
}
