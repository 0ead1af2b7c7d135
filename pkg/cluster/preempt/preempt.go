// Package preempt decides, for a pod whose ResourceClaims cannot be
// allocated, which lower-priority pods to evict so that they can: the
// preemption the kube-scheduler does for CPU, memory and extended resources
// but not, through Kubernetes 1.37, for DRA claims (KEP-5690 is not
// merged). The upstream structured allocator (pkg/cluster/fit, the scheduler's own
// code) decides every fit; this package only chooses whom to try to free,
// by the scheduler's rules (k8s.io/kubernetes pkg/scheduler/framework/
// preemption and plugins/defaultpreemption):
//
//   - on each node, every running pod of lower priority that holds claims
//     allocated from the node's Facet devices, and that no Protection
//     spares, is a potential victim; the node is a candidate only if the
//     claims fit with all of them gone;
//   - then the potential victims are given back one by one, the most
//     important first (higher priority, then earlier start), each kept
//     where the claims still fit without it: what is left are the victims;
//   - of the candidate nodes, the one whose most important victim has the
//     lowest priority wins, then the smallest sum of priorities, then the
//     fewest victims, then the latest start of the most important victims,
//     then the node's name.
//
// Decide is pure: a Snapshot in, a Decision out; the controller
// (pkg/cluster/preempt/controller) reads the cluster and evicts.
package preempt

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// Snapshot is the cluster as the decision sees it.
type Snapshot struct {
	// Slices are the ResourceSlices of Facet's driver; their pools are
	// nodes' names.
	Slices  []*resourceapi.ResourceSlice
	Classes []*resourceapi.DeviceClass
	// Claims are all the cluster's ResourceClaims: the preemptor's, and
	// those with status.allocation, which hold devices.
	Claims []*resourceapi.ResourceClaim
	// Pods are the cluster's pods: those bound to nodes are the potential
	// victims; a claim reserved only for pods not here is being freed (its
	// pods are gone, the resourceclaim controller deallocates it).
	Pods []*v1.Pod
	// Nodes, where given, filter the candidate nodes by the preemptor's
	// nodeSelector, required node affinity and taints, and drop cordoned
	// nodes. A node with Facet slices missing here is not a candidate; nil
	// skips the filter.
	Nodes []*v1.Node
	// Features are the allocator's (fit.FeaturesOf of the cluster's gates).
	Features structured.Features
	// Protected are pods that must not be chosen, by UID: their eviction
	// was refused (a PodDisruptionBudget), so the decision looks elsewhere.
	Protected map[types.UID]bool
	// Protection spares pods by what they are, whatever their priority.
	Protection Protection
}

// Protection is the pods an operator never wants evicted for a GPU, though
// the scheduler's rules alone would make them victims.
type Protection struct {
	// Namespaces whose pods are never victims besides kube-system, which
	// always is: where Facet itself runs, and --protected-namespaces.
	Namespaces map[string]bool
}

// Why says why p must not be a victim, or "" where it may be.
func (pr Protection) Why(p *v1.Pod) string {
	if p.Namespace == metav1.NamespaceSystem {
		// The cluster's own machinery: losing it costs more than any
		// GPU pod gains, and an operator who put a device holder there
		// meant it to stay.
		return "in namespace " + metav1.NamespaceSystem
	}
	if pr.Namespaces[p.Namespace] {
		return "in protected namespace " + p.Namespace
	}
	if _, ok := p.Annotations[v1.MirrorPodAnnotationKey]; ok {
		// Evicting a mirror pod deletes the API object only: the kubelet
		// keeps the static pod running and its devices held.
		return "a static pod"
	}
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "DaemonSet" {
		// Its controller puts it back on the same node at once, asking
		// for its devices again: nothing is freed for long (kubectl drain
		// skips these for the same reason). The kind alone, as drain
		// checks it, so that look-alikes (OpenKruise's) are spared too.
		return "owned by DaemonSet " + ref.Name
	}
	return ""
}

// Outcome is what Decide concluded.
type Outcome string

const (
	// Ineligible: the pod is not one to preempt for (Why says which rule).
	Ineligible Outcome = "Ineligible"
	// Fits: the claims fit on Node as the cluster is: nothing to evict.
	Fits Outcome = "Fits"
	// Wait: the claims fit on Node once pods already terminating there
	// are gone: nothing more to evict.
	Wait Outcome = "Wait"
	// NoCandidate: no node where evicting lower-priority pods makes room.
	NoCandidate Outcome = "NoCandidate"
	// Preempt: evict Victims, and the claims fit on Node.
	Preempt Outcome = "Preempt"
)

// Decision is Decide's answer.
type Decision struct {
	Outcome Outcome
	Node    string
	// Victims are the pods to evict, the least important first.
	Victims []*v1.Pod
	// Devices are the allocation the allocator found on Node once the
	// victims are gone: "request: device".
	Devices []string
	// Why says in words why, for a log line and an Event.
	Why string
}

// Priority is a pod's spec.priority, which the Priority admission plugin
// sets from its PriorityClass (0 without one).
func Priority(p *v1.Pod) int32 {
	if p.Spec.Priority != nil {
		return *p.Spec.Priority
	}
	return 0
}

// startTime is the scheduler's GetPodStartTime, with the creation time for
// a pod the kubelet has not started (deterministic, unlike its time.Now).
func startTime(p *v1.Pod) time.Time {
	if p.Status.StartTime != nil {
		return p.Status.StartTime.Time
	}
	return p.CreationTimestamp.Time
}

// moreImportant is the scheduler's MoreImportantPod: higher priority, then
// the earlier start.
func moreImportant(a, b *v1.Pod) bool {
	if pa, pb := Priority(a), Priority(b); pa != pb {
		return pa > pb
	}
	return startTime(a).Before(startTime(b))
}

// PodClaims are the claims pod names, from its status (claims made from
// templates) or its spec (claims named directly). missing lists the pod's
// claim entries whose claims are not there yet.
func PodClaims(pod *v1.Pod, claims []*resourceapi.ResourceClaim) (out []*resourceapi.ResourceClaim, missing []string) {
	byName := map[string]*resourceapi.ResourceClaim{}
	for _, c := range claims {
		if c.Namespace == pod.Namespace {
			byName[c.Name] = c
		}
	}
	generated := map[string]*string{}
	for _, s := range pod.Status.ResourceClaimStatuses {
		generated[s.Name] = s.ResourceClaimName
	}
	for _, pc := range pod.Spec.ResourceClaims {
		name := pc.ResourceClaimName
		if name == nil {
			name = generated[pc.Name]
		}
		var c *resourceapi.ResourceClaim
		if name != nil {
			c = byName[*name]
		}
		if c == nil {
			missing = append(missing, pc.Name)
			continue
		}
		out = append(out, c)
	}
	return out, missing
}

// Decide says whether and whom to preempt for pod, which the scheduler
// found unschedulable: the caller has checked its PodScheduled condition.
// An error is the allocator's (a claim it cannot parse): nothing is to be
// evicted then.
func Decide(ctx context.Context, s Snapshot, pod *v1.Pod) (Decision, error) {
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == v1.PreemptNever {
		return Decision{Outcome: Ineligible, Why: "its preemptionPolicy is Never"}, nil
	}
	if pod.Spec.NodeName != "" {
		return Decision{Outcome: Ineligible, Why: "it is bound to node " + pod.Spec.NodeName}, nil
	}
	if pod.DeletionTimestamp != nil {
		return Decision{Outcome: Ineligible, Why: "it is being deleted"}, nil
	}
	claims, missing := PodClaims(pod, s.Claims)
	if len(missing) > 0 {
		return Decision{Outcome: Ineligible, Why: fmt.Sprintf("its claim(s) %s do not exist yet", strings.Join(missing, ", "))}, nil
	}
	if len(claims) == 0 {
		return Decision{Outcome: Ineligible, Why: "it has no ResourceClaims"}, nil
	}
	for _, c := range claims {
		if c.Status.Allocation != nil {
			// An allocated claim pins its node; preempting for the others
			// is the scheduler's business on that node alone, left out.
			return Decision{Outcome: Ineligible, Why: fmt.Sprintf("its claim %s/%s is already allocated", c.Namespace, c.Name)}, nil
		}
	}

	d := newDecider(s, claims)
	nodes := d.nodes(pod)
	if len(nodes) == 0 {
		return Decision{Outcome: NoCandidate, Why: "no node with " + names.Driver + " devices admits it (node selector, affinity, taints, cordon)"}, nil
	}
	// Never preempt for a pod that fits somewhere as things are, nor where
	// pods already terminating will free enough.
	terminating := map[types.UID]bool{}
	for _, p := range s.Pods {
		if p.DeletionTimestamp != nil {
			terminating[p.UID] = true
		}
	}
	// fitsOn decides outcome on the first node where the claims fit with
	// the pods of gone gone; done is false where they fit on none.
	fitsOn := func(gone map[types.UID]bool, outcome Outcome, why string) (dec Decision, done bool, err error) {
		for _, n := range nodes {
			devs, err := d.fits(ctx, n, gone)
			if err != nil {
				return Decision{}, true, err
			}
			if devs != nil {
				return Decision{Outcome: outcome, Node: n, Devices: devs, Why: "its claims fit on node " + n + why}, true, nil
			}
		}
		return Decision{}, false, nil
	}
	if dec, done, err := fitsOn(nil, Fits, " without preemption"); done {
		return dec, err
	}
	if len(terminating) > 0 {
		if dec, done, err := fitsOn(terminating, Wait, " once the pods terminating there are gone"); done {
			return dec, err
		}
	}

	prio := Priority(pod)
	var cands []candidate
	for _, n := range nodes {
		c, err := d.victimsOn(ctx, n, prio, terminating)
		if err != nil {
			return Decision{}, err
		}
		if c != nil {
			cands = append(cands, *c)
		}
	}
	if len(cands) == 0 {
		why := fmt.Sprintf("evicting every pod of lower priority than %d that holds %s devices would not make room on any of %d node(s)", prio, names.Driver, len(nodes))
		if len(s.Protected) > 0 {
			why += fmt.Sprintf(" (%d pod(s) left out: their eviction was refused)", len(s.Protected))
		}
		if len(d.spared) > 0 {
			spared, err := d.protectedBlock(ctx, nodes, prio, terminating)
			if err != nil {
				return Decision{}, err
			}
			if spared != "" {
				// The operator's protection, not the cluster's shape, is
				// why: say so, so that it is not mistaken for a bug.
				why = fmt.Sprintf("the only pods of lower priority than %d whose eviction would make room are protected: %s", prio, spared)
			}
		}
		return Decision{Outcome: NoCandidate, Why: why}, nil
	}
	best := pick(cands)
	var vs []string
	for _, v := range best.victims {
		vs = append(vs, fmt.Sprintf("%s/%s (priority %d)", v.Namespace, v.Name, Priority(v)))
	}
	return Decision{
		Outcome: Preempt, Node: best.node, Victims: best.victims, Devices: best.devices,
		Why: fmt.Sprintf("its claims fit on node %s once %s are evicted", best.node, strings.Join(vs, ", ")),
	}, nil
}

type candidate struct {
	node    string
	victims []*v1.Pod
	devices []string
}

type decider struct {
	s     Snapshot
	fresh []*resourceapi.ResourceClaim
	pool  map[string]bool                            // nodes with Facet slices
	holds map[types.UID][]*resourceapi.ResourceClaim // pod -> allocated claims it reserves
	known map[types.UID]bool                         // pods that exist
	// spared are the pods that would have been potential victims but for
	// the Protection, and why.
	spared map[types.UID]string
	// unprotected: the Protection is ignored (to tell whether it is what
	// stands in the way).
	unprotected bool
}

func newDecider(s Snapshot, claims []*resourceapi.ResourceClaim) *decider {
	d := &decider{s: s, pool: map[string]bool{}, holds: map[types.UID][]*resourceapi.ResourceClaim{}, known: map[types.UID]bool{}, spared: map[types.UID]string{}}
	for _, p := range s.Pods {
		d.known[p.UID] = true
	}
	// The claims are asked about as if new, as in fit.Check.
	for _, c := range claims {
		f := c.DeepCopy()
		f.Status = resourceapi.ResourceClaimStatus{}
		d.fresh = append(d.fresh, f)
	}
	for _, sl := range s.Slices {
		if sl.Spec.Driver == names.Driver && sl.Spec.NodeName != nil {
			d.pool[*sl.Spec.NodeName] = true
		}
	}
	for _, c := range s.Claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.ReservedFor {
			if r.Resource == "pods" && r.APIGroup == "" {
				d.holds[r.UID] = append(d.holds[r.UID], c)
			}
		}
	}
	return d
}

// nodes are the nodes with Facet devices that admit pod, sorted.
func (d *decider) nodes(pod *v1.Pod) []string {
	if d.s.Nodes == nil {
		return slices.Sorted(maps.Keys(d.pool))
	}
	var out []string
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	for _, n := range d.s.Nodes {
		if !d.pool[n.Name] || n.Spec.Unschedulable {
			continue
		}
		if ok, err := affinity.Match(n); err != nil || !ok {
			continue
		}
		if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), n.Spec.Taints, pod.Spec.Tolerations, func(t *v1.Taint) bool {
			return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
		}, false); untolerated {
			continue
		}
		out = append(out, n.Name)
	}
	sort.Strings(out)
	return out
}

// fits runs the allocator for the preemptor's claims on node with the
// claims that only the gone pods reserve deallocated. It returns the
// devices, or nil where they do not fit.
func (d *decider) fits(ctx context.Context, node string, gone map[types.UID]bool) ([]string, error) {
	cluster := fit.NewCluster(d.s.Slices, d.s.Classes)
	f := d.s.Features
	cluster.Features = &f
	for _, c := range d.s.Claims {
		if c.Status.Allocation == nil || d.freed(c, gone) {
			continue
		}
		cluster.Record(c.Status.Allocation)
	}
	results, err := cluster.Try(ctx, node, d.fresh...)
	if err != nil {
		var cs []string
		for _, c := range d.fresh {
			cs = append(cs, c.Namespace+"/"+c.Name)
		}
		return nil, fmt.Errorf("the allocator for claim(s) %s on node %s: %w", strings.Join(cs, ", "), node, err)
	}
	if results == nil {
		return nil, nil
	}
	var devs []string
	for i, res := range results {
		for _, r := range res.Devices.Results {
			devs = append(devs, fmt.Sprintf("%s/%s %s: %s", d.fresh[i].Namespace, d.fresh[i].Name, r.Request, r.Device))
		}
	}
	return devs, nil
}

// freed reports whether the claim is deallocated once the gone pods are:
// when every consumer it is reserved for is one of them or no longer
// exists. A claim reserved for nobody stays held (whether the resourceclaim
// controller frees it is not an eviction's doing).
func (d *decider) freed(c *resourceapi.ResourceClaim, gone map[types.UID]bool) bool {
	if len(c.Status.ReservedFor) == 0 {
		return false
	}
	for _, r := range c.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" || (d.known[r.UID] && !gone[r.UID]) {
			return false
		}
	}
	return true
}

// holdsOn reports whether the pod reserves an allocated claim with a Facet
// device of node's pool: evicting it can free something there.
func (d *decider) holdsOn(p *v1.Pod, node string) bool {
	for _, c := range d.holds[p.UID] {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == names.Driver && r.Pool == node {
				return true
			}
		}
	}
	return false
}

// victimsOn is the scheduler's SelectVictimsOnNode with the allocator as
// the filter: nil where evicting every lower-priority pod does not make
// room.
func (d *decider) victimsOn(ctx context.Context, node string, prio int32, terminating map[types.UID]bool) (*candidate, error) {
	var potential []*v1.Pod
	for _, p := range d.s.Pods {
		if p.Spec.NodeName != node || p.DeletionTimestamp != nil || Priority(p) >= prio || d.s.Protected[p.UID] ||
			p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed || !d.holdsOn(p, node) {
			continue
		}
		if !d.unprotected {
			if why := d.s.Protection.Why(p); why != "" {
				d.spared[p.UID] = why
				continue
			}
		}
		potential = append(potential, p)
	}
	if len(potential) == 0 {
		return nil, nil
	}
	sort.SliceStable(potential, func(i, j int) bool { return moreImportant(potential[i], potential[j]) })
	gone := map[types.UID]bool{}
	for uid := range terminating {
		gone[uid] = true
	}
	for _, p := range potential {
		gone[p.UID] = true
	}
	devs, err := d.fits(ctx, node, gone)
	if err != nil || devs == nil {
		return nil, err
	}
	var victims []*v1.Pod
	for _, p := range potential {
		delete(gone, p.UID)
		again, err := d.fits(ctx, node, gone)
		if err != nil {
			return nil, err
		}
		if again != nil {
			devs = again // reprieved
			continue
		}
		gone[p.UID] = true
		victims = append(victims, p)
	}
	// The least important first, the order evictions go in.
	sort.SliceStable(victims, func(i, j int) bool { return moreImportant(victims[j], victims[i]) })
	return &candidate{node: node, victims: victims, devices: devs}, nil
}

// protectedBlock tells whether the Protection alone stands in the way:
// where evicting protected pods too would make room on some node, it names
// those of the best such node's victims, else "".
func (d *decider) protectedBlock(ctx context.Context, nodes []string, prio int32, terminating map[types.UID]bool) (string, error) {
	d.unprotected = true
	defer func() { d.unprotected = false }()
	var cands []candidate
	for _, n := range nodes {
		c, err := d.victimsOn(ctx, n, prio, terminating)
		if err != nil {
			return "", err
		}
		if c != nil {
			cands = append(cands, *c)
		}
	}
	if len(cands) == 0 {
		return "", nil
	}
	out := []string{}
	for _, v := range pick(cands).victims {
		if why, ok := d.spared[v.UID]; ok {
			out = append(out, fmt.Sprintf("%s/%s (%s)", v.Namespace, v.Name, why))
		}
	}
	return strings.Join(out, ", "), nil
}

// pick is the scheduler's pickOneNodeForPreemption, without its first rule
// (fewest PodDisruptionBudget violations), which the controller replaces
// by dry-run evictions.
func pick(cands []candidate) candidate {
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if ha, hb := highest(a.victims), highest(b.victims); ha != hb {
			return ha < hb
		}
		if sa, sb := sum(a.victims), sum(b.victims); sa != sb {
			return sa < sb
		}
		if len(a.victims) != len(b.victims) {
			return len(a.victims) < len(b.victims)
		}
		if ta, tb := earliestOfHighest(a.victims), earliestOfHighest(b.victims); !ta.Equal(tb) {
			return ta.After(tb)
		}
		return a.node < b.node
	})
	return cands[0]
}

func highest(vs []*v1.Pod) int32 {
	h := int32(math.MinInt32)
	for _, v := range vs {
		h = max(h, Priority(v))
	}
	return h
}

// sum adds the priorities shifted to be positive, as the scheduler does,
// so that more victims of negative priority do not look cheaper.
func sum(vs []*v1.Pod) int64 {
	var s int64
	for _, v := range vs {
		s += int64(Priority(v)) + int64(math.MaxInt32) + 1
	}
	return s
}

// earliestOfHighest is the earliest start among the victims of the highest
// priority.
func earliestOfHighest(vs []*v1.Pod) time.Time {
	h := highest(vs)
	var t time.Time
	for _, v := range vs {
		if Priority(v) == h && (t.IsZero() || startTime(v).Before(t)) {
			t = startTime(v)
		}
	}
	return t
}

// maxUnfitLines bounds Unfit's answer, so that its Event stays readable
// (and within an Event message's 1 KiB); facetctl fit gives all of it.
const maxUnfitLines = 6

// Unfit says why pod's claims fit on none of the nodes that admit it, in
// fit.Check's words ("node n1: ml/big-x request gpu: none of the 8
// matching device(s) is free", then one line per GPU), at most
// maxUnfitLines lines. It is nil where they fit on some node as things
// are (the scheduler places the pod), or where there is nothing to
// explain: a claim not created yet, or one already allocated. An error is
// the allocator's.
func Unfit(ctx context.Context, s Snapshot, pod *v1.Pod) ([]string, error) {
	claims, missing := PodClaims(pod, s.Claims)
	if len(missing) > 0 || len(claims) == 0 {
		return nil, nil
	}
	for _, c := range claims {
		if c.Status.Allocation != nil {
			return nil, nil
		}
	}
	nodes := newDecider(s, claims).nodes(pod)
	if len(nodes) == 0 {
		return []string{"no node with " + names.Driver + " devices admits the pod (node selector, affinity, taints, cordon)"}, nil
	}
	admitted := map[string]bool{}
	for _, n := range nodes {
		admitted[n] = true
	}
	results, err := fit.Check(ctx, fit.Input{Slices: s.Slices, Classes: s.Classes, Claims: s.Claims, Features: s.Features}, "", claims)
	if err != nil {
		return nil, err
	}
	var out []string
	more := 0
	for _, r := range results {
		if !admitted[r.Node] {
			continue
		}
		if r.Fits {
			return nil, nil
		}
		for i, why := range r.Why {
			line := strings.TrimSpace(why)
			if i == 0 {
				line = "node " + r.Node + ": " + line
			}
			if len(out) == maxUnfitLines {
				more++
				continue
			}
			out = append(out, line)
		}
	}
	if more > 0 {
		out = append(out, fmt.Sprintf("and %d more line(s): kubectl get pod -n %s %s -o yaml | facetctl fit -f - for all", more, pod.Namespace, pod.Name))
	}
	return out, nil
}
