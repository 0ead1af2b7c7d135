// Package names is the one home of the words Facet publishes and records:
// the driver name, the device kinds, and the attribute, capacity and
// counter names of its ResourceSlices. Every other package imports them
// from here, and parses Facet's string enumerations (Parse). It imports
// only the standard library, so any package (the API types included) can
// use it.
package names

import (
	"fmt"
	"strings"
)

// Driver is Facet's DRA driver name. It is also the domain of every
// attribute and capacity Facet publishes, the API group of its opaque
// configs (api/gpu.facet.dev/v1alpha1), the CDI vendor of its specs, and the
// name of the kubelet plugin's directory.
const Driver = "gpu.facet.dev"

// Device kinds: the "type" attribute of a published device, and the kind
// of a prepared device in the checkpoint.
const (
	// KindGPU is a whole physical GPU, or a pool of vGPU shares of it.
	KindGPU = "gpu"
	// KindMIG is one MIG instance.
	KindMIG = "mig"
	// KindShare is one vGPU share of a GPU (checkpoint records only; a
	// share is published as a KindGPU device).
	KindShare = "share"
	// KindVGPUSlot is one fixed-size vGPU slot of a GPU in slots mode.
	KindVGPUSlot = "vgpu-slot"
	// KindSlot is a prepared vGPU slot (checkpoint records only): a share
	// that holds its device alone.
	KindSlot = "slot"
	// KindStaticMIG is a prepared MIG instance that existed before its
	// claim (checkpoint records only; published as a KindMIG device):
	// prepare neither carves nor destroys it.
	KindStaticMIG = "mig-static"
	// KindIMEXChannel is a node's IMEX channel device, the one device a
	// ComputeDomain's channel claim gets on each of its nodes
	// (docs/design/compute-domains.md); also its device name in the pool
	// and its kind in the checkpoint.
	KindIMEXChannel = "imex-channel"
)

// Compute domains (docs/design/compute-domains.md): the names the kubelet
// plugin, the controller and the IMEX daemon share.
const (
	// IMEXChannelDevice is the name of a node's one IMEX channel device in
	// its pool, published where the driver registers the
	// nvidia-caps-imex-channels major and the GPUs report a fabric clique.
	IMEXChannelDevice = KindIMEXChannel
	// ClassIMEXChannel is the DeviceClass of IMEX channel devices
	// (deployments/deviceclasses.yaml), which a ComputeDomain's channel
	// ResourceClaimTemplate names.
	ClassIMEXChannel = "imex-channel.facet.dev"
	// LabelComputeDomain is the Node label the kubelet plugin sets, to the
	// domain's UID, while a channel claim of that domain is prepared (or
	// waits for its IMEX daemon) on the node; the domain's IMEX daemon
	// DaemonSet selects nodes by it. A node serves one domain at a time.
	LabelComputeDomain = Driver + "/compute-domain"
	// FinalizerComputeDomain is the controller's finalizer on a
	// ComputeDomain, held until no channel claim of it is prepared.
	FinalizerComputeDomain = Driver + "/compute-domain"
	// Environment variables of an IMEX channel claim's CDI spec, which its
	// containers see: the domain's metadata.uid, its name, and the node's
	// fabric clique, "<fabricClusterUUID>.<fabricCliqueID>".
	EnvComputeDomainUID    = "FACET_COMPUTE_DOMAIN_UID"
	EnvComputeDomainName   = "FACET_COMPUTE_DOMAIN_NAME"
	EnvComputeDomainClique = "FACET_COMPUTE_DOMAIN_CLIQUE"
)

// Attribute names, in the driver's domain.
const (
	AttrType                  = "type"
	AttrIndex                 = "index"
	AttrUUID                  = "uuid"
	AttrProductName           = "productName"
	AttrArchitecture          = "architecture"
	AttrBrand                 = "brand"
	AttrCUDAComputeCapability = "cudaComputeCapability"
	AttrDriverVersion         = "driverVersion"
	AttrCUDADriverVersion     = "cudaDriverVersion"
	AttrMode                  = "mode"
	AttrNUMANode              = "numaNode"
	AttrMIGCapable            = "migCapable"
	// MIG devices only.
	AttrProfile        = "profile"
	AttrParentUUID     = "parentUUID"
	AttrPlacementStart = "placementStart"
	// AttrMIGUUID is a static MIG instance's own UUID.
	AttrMIGUUID = "migUUID"
	// AttrMIGInUse is set on every device of a GPU in mig or dynamic mode:
	// true while a prepared claim holds a MIG instance carved there. A
	// claim's prioritized list can prefer such a GPU to an untouched one
	// (demo/mig/prefer-existing.yaml).
	AttrMIGInUse = "migInUse"
	// AttrSlot is a vGPU slot's number on its GPU.
	AttrSlot = "slot"
	// AttrComputePartitioning, on vGPU shares (shareable gpu-<i>) and
	// slots, is how the node holds a share to its cores by default:
	// PartitioningMPS or PartitioningTimeSliced. A claim's VgpuConfig
	// partitioning may still choose the other.
	AttrComputePartitioning = "computePartitioning"

	// Topology, on every device of a GPU (a MIG device, share or slot
	// has its parent GPU's), each only where NVML or sysfs says; see
	// docs/workloads.md, "Topology".
	//
	// AttrNVLinkDomain is the same string on exactly the GPUs of this node
	// joined by NVLink (directly or through NVSwitches): all eight of an
	// HGX, the two of an H100 NVL bridge pair; absent without NVLink. A
	// claim's matchAttribute on it keeps its GPUs in one NVLink domain.
	AttrNVLinkDomain = "nvlinkDomain"
	// AttrNVLinkLinks is the number of the GPU's active NVLinks (0 where
	// NVML supports NVLink and none is up).
	AttrNVLinkLinks = "nvlinkLinks"
	// AttrNVLinkBandwidth is their total bandwidth in GB/s, both
	// directions counted, as NVIDIA's datasheets give it (900 on an H100
	// SXM5).
	AttrNVLinkBandwidth = "nvlinkBandwidthGBps"
	// AttrPCIeSwitch is the bus ID of the upstream port of the PCIe switch
	// the GPU sits under (sysfs); GPUs with the same value are one switch
	// apart (nvidia-smi topo's PIX).
	AttrPCIeSwitch = "pcieSwitch"
	// AttrFabricCluster and AttrFabricClique are the GPU's multi-node
	// NVLink fabric (GB200 NVL72): nvmlDeviceGetGpuFabricInfo's cluster
	// UUID and clique ID.
	AttrFabricCluster = "fabricClusterUUID"
	AttrFabricClique  = "fabricCliqueID"
)

// Values of AttrMode: the mode a GPU is published in (inventory.Mode,
// whose documentation says what each offers). The cluster wing matches
// devices on these words.
const (
	ModeExclusive = "exclusive"
	ModeMIG       = "mig"
	ModeShared    = "shared"
	ModeDynamic   = "dynamic"
	ModeStaticMIG = "static-mig"
	ModeSlots     = "slots"
)

// The shipped DeviceClasses of vGPU shares and slots whose compute limit
// is best effort (deployments/deviceclasses.yaml): they also match shares
// and slots whose computePartitioning is "time-sliced", which the plain
// vgpu.facet.dev and vgpu-slot.facet.dev leave out, and carry the
// VgpuConfig partitioning "best-effort".
const (
	ClassVGPUBestEffort     = "vgpu-best-effort.facet.dev"
	ClassVGPUSlotBestEffort = "vgpu-slot-best-effort.facet.dev"
)

// Values of AttrComputePartitioning; the same words as VgpuConfig's
// partitioning.
const (
	PartitioningMPS        = "mps"
	PartitioningTimeSliced = "time-sliced"
)

// Standard attributes, in resource.kubernetes.io, which other drivers
// publish from the same sysfs, so that a claim's CEL or matchAttribute can
// align a GPU with their devices (a NIC on the GPU's PCIe root, CPUs of its
// NUMA node). k8s.io/dynamic-resource-allocation/deviceattribute defines
// them; the v0.35 that Facet builds with has only
// StandardDeviceAttributePCIeRoot, used from there. These two are v0.37's.
const (
	// StandardPCIBusID is deviceattribute.StandardDeviceAttributePCIBusID
	// (k8s.io/dynamic-resource-allocation v0.37.2,
	// deviceattribute/attribute.go): the device's PCI address in extended
	// BDF notation, "dddd:bb:dd.f", a string.
	StandardPCIBusID = "resource.kubernetes.io/pciBusID"
	// StandardNUMANode is deviceattribute.StandardDeviceAttributeNUMANode
	// (v0.37.2): the device's NUMA node from sysfs numa_node, in its scalar
	// int form (the list form needs the alpha DRAListTypeAttributes gate).
	// Never published for a device with numa_node -1: the value would match
	// every other device without NUMA affinity.
	StandardNUMANode = "resource.kubernetes.io/numaNode"
)

// Capacity names, in the driver's domain.
const (
	// CapacityMemory is framebuffer memory in bytes: a whole GPU's, a MIG
	// instance's, or the pool a vGPU share takes its part of.
	CapacityMemory = "memory"
	// CapacityCores is the percentage of the GPU's SM time a vGPU share may
	// use (HAMi-core's limit); 0 asks for best effort.
	CapacityCores = "cores"
	// CapacityMultiprocessors is a MIG instance's number of SMs.
	CapacityMultiprocessors = "multiprocessors"
	// CapacityClients is the number of MPS clients a vGPU share may run
	// on its GPU's MPS control daemon, of MPSMaxClients. A share takes 1
	// unless its request asks for more, so at most MPSMaxClients shares
	// fit on a GPU, and the allocator enforces it.
	CapacityClients = "clients"
)

// MPSMaxClients is how many client CUDA contexts one MPS server serves per
// GPU on Volta and later (NVIDIA, "Multi-Process Service", Considerations,
// Limitations: 48; 16 before Volta): never more shares or slots on a GPU.
const MPSMaxClients = 48

// CounterMediaExtensions is the counter, of value 1, that every "+me" MIG
// profile consumes: a GPU has one set of the engines a "+me" instance takes
// (JPEG and OFA; NVIDIA's MIG user guide: "only one instance of a +me
// profile per GPU"), so two "+me" instances never fit together, whatever
// their profiles (the A30 has two "+me" profiles). The memory slices'
// counters are inventory.MemorySliceCounter.
const CounterMediaExtensions = "media-extensions"

// Health: the device taint on every device of an unhealthy GPU (its value
// is the fault's reason, e.g. "xid-79"; NoExecute for a fatal fault,
// NoSchedule for a recoverable one), and the Node annotation by which an
// operator asks the node's plugin to recover GPUs (`facetctl health
// recover` writes it; format in gpuhealth.ParseRecoverRequests).
const (
	TaintUnhealthy    = Driver + "/unhealthy"
	AnnotationRecover = Driver + "/recover"
)

// AnnotationPreferExistingMIG, on a ResourceClaim or ResourceClaimTemplate,
// governs facet-webhook's rewrite of its plain MIG requests into the
// existing-first prioritized list (docs/admins.md, "Existing MIG instances
// first"). "false", written by the author, keeps the requests as written;
// the webhook writes "rewrote <request>,..." on what it rewrote.
const AnnotationPreferExistingMIG = Driver + "/prefer-existing-mig"

// Parse returns the element of known that is s, or an error naming what s
// should be and listing known: `unknown mode "turbo" (known: auto,
// exclusive, ...)`. It is the one parser of Facet's string enumerations
// (modes, orders, the webhook's and the preemptor's settings).
func Parse[T ~string](s, what string, known ...T) (T, error) {
	names := make([]string, len(known))
	for i, k := range known {
		if string(k) == s {
			return k, nil
		}
		names[i] = string(k)
	}
	return "", fmt.Errorf("unknown %s %q (known: %s)", what, s, strings.Join(names, ", "))
}
