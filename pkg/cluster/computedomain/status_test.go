package computedomain

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
)

// entries renders status.nodes as "index:name:ip:clique:status".
func entries(nodes []v1alpha1.ComputeDomainNode) string {
	var parts []string
	for _, n := range nodes {
		parts = append(parts, fmt.Sprintf("%d:%s:%s:%s:%s", n.Index, n.Name, n.IPAddress, strings.TrimPrefix(n.CliqueID, fabric), n.Status))
	}
	return strings.Join(parts, " ")
}

// TestNodes: status.nodes from the labelled nodes and the daemon pods:
// kept indexes, the lowest free index for a new node, the InternalIP, the
// node's clique from its channel, Ready from the daemon pod.
func TestNodes(t *testing.T) {
	cd := domain("train", 3)
	uid := string(cd.UID)
	chs := occupancy.Channels([]*resourceapi.ResourceSlice{channelSlice("a", 1), channelSlice("b", 1), channelSlice("c", 1), channelSlice("d", -1)}, nil, "")
	for _, tc := range []struct {
		name  string
		prev  []v1alpha1.ComputeDomainNode
		nodes []*corev1.Node
		pods  []*corev1.Pod
		want  string
	}{
		{name: "none labelled", want: ""},
		{name: "new nodes in name order, daemons not there yet",
			nodes: []*corev1.Node{node("b", "10.0.0.2", uid), node("a", "10.0.0.1", uid)},
			want:  "0:a:10.0.0.1:.1:NotReady 1:b:10.0.0.2:.1:NotReady"},
		{name: "ready daemon pods; a not-ready one; another domain's pod does not count",
			nodes: []*corev1.Node{node("a", "10.0.0.1", uid), node("b", "10.0.0.2", uid), node("c", "10.0.0.3", uid)},
			pods:  []*corev1.Pod{daemonPod(cd, "a", true, 0), daemonPod(cd, "b", false, 0)},
			want:  "0:a:10.0.0.1:.1:Ready 1:b:10.0.0.2:.1:NotReady 2:c:10.0.0.3:.1:NotReady"},
		{name: "a node that stays keeps its index; a new one takes the free index",
			prev:  []v1alpha1.ComputeDomainNode{{Name: "a", Index: 0}, {Name: "b", Index: 1}, {Name: "c", Index: 2}},
			nodes: []*corev1.Node{node("c", "10.0.0.3", uid), node("a", "10.0.0.1", uid), node("d", "10.0.0.4", uid)},
			want:  "0:a:10.0.0.1:.1:NotReady 1:d:10.0.0.4::NotReady 2:c:10.0.0.3:.1:NotReady"},
		{name: "no InternalIP, no channel clique",
			nodes: []*corev1.Node{node("d", "", uid)},
			want:  "0:d:::NotReady"},
		{name: "a daemon pod being deleted is not the node's daemon",
			nodes: []*corev1.Node{node("a", "10.0.0.1", uid)},
			pods: func() []*corev1.Pod {
				p := daemonPod(cd, "a", true, 0)
				p.DeletionTimestamp = &cd.CreationTimestamp
				return []*corev1.Pod{p}
			}(),
			want: "0:a:10.0.0.1:.1:NotReady"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := cd.DeepCopy()
			d.Status.Nodes = tc.prev
			if got := entries(Nodes(d, tc.nodes, tc.pods, chs)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestSetReadiness: Ready at numNodes ready daemons, and the condition
// names the nodes not ready and those missing.
func TestSetReadiness(t *testing.T) {
	cd := domain("train", 3)
	for _, tc := range []struct {
		name   string
		nodes  []v1alpha1.ComputeDomainNode
		status v1alpha1.ComputeDomainState
		msg    string
	}{
		{"none", nil, v1alpha1.ComputeDomainNotReady, "0 of 3 IMEX daemons ready; 3 node(s) not in the domain yet (no pod of it prepared there)"},
		{"one not ready, one missing", []v1alpha1.ComputeDomainNode{{Name: "a", Status: "Ready"}, {Name: "b", Status: "NotReady"}},
			v1alpha1.ComputeDomainNotReady, "1 of 3 IMEX daemons ready; not ready on b; 1 node(s) not in the domain yet (no pod of it prepared there)"},
		{"all", []v1alpha1.ComputeDomainNode{{Name: "a", Status: "Ready"}, {Name: "b", Status: "Ready"}, {Name: "c", Status: "Ready"}},
			v1alpha1.ComputeDomainReady, "3 of 3 IMEX daemons ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &v1alpha1.ComputeDomainStatus{Nodes: tc.nodes}
			SetReadiness(cd, st)
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDaemonsReady)
			if st.Status != tc.status || c == nil || c.Message != tc.msg || (c.Status == "True") != (tc.status == v1alpha1.ComputeDomainReady) {
				t.Errorf("status %s, condition %+v; want %s, %q", st.Status, c, tc.status, tc.msg)
			}
		})
	}
}

// TestTransitions: the Events of a change of status.nodes.
func TestTransitions(t *testing.T) {
	e := func(name string, idx int32, ready bool) v1alpha1.ComputeDomainNode {
		s := v1alpha1.ComputeDomainNotReady
		if ready {
			s = v1alpha1.ComputeDomainReady
		}
		return v1alpha1.ComputeDomainNode{Name: name, Index: idx, IPAddress: "10.0.0." + fmt.Sprint(idx+1), Status: s}
	}
	for _, tc := range []struct {
		name     string
		old, new []v1alpha1.ComputeDomainNode
		gone     map[string]bool
		want     []string // "reason: message part"
	}{
		{name: "nothing changed", old: []v1alpha1.ComputeDomainNode{e("a", 0, false)}, new: []v1alpha1.ComputeDomainNode{e("a", 0, false)}},
		{name: "a node joins", new: []v1alpha1.ComputeDomainNode{e("a", 0, false)},
			want: []string{"NodeJoined: node a joined the domain (index 0, 10.0.0.1)"}},
		{name: "without an address", new: []v1alpha1.ComputeDomainNode{{Name: "a", Status: "NotReady"}},
			want: []string{"NodeJoined: without an InternalIP"}},
		{name: "the daemons become ready, the domain too",
			old:  []v1alpha1.ComputeDomainNode{e("a", 0, true), e("b", 1, false)},
			new:  []v1alpha1.ComputeDomainNode{e("a", 0, true), e("b", 1, true)},
			want: []string{"DaemonReady: IMEX daemon on node b is ready", "DomainReady: 2 of 2"}},
		{name: "a daemon crashes",
			old:  []v1alpha1.ComputeDomainNode{e("a", 0, true), e("b", 1, true)},
			new:  []v1alpha1.ComputeDomainNode{e("a", 0, true), e("b", 1, false)},
			want: []string{"DaemonNotReady: IMEX daemon on node b is not ready", "DomainNotReady: 1 of 2"}},
		{name: "a node is lost, another leaves",
			old:  []v1alpha1.ComputeDomainNode{e("a", 0, true), e("b", 1, true)},
			gone: map[string]bool{"a": true},
			want: []string{"NodeLost: node a is gone", "NodeLeft: node b holds no channel claim", "DomainNotReady: 0 of 2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Transitions(2, tc.old, tc.new, tc.gone)
			if len(got) != len(tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
			for i, w := range tc.want {
				reason, msg, _ := strings.Cut(w, ": ")
				if got[i].Reason != reason || !strings.Contains(got[i].Message, msg) {
					t.Errorf("event %d: %+v, want %s", i, got[i], w)
				}
				if warn := got[i].Type == corev1.EventTypeWarning; warn != (reason == ReasonNodeLost || reason == ReasonDaemonNotReady || reason == ReasonNotReady || strings.Contains(w, "InternalIP")) {
					t.Errorf("event %d: type %s", i, got[i].Type)
				}
			}
		})
	}
}

// TestHolders: the pods a deleted domain waits for.
func TestHolders(t *testing.T) {
	cd := domain("train", 2)
	claims := []*resourceapi.ResourceClaim{
		channelClaim(cd, "c0", "n1", "worker-1"),
		channelClaim(cd, "c1", "n2", ""),         // allocated, pod gone
		channelClaim(cd, "c2", "", ""),           // never allocated
		channelClaim(cd, "c3", "n3", "worker-0"), // running
	}
	if got := strings.Join(Holders(claims), ","); got != "ml/worker-0,ml/worker-1" {
		t.Errorf("Holders %s", got)
	}
	msg := WaitingMessage(Holders(claims), []*corev1.Node{node("n2", "", "x")})
	for _, part := range []string{"2 pod(s) hold its IMEX channels (ml/worker-0, ml/worker-1)", "has not unprepared its channel yet (n2)", "delete its Node object"} {
		if !strings.Contains(msg, part) {
			t.Errorf("WaitingMessage %q lacks %q", msg, part)
		}
	}
}
