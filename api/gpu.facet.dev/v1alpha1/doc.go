// Package v1alpha1 is Facet's opaque device configuration API: the JSON that
// a DeviceClass or a ResourceClaim carries in
//
//	config:
//	- opaque:
//	    driver: gpu.facet.dev
//	    parameters: {apiVersion: gpu.facet.dev/v1alpha1, kind: VgpuConfig, ...}
//
// The kubelet plugin and a validating admission webhook are both meant to use
// this package's decoder, so that what the webhook admits is exactly what the
// plugin accepts at prepare time: Decode for one parameters object, and
// EffectiveVgpuConfig / EffectiveGpuConfig for a claim's
// status.allocation.devices.config.
//
// # Kinds
//
// VgpuConfig configures a vGPU share, a partial allocation of a gpu-<i>
// device or a fixed-size vGPU slot, whose limits HAMi-core (libvgpu.so,
// preloaded into the container) enforces. The share's size comes from the
// capacity the allocator consumed on the device (the allocation result's
// consumedCapacity) or from the slot, and the driver writes it as
// CUDA_DEVICE_MEMORY_LIMIT_<n> and CUDA_DEVICE_SM_LIMIT_<n>; memory and cores
// below may only lower it. A VgpuConfig is ignored for devices that are not
// vGPU shares (a whole GPU, a MIG device). Its fields, all optional:
//
//   - memory (a quantity, bytes, e.g. "3000Mi") and cores (percent, 1-100):
//     lower limits than the device gives, e.g. HAMi's gpumem 3000 /
//     gpucores 10 on a 20 GiB / 25 % slot. More than the device gives fails
//     the claim, naming the field.
//
//   - enforcement: "enabled" (default) or "disabled". "disabled" is the
//     opt-out, Facet's equivalent of HAMi's per-container
//     CUDA_DISABLE_CONTROL=true (which Facet cannot honour, because a
//     container's environment is not visible at prepare time): the share's
//     CDI spec gets no libvgpu.so preload and none of the HAMi-core
//     variables, so nothing limits the processes on the device. The
//     scheduler still accounts the share's consumed memory and cores on the
//     GPU; the other fields are then ignored.
//
//   - coreUtilizationPolicy: "default" (default), "force" or "disable".
//     Becomes GPU_CORE_UTILIZATION_POLICY. "disable" turns HAMi-core's SM
//     throttle off (the memory limit stays). "force" throttles to the SM
//     limit at all times. "default" throttles according to a switch in the
//     share's shared accounting region; HAMi-core creates the region with the
//     switch on, and only an external monitor (HAMi's vGPUmonitor) turns it
//     off, so without such a monitor "default" behaves like "force". With an
//     SM limit of 0 or 100 nothing is throttled whatever the policy, and the
//     throttle is best effort (see docs/design/hami-core.md: it needs the host PID, and
//     CUDA graphs and cooperative launches escape it).
//
//   - taskPriority: 0 (high) or 1 (low); HAMi-core's default is 1.
//     Becomes CUDA_TASK_PRIORITY. HAMi-core only stores it in the shared
//     region; an external monitor reads it (HAMi's vGPUmonitor: while a
//     priority-0 task launches kernels on a GPU, priority-1 tasks there are
//     paused and throttled). The range is that monitor's: it indexes a
//     two-element array with the value, so any other value would break it.
//     Facet itself does not act on it.
//
//   - logLevel: 0 to 4, HAMi-core's verbosity on the container's stderr.
//     Becomes LIBCUDA_LOG_LEVEL. Errors are always printed; 2 adds warnings
//     and messages, 3 info, 4 debug; 0 and 1 both mean errors only. The
//     default, 2, is what HAMi-core does when the variable is unset, so a
//     config that leaves logLevel alone changes nothing.
//
//   - partitioning: "mps" or "time-sliced". "mps" (the default where the
//     node's plugin runs MPS) makes the share's processes clients of its
//     GPU's MPS control daemon with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set to
//     the share's cores, which partitions the GPU's SMs; HAMi-core keeps
//     the memory limit and its SM throttle is off. "time-sliced" (the
//     default elsewhere) leaves the cores to HAMi-core's SM throttle, which
//     does not hold for GEMMs. "mps" on a node without MPS fails the claim.
//     docs/mps.md has MPS's limits.
//
// GpuConfig is the kind for whole GPUs and MIG devices. Nothing about them
// is configurable yet, so it has no fields; it exists so that a class or a
// claim may name it and so that fields can be added later without a new
// kind. Its only check is strict decoding.
//
// # Decoding
//
// Parameters are JSON (the API server stores a RawExtension as JSON; YAML
// written in a manifest is converted by the client before it is sent), and
// the decoder accepts JSON only: YAML-looking input is an error, not a
// second, looser syntax. Decoding is strict, with k8s.io/apimachinery's JSON
// serializer in strict mode over a scheme holding only this package's kinds:
// unknown fields (field names are case-sensitive), duplicate fields, wrong
// JSON types, a missing or other apiVersion and an unknown kind are errors.
// An explicit null means "unset". Decode then validates (it does not
// default), and reports problems as Kubernetes field errors, for example
//
//	VgpuConfig: coreUtilizationPolicy: Unsupported value: "turbo": supported values: "default", "force", "disable"
//
// # Precedence
//
// The allocator copies the class's configs into the claim's allocation
// first, then the claim's (resource.k8s.io/v1 DeviceAllocationConfiguration),
// each restricted to some requests or, with no requests listed, applying to
// all. Facet merges field by field: for one request, every VgpuConfig that
// applies to it is merged in that order (class entries before claim
// entries), a field set in a later config overriding the same field set in
// an earlier one, and the result is defaulted. A config restricted to
// "main" applies to every subrequest "main/<sub>"; one restricted to
// "main/<sub>" only to that subrequest. A single malformed entry for this
// driver fails the whole claim, naming its index and source. Configs of
// other drivers are ignored.
//
// +groupName=gpu.facet.dev
package v1alpha1
