package v1alpha1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ComputeDomain kinds and names. A ComputeDomain is a served custom
// resource (CRD computedomains.gpu.facet.dev), unlike the opaque config
// kinds; ComputeDomainChannelConfig is the opaque config that the channel
// ResourceClaimTemplate a domain's controller writes carries.
const (
	ComputeDomainKind              = "ComputeDomain"
	ComputeDomainListKind          = "ComputeDomainList"
	ComputeDomainChannelConfigKind = "ComputeDomainChannelConfig"
	// ComputeDomainResource is the CRD's plural resource name.
	ComputeDomainResource = "computedomains"
)

// ChannelAllocationMode says how many IMEX channels a pod of a domain gets
// on its node: Single, channel 0 (the default, as NVIDIA's driver), or All,
// every channel the driver offers (nvidia.ko's NVreg_ImexChannelCount,
// 2048 by default).
type ChannelAllocationMode string

const (
	ChannelAllocationSingle ChannelAllocationMode = "Single"
	ChannelAllocationAll    ChannelAllocationMode = "All"
)

// ComputeDomainState is a domain's or one of its nodes' readiness.
type ComputeDomainState string

const (
	ComputeDomainReady    ComputeDomainState = "Ready"
	ComputeDomainNotReady ComputeDomainState = "NotReady"
)

// Condition types of ComputeDomainStatus.Conditions.
const (
	// ConditionCliqueAssigned is True once the controller has pinned the
	// domain to one NVLink fabric clique (Status.Clique) and written the
	// channel ResourceClaimTemplate; False with reason NoCliqueFits when no
	// clique has NumNodes free IMEX channels (the template is then pinned
	// to the clique with the most, and pods beyond it stay Pending).
	ConditionCliqueAssigned = "CliqueAssigned"
	// ConditionDaemonsReady is True when NumNodes IMEX daemons of the
	// domain are ready.
	ConditionDaemonsReady = "DaemonsReady"
)

// The CRD computedomains.gpu.facet.dev is made from the kubebuilder markers
// below and on the fields by `make generate` (controller-gen, into
// deployments/helm/facet/files/crds): it validates what
// ValidateComputeDomainSpec does, keeps the spec immutable and serves status
// as a subresource, which only the controller writes.

// ComputeDomain is a set of nodes of one NVLink fabric clique that run one
// multi-node job, joined by NVIDIA's IMEX service so that the job's
// processes can import each other's GPU memory over NVLink. Facet's
// controller pins the domain to a clique, writes the channel
// ResourceClaimTemplate its pods use, and runs an IMEX daemon on every node
// where one of those pods' channel claims is prepared; the kubelet plugin
// injects a node's IMEX channel into a pod only once that node's daemon is
// ready (docs/design/compute-domains.md).
//
// The field names follow NVIDIA's ComputeDomain (resource.nvidia.com,
// api/nvidia.com/resource/v1beta1/computedomain.go in
// NVIDIA/k8s-dra-driver-gpu) so a manifest moves over by changing its
// apiVersion; where Facet differs (numNodes is required and places the
// domain; status.clique) the field's doc says so.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=facet
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.spec.numNodes`,description="spec.numNodes: the nodes the job spans"
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.channel.resourceClaimTemplate.name`,description="the channel ResourceClaimTemplate the job's pods name"
// +kubebuilder:printcolumn:name="Clique",type=string,JSONPath=`.status.clique`,description="the NVLink fabric clique the domain is pinned to"
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.status`,description="Ready when numNodes IMEX daemons are ready"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ComputeDomain struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec   ComputeDomainSpec   `json:"spec"`
	Status ComputeDomainStatus `json:"status,omitempty"`
}

// ComputeDomainList is a list of ComputeDomains.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type ComputeDomainList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []ComputeDomain `json:"items"`
}

// ComputeDomainSpec is what a domain asks for. It is immutable once
// created.
//
// +k8s:deepcopy-gen=true
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: delete the ComputeDomain and create it anew"
type ComputeDomainSpec struct {
	// NumNodes is how many nodes the job spans, 1 to MaxComputeDomainNodes.
	// Required. The controller pins the domain to a clique with this many
	// free IMEX channels, and the domain is Ready when this many daemons
	// are. NVIDIA's field of the same name is optional and deprecated
	// there; Facet needs it to place the domain in one clique before any
	// pod is scheduled.
	//
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	NumNodes int32 `json:"numNodes"`
	// Channel is the ResourceClaimTemplate the domain's pods use.
	//
	// +required
	Channel ComputeDomainChannelSpec `json:"channel"`
}

// MaxComputeDomainNodes bounds NumNodes: 64 nodes, more than the largest
// NVLink domain NVIDIA ships (GB200/GB300 NVL72: 18 compute trays;
// NVL144-class racks: 36).
const MaxComputeDomainNodes = 64

// ComputeDomainChannelSpec names the channel claim template.
//
// +k8s:deepcopy-gen=true
type ComputeDomainChannelSpec struct {
	// ResourceClaimTemplate is the template the controller creates in the
	// domain's namespace; the job's pods name it in
	// spec.resourceClaims[].resourceClaimTemplateName.
	//
	// +required
	ResourceClaimTemplate ComputeDomainResourceClaimTemplate `json:"resourceClaimTemplate"`
	// AllocationMode is Single (default) or All.
	//
	// +optional
	// +kubebuilder:validation:Enum=Single;All
	// +kubebuilder:default=Single
	AllocationMode ChannelAllocationMode `json:"allocationMode,omitempty"`
}

// ComputeDomainResourceClaimTemplate names a ResourceClaimTemplate.
//
// +k8s:deepcopy-gen=true
type ComputeDomainResourceClaimTemplate struct {
	// Name is a DNS subdomain name, unique in the namespace.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// ComputeDomainStatus is what the controller observed. Workloads should not
// read it to decide when to start: a pod starts only once its node's daemon
// is ready.
//
// +k8s:deepcopy-gen=true
type ComputeDomainStatus struct {
	// Status is Ready when NumNodes daemons are ready, else NotReady.
	//
	// +optional
	// +kubebuilder:validation:Enum=Ready;NotReady
	Status ComputeDomainState `json:"status,omitempty"`
	// Clique is the NVLink fabric clique the domain is pinned to,
	// "<fabricClusterUUID>.<fabricCliqueID>" (the GPUs' published
	// attributes), empty until the controller has chosen. Facet's
	// addition: NVIDIA's driver does not pin a domain to a clique.
	Clique string `json:"clique,omitempty"`
	// Nodes are the nodes where a channel claim of the domain is prepared
	// or being prepared, one entry per node, sorted by Index.
	//
	// +optional
	// +listType=map
	// +listMapKey=name
	Nodes []ComputeDomainNode `json:"nodes,omitempty"`
	// Conditions are CliqueAssigned and DaemonsReady.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ComputeDomainNode is one node of a domain and its IMEX daemon.
//
// +k8s:deepcopy-gen=true
type ComputeDomainNode struct {
	// Name is the Node's name.
	Name string `json:"name"`
	// IPAddress is the node's InternalIP, the address the IMEX daemons of
	// the domain reach each other on (their peer list).
	IPAddress string `json:"ipAddress"`
	// CliqueID is the node's clique, "<fabricClusterUUID>.<fabricCliqueID>".
	CliqueID string `json:"cliqueID"`
	// Index is the node's stable place in the peer list, 0 to NumNodes-1:
	// kept while the node stays in the domain, so a peer list never
	// reorders under a running daemon.
	//
	// +kubebuilder:validation:Minimum=0
	Index int32 `json:"index"`
	// Status is the readiness of the node's IMEX daemon.
	//
	// +kubebuilder:validation:Enum=Ready;NotReady
	Status ComputeDomainState `json:"status"`
}

// ComputeDomainChannelConfig is the opaque config of a domain's channel
// claims, written by the controller into the channel
// ResourceClaimTemplate; the kubelet plugin reads it at prepare to know
// which domain's daemon must be ready. A hand-written claim may carry it
// too, but the plugin checks that the domain exists in the claim's
// namespace and has that UID.
//
// +k8s:deepcopy-gen=true
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomainChannelConfig struct {
	metav1.TypeMeta `json:",inline"`
	// DomainUID is the ComputeDomain's metadata.uid. Required.
	DomainUID string `json:"domainUID"`
	// DomainName is the ComputeDomain's name, in the claim's namespace.
	// Required.
	DomainName string `json:"domainName"`
	// AllocationMode is Single (default) or All.
	AllocationMode ChannelAllocationMode `json:"allocationMode,omitempty"`
}

// NewComputeDomainChannelConfig returns a defaulted config for the domain.
func NewComputeDomainChannelConfig(name, uid string, mode ChannelAllocationMode) *ComputeDomainChannelConfig {
	c := &ComputeDomainChannelConfig{DomainUID: uid, DomainName: name, AllocationMode: mode}
	c.Default()
	return c
}

// Default sets apiVersion, kind and AllocationMode (Single).
func (c *ComputeDomainChannelConfig) Default() {
	c.TypeMeta = typeMeta(ComputeDomainChannelConfigKind)
	if c.AllocationMode == "" {
		c.AllocationMode = ChannelAllocationSingle
	}
}

// Validate checks the fields; errors name them, e.g.
// `domainUID: Required value`.
func (c *ComputeDomainChannelConfig) Validate() error {
	var errs field.ErrorList
	if c.DomainUID == "" {
		errs = append(errs, field.Required(field.NewPath("domainUID"), "the ComputeDomain's metadata.uid"))
	}
	if c.DomainName == "" {
		errs = append(errs, field.Required(field.NewPath("domainName"), "the ComputeDomain's name"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(c.DomainName) {
			errs = append(errs, field.Invalid(field.NewPath("domainName"), c.DomainName, msg))
		}
	}
	errs = append(errs, validateAllocationMode(field.NewPath("allocationMode"), c.AllocationMode)...)
	return errs.ToAggregate()
}

func validateAllocationMode(p *field.Path, m ChannelAllocationMode) field.ErrorList {
	switch m {
	case "", ChannelAllocationSingle, ChannelAllocationAll:
		return nil
	}
	return field.ErrorList{field.NotSupported(p, m, []string{string(ChannelAllocationSingle), string(ChannelAllocationAll)})}
}

// ValidateComputeDomainSpec checks a spec as the CRD's schema does (the
// controller checks again, so a domain created while the CRD was older
// fails with a condition, not a crash). Errors name fields under
// spec, e.g. `spec.numNodes: Invalid value: 0: must be between 1 and 64`.
func ValidateComputeDomainSpec(s *ComputeDomainSpec) error {
	p := field.NewPath("spec")
	var errs field.ErrorList
	if s.NumNodes < 1 || s.NumNodes > MaxComputeDomainNodes {
		errs = append(errs, field.Invalid(p.Child("numNodes"), s.NumNodes,
			fmt.Sprintf("must be between 1 and %d", MaxComputeDomainNodes)))
	}
	tp := p.Child("channel", "resourceClaimTemplate", "name")
	if s.Channel.ResourceClaimTemplate.Name == "" {
		errs = append(errs, field.Required(tp, "the ResourceClaimTemplate the domain's pods use"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(s.Channel.ResourceClaimTemplate.Name) {
			errs = append(errs, field.Invalid(tp, s.Channel.ResourceClaimTemplate.Name, msg))
		}
	}
	errs = append(errs, validateAllocationMode(p.Child("channel", "allocationMode"), s.Channel.AllocationMode)...)
	return errs.ToAggregate()
}

// CliqueName is the clique key of a fabric cluster UUID and clique ID, as
// ComputeDomainStatus.Clique and ComputeDomainNode.CliqueID spell it.
func CliqueName(clusterUUID string, cliqueID int64) string {
	return fmt.Sprintf("%s.%d", clusterUUID, cliqueID)
}
