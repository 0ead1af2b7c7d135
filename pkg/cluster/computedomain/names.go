// Package computedomain is Facet's compute-domain controller
// (docs/design/compute-domains.md): for each ComputeDomain
// (computedomains.gpu.facet.dev) it pins the domain to one NVLink fabric
// clique, writes the channel ResourceClaimTemplate whose CEL selector keeps
// every pod of the domain in that clique, runs the domain's IMEX daemons as
// a DaemonSet on the nodes the kubelet plugin labels with the domain's
// UID, writes status.nodes (the daemons' peer list) and readiness from
// those nodes and daemon pods, and tears the DaemonSet and template down
// once the domain is deleted and no pod holds its channels any more.
//
// It follows NVIDIA's compute-domain controller
// (NVIDIA/k8s-dra-driver-gpu cmd/compute-domain-controller: a template
// and one DaemonSet per domain, selected by a node label, a finalizer on
// the domain) and departs where the design says: the clique is chosen
// here, readiness comes from the daemon pods, this controller is the one
// writer of a domain's status, and deletion waits for the pods.
//
// The logic is in pure functions (Choose, Template, DaemonSet, Nodes,
// Transitions, ...) that the Controller applies with informers, a
// workqueue and Events; Main runs it as facet-controller does.
package computedomain

import "github.com/facet-gpu/facet/pkg/model/names"

// The words the controller shares with the kubelet plugin and the IMEX
// daemon (docs/design/compute-domains.md, "Objects and names").
const (
	// DeviceClass is the class of IMEX channel devices the channel
	// template's request names.
	DeviceClass = names.ClassIMEXChannel
	// Label is the node label the kubelet plugin sets to a domain's UID
	// while a channel claim of it is prepared there; the IMEX DaemonSet's
	// nodeSelector. The controller also puts it on what it creates for a
	// domain (DaemonSet, its pods, the template and its claims), so that
	// each is found by the domain's UID.
	Label = names.LabelComputeDomain
	// Finalizer holds a deleted ComputeDomain until no pod holds its
	// channels and its DaemonSet is gone.
	Finalizer = names.FinalizerComputeDomain
	// Request is the name of the channel template's one request.
	Request = "channel"
	// Container is the name of the IMEX daemon's container in the pod
	// template (--imex-pod-template), to which the controller adds the
	// domain's arguments.
	Container = "imex"
)

// Annotations on the DaemonSet: whose it is, beyond the UID its label
// carries (a label value cannot hold a namespace and name), and a hash of
// the spec the controller wrote, so that a changed pod template (a chart
// upgrade) updates the DaemonSet and nothing else does.
const (
	AnnotationDomain = names.Driver + "/compute-domain-name"
	AnnotationHash   = names.Driver + "/imex-spec-hash"
)

// Event reasons, on the ComputeDomain.
const (
	// ReasonCliqueAssigned: the domain is pinned to a clique that holds
	// numNodes free channels, and its template selects it.
	ReasonCliqueAssigned = "CliqueAssigned"
	// ReasonNoCliqueFits: no clique has numNodes free channels (Warning).
	ReasonNoCliqueFits = "NoCliqueFits"
	// ReasonTemplateConflict: a ResourceClaimTemplate of the name
	// spec.channel names exists and is not the domain's (Warning).
	ReasonTemplateConflict = "TemplateConflict"
	// ReasonInvalidSpec: the spec fails ValidateComputeDomainSpec, which
	// the CRD's schema should have refused (Warning).
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonNodeJoined: a node's plugin labelled it for the domain.
	ReasonNodeJoined = "NodeJoined"
	// ReasonNodeLeft: the node holds no channel claim of the domain any
	// more (its plugin removed the label).
	ReasonNodeLeft = "NodeLeft"
	// ReasonNodeLost: the Node object is gone while in the domain
	// (Warning).
	ReasonNodeLost = "NodeLost"
	// ReasonDaemonReady and ReasonDaemonNotReady: a node's IMEX daemon
	// pod became Ready, or stopped being Ready (Warning).
	ReasonDaemonReady    = "DaemonReady"
	ReasonDaemonNotReady = "DaemonNotReady"
	// ReasonDaemonRestarted: a node's IMEX daemon container restarted
	// (Warning), with how it ended.
	ReasonDaemonRestarted = "DaemonRestarted"
	// ReasonReady and ReasonNotReady: the domain as a whole, numNodes
	// daemons ready or no longer.
	ReasonReady    = "DomainReady"
	ReasonNotReady = "DomainNotReady"
	// ReasonWaitingForPods: the domain is deleted and pods still hold its
	// channels; its daemons stay until they end.
	ReasonWaitingForPods = "WaitingForPods"
	// ReasonTornDown: the DaemonSet and template are gone and the
	// finalizer removed.
	ReasonTornDown = "TornDown"
)

// Condition reasons.
const (
	CondFits          = "Fits"
	CondNoCliqueFits  = "NoCliqueFits"
	CondConflict      = "TemplateConflict"
	CondInvalidSpec   = "InvalidSpec"
	CondDaemonsReady  = "DaemonsReady"
	CondDaemonsMissed = "WaitingForDaemons"
)
