package v1alpha1

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// Enforcement says whether HAMi-core enforces a vGPU share's limits.
type Enforcement string

const (
	// EnforcementEnabled preloads HAMi-core into the container, which then
	// enforces the share's memory and SM limits. The default.
	EnforcementEnabled Enforcement = "enabled"
	// EnforcementDisabled is the opt-out: no preload and no HAMi-core
	// variables, so nothing limits the share at run time. The scheduler still
	// accounts the share's consumed capacity.
	EnforcementDisabled Enforcement = "disabled"
)

// Partitioning says what holds a vGPU share to its cores (its SM share).
type Partitioning string

const (
	// PartitioningMPS runs the share's processes as clients of its GPU's
	// MPS control daemon with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set to the
	// share's cores: the SMs are partitioned, which holds for GEMMs too
	// (docs/mps.md). HAMi-core keeps the memory limit. Explicit, a node
	// without MPS fails the claim.
	PartitioningMPS Partitioning = "mps"
	// PartitioningTimeSliced leaves the SM share to HAMi-core's token
	// bucket (CUDA_DEVICE_SM_LIMIT), which throttles many-block kernels
	// only (docs/design/hami-core.md): a 20 % share ran GEMMs at 69 % of a
	// real H200.
	PartitioningTimeSliced Partitioning = "time-sliced"
	// PartitioningBestEffort is MPS where the node has it now, else
	// HAMi-core's time-slicing: the claim accepts a compute limit that may
	// not hold. The shipped best-effort DeviceClasses set it.
	PartitioningBestEffort Partitioning = "best-effort"
)

// CoreUtilizationPolicy is HAMi-core's GPU_CORE_UTILIZATION_POLICY.
type CoreUtilizationPolicy string

const (
	// CoreUtilizationPolicyDefault throttles to the SM limit while the
	// shared region's utilization switch is on. HAMi-core creates the region
	// with the switch on; only an external monitor turns it off. The default.
	CoreUtilizationPolicyDefault CoreUtilizationPolicy = "default"
	// CoreUtilizationPolicyForce always throttles to the SM limit.
	CoreUtilizationPolicyForce CoreUtilizationPolicy = "force"
	// CoreUtilizationPolicyDisable never throttles; the memory limit stays.
	CoreUtilizationPolicyDisable CoreUtilizationPolicy = "disable"
)

// The HAMi-core environment variables a VgpuConfig becomes.
const (
	EnvCoreUtilizationPolicy = "GPU_CORE_UTILIZATION_POLICY"
	EnvTaskPriority          = "CUDA_TASK_PRIORITY"
	EnvLogLevel              = "LIBCUDA_LOG_LEVEL"
)

// Ranges and defaults of the integer fields.
const (
	// TaskPriorityHigh is the highest CUDA_TASK_PRIORITY.
	TaskPriorityHigh int32 = 0
	// TaskPriorityLow is the lowest CUDA_TASK_PRIORITY, and HAMi-core's
	// default when the variable is unset.
	TaskPriorityLow int32 = 1
	// DefaultTaskPriority is HAMi-core's own default.
	DefaultTaskPriority = TaskPriorityLow

	// MinLogLevel and MaxLogLevel bound LIBCUDA_LOG_LEVEL.
	MinLogLevel int32 = 0
	MaxLogLevel int32 = 4
	// DefaultLogLevel is what HAMi-core does when LIBCUDA_LOG_LEVEL is unset:
	// errors, warnings and messages.
	DefaultLogLevel int32 = 2
)

var (
	supportedEnforcements = []Enforcement{EnforcementEnabled, EnforcementDisabled}
	supportedPolicies     = []CoreUtilizationPolicy{CoreUtilizationPolicyDefault, CoreUtilizationPolicyForce, CoreUtilizationPolicyDisable}
	supportedPartitioning = []Partitioning{PartitioningMPS, PartitioningTimeSliced, PartitioningBestEffort}
)

// VgpuConfig tunes HAMi-core for a vGPU share (a partial allocation of a
// gpu-<i> device). Every field is a pointer so that "unset" differs from
// "set to the zero value", which merging needs: see Merge. The package
// documentation describes each field.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type VgpuConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Enforcement is "enabled" (default) or "disabled", the opt-out from
	// HAMi-core: no preload, no limits at run time; the scheduler still
	// accounts the share.
	// +optional
	Enforcement *Enforcement `json:"enforcement,omitempty"`

	// CoreUtilizationPolicy is "default" (default), "force" or "disable";
	// it becomes GPU_CORE_UTILIZATION_POLICY.
	// +optional
	CoreUtilizationPolicy *CoreUtilizationPolicy `json:"coreUtilizationPolicy,omitempty"`

	// TaskPriority is 0 (high) or 1 (low, default); it becomes
	// CUDA_TASK_PRIORITY, which only an external monitor reads.
	// +optional
	TaskPriority *int32 `json:"taskPriority,omitempty"`

	// LogLevel is 0 to 4 (default 2); it becomes LIBCUDA_LOG_LEVEL.
	// +optional
	LogLevel *int32 `json:"logLevel,omitempty"`

	// Memory caps the share's memory limit below what its device gives
	// (bytes, a quantity such as 3000Mi; rounded down to whole MiB, as
	// HAMi-core counts in MiB): a claim for HAMi's gpumem 3000 on a 20 GiB
	// vGPU slot gets 3000 MiB. More than the device gives fails the claim.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`

	// Cores caps the share's SM limit below what its device gives, in
	// percent, 1 to 100. More than the device gives fails the claim.
	// +optional
	Cores *int32 `json:"cores,omitempty"`

	// Partitioning is "mps", "time-sliced" or "best-effort": whether the
	// share's cores are held by MPS (its GPU's SMs partitioned), by
	// HAMi-core's SM throttle alone, or by MPS where the node has it and
	// the throttle elsewhere. Unset: "mps" where the node runs MPS; where
	// it does not, a share with a compute limit (cores 1-99) fails to
	// prepare, and one without is time-sliced. "mps" on a node without
	// MPS fails the claim. docs/mps.md, "Compute policy".
	// +optional
	Partitioning *Partitioning `json:"partitioning,omitempty"`
}

// NewVgpuConfig returns an empty VgpuConfig with its apiVersion and kind set.
func NewVgpuConfig() *VgpuConfig {
	return &VgpuConfig{TypeMeta: typeMeta(VgpuConfigKind)}
}

// Default sets apiVersion and kind, and every unset field to its default.
func (c *VgpuConfig) Default() {
	c.TypeMeta = typeMeta(VgpuConfigKind)
	if c.Enforcement == nil {
		c.Enforcement = ptr.To(EnforcementEnabled)
	}
	if c.CoreUtilizationPolicy == nil {
		c.CoreUtilizationPolicy = ptr.To(CoreUtilizationPolicyDefault)
	}
	if c.TaskPriority == nil {
		c.TaskPriority = ptr.To(DefaultTaskPriority)
	}
	if c.LogLevel == nil {
		c.LogLevel = ptr.To(DefaultLogLevel)
	}
}

// Validate checks every set field. Unset fields are valid: they take their
// default, or an earlier config's value when merged. The error is a
// field.ErrorList aggregate whose paths are relative to the parameters
// object.
func (c *VgpuConfig) Validate() error {
	return c.validate(nil).ToAggregate()
}

func (c *VgpuConfig) validate(fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.Enforcement != nil && !contains(supportedEnforcements, *c.Enforcement) {
		errs = append(errs, field.NotSupported(fldPath.Child("enforcement"), string(*c.Enforcement), supportedEnforcements))
	}
	if c.CoreUtilizationPolicy != nil && !contains(supportedPolicies, *c.CoreUtilizationPolicy) {
		errs = append(errs, field.NotSupported(fldPath.Child("coreUtilizationPolicy"), string(*c.CoreUtilizationPolicy), supportedPolicies))
	}
	if c.TaskPriority != nil && (*c.TaskPriority < TaskPriorityHigh || *c.TaskPriority > TaskPriorityLow) {
		errs = append(errs, field.Invalid(fldPath.Child("taskPriority"), *c.TaskPriority,
			validation.InclusiveRangeError(int(TaskPriorityHigh), int(TaskPriorityLow))))
	}
	if c.LogLevel != nil && (*c.LogLevel < MinLogLevel || *c.LogLevel > MaxLogLevel) {
		errs = append(errs, field.Invalid(fldPath.Child("logLevel"), *c.LogLevel,
			validation.InclusiveRangeError(int(MinLogLevel), int(MaxLogLevel))))
	}
	if c.Memory != nil && c.Memory.Value() < 1<<20 {
		errs = append(errs, field.Invalid(fldPath.Child("memory"), c.Memory.String(), "must be at least 1Mi"))
	}
	if c.Cores != nil && (*c.Cores < 1 || *c.Cores > 100) {
		errs = append(errs, field.Invalid(fldPath.Child("cores"), *c.Cores, validation.InclusiveRangeError(1, 100)))
	}
	if c.Partitioning != nil && !contains(supportedPartitioning, *c.Partitioning) {
		errs = append(errs, field.NotSupported(fldPath.Child("partitioning"), string(*c.Partitioning), supportedPartitioning))
	}
	return errs
}

// Limit caps a share's memory (bytes) and SM share (percent; 0 is best
// effort) by the config's Memory and Cores, which may only lower them. The
// error names the field.
func (c *VgpuConfig) Limit(memoryBytes, cores int64) (int64, int64, error) {
	if c == nil {
		return memoryBytes, cores, nil
	}
	if c.Memory != nil {
		m := c.Memory.Value() &^ (1<<20 - 1)
		if m > memoryBytes {
			return 0, 0, field.Invalid(field.NewPath("memory"), c.Memory.String(), fmt.Sprintf("more than the %d MiB the device gives", memoryBytes>>20))
		}
		memoryBytes = m
	}
	if c.Cores != nil {
		if cores != 0 && int64(*c.Cores) > cores {
			return 0, 0, field.Invalid(field.NewPath("cores"), *c.Cores, fmt.Sprintf("more than the %d%% the device gives", cores))
		}
		cores = int64(*c.Cores)
	}
	return memoryBytes, cores, nil
}

// EnforcementEnabled reports whether HAMi-core is to enforce the share: true
// unless enforcement is explicitly "disabled".
func (c *VgpuConfig) EnforcementEnabled() bool {
	return c == nil || c.Enforcement == nil || *c.Enforcement != EnforcementDisabled
}

// PartitioningFor is the share's partitioning: the config's, else "mps"
// when mpsAvailable (the node's plugin runs MPS), else "time-sliced".
func (c *VgpuConfig) PartitioningFor(mpsAvailable bool) Partitioning {
	if c != nil && c.Partitioning != nil {
		return *c.Partitioning
	}
	if mpsAvailable {
		return PartitioningMPS
	}
	return PartitioningTimeSliced
}

// HAMiCoreEnv returns the HAMi-core variables the config becomes, as
// "NAME=value" in a fixed order, with unset fields taking their defaults. It
// returns nil when enforcement is disabled: the share then gets neither the
// preload nor any HAMi-core variable. The values are plain decimal digits or
// lower-case words, so HAMi-core's octal and hex readings cannot apply. The
// share's limits (CUDA_DEVICE_MEMORY_LIMIT_<n>, CUDA_DEVICE_SM_LIMIT_<n>)
// and the cache path are not here: they come from the allocation, not from
// this config.
func (c *VgpuConfig) HAMiCoreEnv() []string {
	if !c.EnforcementEnabled() {
		return nil
	}
	d := NewVgpuConfig()
	if c != nil {
		d = c.DeepCopy()
	}
	d.Default()
	return []string{
		EnvCoreUtilizationPolicy + "=" + string(*d.CoreUtilizationPolicy),
		EnvTaskPriority + "=" + strconv.Itoa(int(*d.TaskPriority)),
		EnvLogLevel + "=" + strconv.Itoa(int(*d.LogLevel)),
	}
}

// Merge merges configs in order of increasing precedence: a field set in a
// later config overrides the same field of an earlier one, and a field left
// unset keeps the earlier value. Nil configs are skipped. The result is a new
// object that shares no memory with the arguments, has apiVersion and kind
// set, and is not defaulted (call Default on it). Pass class configs before
// claim configs, as they appear in a claim's allocation.
func Merge(configs ...*VgpuConfig) *VgpuConfig {
	out := NewVgpuConfig()
	for _, c := range configs {
		if c == nil {
			continue
		}
		if c.Enforcement != nil {
			out.Enforcement = ptr.To(*c.Enforcement)
		}
		if c.CoreUtilizationPolicy != nil {
			out.CoreUtilizationPolicy = ptr.To(*c.CoreUtilizationPolicy)
		}
		if c.TaskPriority != nil {
			out.TaskPriority = ptr.To(*c.TaskPriority)
		}
		if c.LogLevel != nil {
			out.LogLevel = ptr.To(*c.LogLevel)
		}
		if c.Memory != nil {
			out.Memory = ptr.To(c.Memory.DeepCopy())
		}
		if c.Cores != nil {
			out.Cores = ptr.To(*c.Cores)
		}
		if c.Partitioning != nil {
			out.Partitioning = ptr.To(*c.Partitioning)
		}
	}
	return out
}

func contains[T comparable](list []T, v T) bool {
	for _, e := range list {
		if e == v {
			return true
		}
	}
	return false
}
