package computedomain

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
)

// Event is an Event to raise on the domain.
type Event struct {
	Type, Reason, Message string
}

// Nodes is the domain's status.nodes from what is observed: one entry per
// node labelled with its UID (labelled), with the node's InternalIP, its
// clique (its imex-channel device's) and whether its IMEX daemon pod (of
// pods, the domain's) is Ready. A node already in status.nodes keeps its
// index, so a running daemon's peer list never reorders; a new node takes
// the lowest index free, new nodes in name order. Sorted by index.
func Nodes(cd *v1alpha1.ComputeDomain, labelled []*corev1.Node, pods []*corev1.Pod, channels []*occupancy.Channel) []v1alpha1.ComputeDomainNode {
	prev := map[string]int32{}
	for _, n := range cd.Status.Nodes {
		prev[n.Name] = n.Index
	}
	clique := map[string]string{}
	for _, ch := range channels {
		if ch.Clique != "" && clique[ch.Node] == "" {
			clique[ch.Node] = ch.Clique
		}
	}
	sorted := append([]*corev1.Node(nil), labelled...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	used := map[int32]bool{}
	out := make([]v1alpha1.ComputeDomainNode, 0, len(sorted))
	var fresh []int
	for _, n := range sorted {
		e := v1alpha1.ComputeDomainNode{Name: n.Name, IPAddress: InternalIP(n), CliqueID: clique[n.Name], Status: v1alpha1.ComputeDomainNotReady, Index: -1}
		if DaemonReady(pods, n.Name) {
			e.Status = v1alpha1.ComputeDomainReady
		}
		if i, ok := prev[n.Name]; ok && !used[i] {
			e.Index = i
			used[i] = true
		} else {
			fresh = append(fresh, len(out))
		}
		out = append(out, e)
	}
	next := int32(0)
	for _, k := range fresh {
		for used[next] {
			next++
		}
		out[k].Index = next
		used[next] = true
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// InternalIP is the node's first InternalIP address, "" where it has none.
func InternalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// DaemonPod is the domain's daemon pod on the node that is not being
// deleted, the newest where there are several; nil where there is none.
func DaemonPod(pods []*corev1.Pod, node string) *corev1.Pod {
	var out *corev1.Pod
	for _, p := range pods {
		if p.Spec.NodeName != node || p.DeletionTimestamp != nil {
			continue
		}
		if out == nil || out.CreationTimestamp.Before(&p.CreationTimestamp) {
			out = p
		}
	}
	return out
}

// DaemonReady reports whether the domain's daemon pod on the node is
// Ready: its readiness probe (`facet-imex probe`, nvidia-imex-ctl -q
// saying READY) passes.
func DaemonReady(pods []*corev1.Pod, node string) bool {
	p := DaemonPod(pods, node)
	if p == nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Restarts is how often the pod's IMEX container restarted, and how it
// last ended ("exit code 1 (Error)"), from its status.
func Restarts(p *corev1.Pod) (int32, string) {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name != Container {
			continue
		}
		how := ""
		if t := s.LastTerminationState.Terminated; t != nil {
			how = fmt.Sprintf("exit code %d", t.ExitCode)
			if t.Reason != "" {
				how += " (" + t.Reason + ")"
			}
		}
		return s.RestartCount, how
	}
	return 0, ""
}

// ReadyCount counts the entries whose daemon is Ready.
func ReadyCount(nodes []v1alpha1.ComputeDomainNode) int {
	n := 0
	for _, e := range nodes {
		if e.Status == v1alpha1.ComputeDomainReady {
			n++
		}
	}
	return n
}

// SetReadiness sets status.status and the DaemonsReady condition from the
// entries: Ready when numNodes daemons are.
func SetReadiness(cd *v1alpha1.ComputeDomain, st *v1alpha1.ComputeDomainStatus) {
	ready := ReadyCount(st.Nodes)
	want := int(cd.Spec.NumNodes)
	cond := metav1.Condition{Type: v1alpha1.ConditionDaemonsReady, ObservedGeneration: cd.Generation}
	if ready >= want {
		st.Status = v1alpha1.ComputeDomainReady
		cond.Status, cond.Reason = metav1.ConditionTrue, CondDaemonsReady
		cond.Message = fmt.Sprintf("%d of %d IMEX daemons ready", ready, want)
	} else {
		st.Status = v1alpha1.ComputeDomainNotReady
		cond.Status, cond.Reason = metav1.ConditionFalse, CondDaemonsMissed
		var notReady []string
		for _, e := range st.Nodes {
			if e.Status != v1alpha1.ComputeDomainReady {
				notReady = append(notReady, e.Name)
			}
		}
		cond.Message = fmt.Sprintf("%d of %d IMEX daemons ready", ready, want)
		if len(notReady) > 0 {
			cond.Message += "; not ready on " + strings.Join(notReady, ", ")
		}
		if missing := want - len(st.Nodes); missing > 0 {
			cond.Message += fmt.Sprintf("; %d node(s) not in the domain yet (no pod of it prepared there)", missing)
		}
	}
	meta.SetStatusCondition(&st.Conditions, cond)
}

// Transitions are the Events that the change of status.nodes from old to
// new says: nodes that joined, left (gone: the Node object is deleted, a
// Warning) and whose daemon became Ready or stopped being Ready, and the
// domain becoming Ready or no longer.
func Transitions(numNodes int32, old, new []v1alpha1.ComputeDomainNode, gone map[string]bool) []Event {
	was := map[string]v1alpha1.ComputeDomainNode{}
	for _, e := range old {
		was[e.Name] = e
	}
	is := map[string]bool{}
	var out []Event
	for _, e := range new {
		is[e.Name] = true
		o, ok := was[e.Name]
		switch {
		case !ok:
			ip := e.IPAddress
			if ip == "" {
				out = append(out, Event{corev1.EventTypeWarning, ReasonNodeJoined, fmt.Sprintf("node %s joined the domain (index %d) without an InternalIP: the other IMEX daemons cannot reach it", e.Name, e.Index)})
			} else {
				out = append(out, Event{corev1.EventTypeNormal, ReasonNodeJoined, fmt.Sprintf("node %s joined the domain (index %d, %s)", e.Name, e.Index, ip)})
			}
			if e.Status == v1alpha1.ComputeDomainReady {
				out = append(out, Event{corev1.EventTypeNormal, ReasonDaemonReady, fmt.Sprintf("IMEX daemon on node %s is ready", e.Name)})
			}
		case o.Status != e.Status && e.Status == v1alpha1.ComputeDomainReady:
			out = append(out, Event{corev1.EventTypeNormal, ReasonDaemonReady, fmt.Sprintf("IMEX daemon on node %s is ready", e.Name)})
		case o.Status != e.Status:
			out = append(out, Event{corev1.EventTypeWarning, ReasonDaemonNotReady, fmt.Sprintf("IMEX daemon on node %s is not ready: new channel prepares there wait; running pods keep their channel", e.Name)})
		}
	}
	for _, o := range old {
		if is[o.Name] {
			continue
		}
		if gone[o.Name] {
			out = append(out, Event{corev1.EventTypeWarning, ReasonNodeLost, fmt.Sprintf("node %s is gone (its Node object was deleted): dropped from the domain's peer list", o.Name)})
		} else {
			out = append(out, Event{corev1.EventTypeNormal, ReasonNodeLeft, fmt.Sprintf("node %s holds no channel claim of the domain any more: dropped from the peer list, its IMEX daemon goes", o.Name)})
		}
	}
	before, after := ReadyCount(old) >= int(numNodes), ReadyCount(new) >= int(numNodes)
	switch {
	case after && !before:
		out = append(out, Event{corev1.EventTypeNormal, ReasonReady, fmt.Sprintf("%d of %d IMEX daemons ready", ReadyCount(new), numNodes)})
	case before && !after:
		out = append(out, Event{corev1.EventTypeWarning, ReasonNotReady, fmt.Sprintf("%d of %d IMEX daemons ready", ReadyCount(new), numNodes)})
	}
	return out
}
