// Package controller is facet-preemptor's loop: it watches pods the
// kube-scheduler could not place because their ResourceClaims cannot be
// allocated, asks pkg/cluster/preempt whom to evict, and evicts them through the
// Eviction API (policy/v1), so that PodDisruptionBudgets and graceful
// termination hold. One preemption is in flight per preemptor, and one per
// node: it waits until the victims are gone and the preemptor is scheduled,
// or backs off when the freed devices went to another pod first or the
// wait times out.
package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/pkg/cluster/preempt"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// Event reasons, on the preemptor and on the victims.
const (
	// ReasonPreempting: on the preemptor, naming the victims and the node.
	ReasonPreempting = "FacetPreempting"
	// ReasonPreempted: on each victim, naming the preemptor.
	ReasonPreempted = "FacetPreempted"
	// ReasonNotPreempting: on the preemptor, why nothing is evicted for it
	// (equal or higher priority only, preemptionPolicy Never, ...). Given
	// once per reason.
	ReasonNotPreempting = "FacetNotPreempting"
	// ReasonBlocked: on the preemptor, when evictions were refused (a
	// PodDisruptionBudget, an admission policy) and no other victims make
	// room.
	ReasonBlocked = "FacetPreemptionBlocked"
	// ReasonLost: on the preemptor, when the devices its victims freed
	// were allocated to another pod first; it backs off and tries again.
	ReasonLost = "FacetPreemptionLost"
	// ReasonTimedOut: on the preemptor, when the victims did not go, or it
	// was not scheduled, within the timeout.
	ReasonTimedOut = "FacetPreemptionTimedOut"
	// ReasonWaiting: on the preemptor, when its preemption is decided but
	// held back (the eviction budget is spent, or its node has another
	// preemption in flight). Given once per reason.
	ReasonWaiting = "FacetPreemptionWaiting"
	// ReasonUnallocatable: on a pod the scheduler found unschedulable for
	// its claims, why they fit on no node, in facetctl fit's words (also
	// with --observe-only). Given once per distinct explanation.
	ReasonUnallocatable = "FacetUnallocatable"
)

// EvictionLabel is set, with the value EvictionLabelValue, on every
// Eviction the preemptor creates. The chart's ValidatingAdmissionPolicy
// binding that checks the evicted pod itself (its DaemonSet owner, its
// mirror annotation) selects evictions by it, so that other evictions
// (kubectl drain, the cluster autoscaler) cost the API server nothing; a
// second policy refuses the preemptor's evictions that lack it
// (deployments/helm/facet/templates/preemptor-policies.yaml).
const (
	EvictionLabel      = "gpu.facet.dev/evicted-by"
	EvictionLabelValue = "facet-preemptor"
)

// unschedulableClaims is the kube-scheduler's DRA plugin's message for a
// node where the pod's claims cannot be allocated (k8s.io/kubernetes
// pkg/scheduler/framework/plugins/dynamicresources, 1.35 to 1.37). A pod
// unschedulable only for other reasons (CPU, affinity) is left alone:
// evicting device holders would not help it.
const unschedulableClaims = "cannot allocate all claims"

// Options configure the controller.
type Options struct {
	// OnSynced, when set, is called once the informers have synced.
	OnSynced func()
	Client   kubernetes.Interface
	Recorder record.EventRecorder
	Metrics  *Metrics
	// Features are the allocator's: the kube-scheduler's DRA features.
	Features structured.Features
	// Protection spares pods from eviction whatever their priority.
	Protection preempt.Protection
	// Timeout bounds one preemption: from the evictions until the
	// preemptor is scheduled.
	Timeout time.Duration
	// Backoff is the first wait after a preemption that did not end with
	// the preemptor scheduled; it doubles up to MaxBackoff.
	Backoff, MaxBackoff time.Duration
	// Resync is how often every pending pod is looked at again, whatever
	// changed.
	Resync time.Duration
	// MaxEvictionsPerMinute caps the evictions of the whole preemptor
	// (budget); 0: no cap.
	MaxEvictionsPerMinute int
	// ObserveOnly: decide, dry-run and raise the Events ("would evict"),
	// but evict nothing and nominate nothing.
	ObserveOnly bool
}

// attempt is a preemption in flight.
type attempt struct {
	key     string // the preemptor's namespace/name
	node    string
	victims map[types.UID]string // UID -> namespace/name
	started time.Time
}

type backoff struct {
	until time.Time
	next  time.Duration
}

// Controller is the preemption loop. Run it once.
type Controller struct {
	opts    Options
	queue   workqueue.TypedRateLimitingInterface[string]
	pods    corelisters.PodLister
	nodes   corelisters.NodeLister
	claims  resourcelisters.ResourceClaimLister
	slices  resourcelisters.ResourceSliceLister
	classes resourcelisters.DeviceClassLister
	synced  []cache.InformerSynced
	factory informers.SharedInformerFactory
	budget  *budget

	mu       sync.Mutex
	attempts map[types.UID]*attempt
	// waiting are the preemptors (keys) held back by a preemption in
	// flight on a node, to look at again as soon as it ends.
	waiting  map[string]map[string]bool
	backoffs map[types.UID]*backoff
	told     map[types.UID]string
	// toldUnfit is the last ReasonUnallocatable message per pod, kept
	// apart from told so that the two Events do not undo each other's
	// deduplication.
	toldUnfit map[types.UID]string
	// unfit are what the requests of each pod ask for, of the pods whose
	// claims fit on no node as last looked at (explainUnfit explained
	// them): facet_preemptor_unallocatable_requests counts them. Cleared
	// with toldUnfit, and as soon as the pod fits, needs a preemption, is
	// bound or goes.
	unfit map[types.UID][]RequestKind
	// nominated are the nominatedNodeNames this preemptor set.
	nominated map[types.UID]string
	// observed is, in observe-only mode, the last decision raised for a
	// pod (signature), which is not raised again while it stands.
	observed map[types.UID]string
	now      func() time.Time
}

// New sets up the informers; Run starts them.
func New(opts Options) *Controller {
	f := informers.NewSharedInformerFactory(opts.Client, 0)
	c := &Controller{
		opts:      opts,
		queue:     workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](), workqueue.TypedRateLimitingQueueConfig[string]{Name: "facet-preemptor"}),
		factory:   f,
		budget:    newBudget(opts.MaxEvictionsPerMinute),
		attempts:  map[types.UID]*attempt{},
		waiting:   map[string]map[string]bool{},
		backoffs:  map[types.UID]*backoff{},
		told:      map[types.UID]string{},
		toldUnfit: map[types.UID]string{},
		unfit:     map[types.UID][]RequestKind{},
		nominated: map[types.UID]string{},
		observed:  map[types.UID]string{},
		now:       time.Now,
	}
	pods := f.Core().V1().Pods()
	c.pods = pods.Lister()
	c.nodes = f.Core().V1().Nodes().Lister()
	c.claims = f.Resource().V1().ResourceClaims().Lister()
	c.slices = f.Resource().V1().ResourceSlices().Lister()
	c.classes = f.Resource().V1().DeviceClasses().Lister()
	c.synced = []cache.InformerSynced{
		pods.Informer().HasSynced,
		f.Core().V1().Nodes().Informer().HasSynced,
		f.Resource().V1().ResourceClaims().Informer().HasSynced,
		f.Resource().V1().ResourceSlices().Informer().HasSynced,
		f.Resource().V1().DeviceClasses().Informer().HasSynced,
	}
	_, _ = pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.podChanged(o) },
		UpdateFunc: func(_, o any) { c.podChanged(o) },
		DeleteFunc: func(o any) {
			c.podDeleted(o)
			c.kickInFlight()
		},
	})
	_, _ = f.Resource().V1().ResourceClaims().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, _ any) { c.kickInFlight() },
		DeleteFunc: func(any) { c.kickInFlight() },
	})
	return c
}

func key(p *v1.Pod) string { return p.Namespace + "/" + p.Name }

func (c *Controller) podChanged(o any) {
	p, ok := o.(*v1.Pod)
	if !ok {
		return
	}
	c.mu.Lock()
	_, inFlight := c.attempts[p.UID]
	// A counted pod is looked at whatever changed: bound, or no longer
	// unschedulable for its claims, it leaves the count.
	_, counted := c.unfit[p.UID]
	c.mu.Unlock()
	if inFlight || counted || Unschedulable(p) {
		c.queue.Add(key(p))
	}
}

// podDeleted drops a deleted pod's state at once: its key may already
// name a new pod (a namesake), whose sync would not find it gone.
func (c *Controller) podDeleted(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if p, ok := o.(*v1.Pod); ok {
		c.forget(p.UID)
	}
}

// kickInFlight looks at every preemption in flight again: a victim or a
// claim went, which may be what it waits for.
func (c *Controller) kickInFlight() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.attempts {
		c.queue.Add(a.key)
	}
}

// Unschedulable reports whether the scheduler gave up on p because its
// claims cannot be allocated: Pending, unbound, with claims, and
// PodScheduled False for reason Unschedulable with the DRA plugin's
// message.
func Unschedulable(p *v1.Pod) bool {
	if p.Spec.NodeName != "" || p.Status.Phase != v1.PodPending || len(p.Spec.ResourceClaims) == 0 || p.DeletionTimestamp != nil {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled {
			return cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable && strings.Contains(cond.Message, unschedulableClaims)
		}
	}
	return false
}

// Run starts the informers and works until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer c.queue.ShutDown()
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("informers did not sync: facet-preemptor needs list and watch on pods, nodes, resourceclaims, resourceslices and deviceclasses")
	}
	if c.opts.OnSynced != nil {
		c.opts.OnSynced()
	}
	logger.Info("Watching for pods whose ResourceClaims cannot be allocated", "driver", names.Driver)
	// The next controller (a new term, or the scheduler's preemption off
	// again) counts afresh.
	defer c.opts.Metrics.setUnallocatable(nil)
	go c.resync(ctx)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for c.next(ctx) {
	}
	return nil
}

// resync queues every pending pod the scheduler gave up on, every
// preemption in flight, and every pod counted as unallocatable, each
// Resync: a decision depends on the whole cluster, not only on the pod's
// own changes.
func (c *Controller) resync(ctx context.Context) {
	_ = wait.PollUntilContextCancel(ctx, c.opts.Resync, false, func(context.Context) (bool, error) {
		pods, err := c.pods.List(labels.Everything())
		if err != nil {
			return false, nil
		}
		c.mu.Lock()
		for _, p := range pods {
			_, inFlight := c.attempts[p.UID]
			_, counted := c.unfit[p.UID]
			if inFlight || counted || Unschedulable(p) {
				c.queue.Add(key(p))
			}
		}
		c.mu.Unlock()
		return false, nil
	})
}

func (c *Controller) next(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	after, err := c.sync(ctx, k)
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Preemption check failed; retrying", "pod", k)
		c.queue.AddRateLimited(k)
	case after > 0:
		c.queue.Forget(k)
		c.queue.AddAfter(k, after)
	default:
		c.queue.Forget(k)
	}
	return true
}

// poll is how often a preemption in flight is looked at besides the
// events that wake it.
const poll = time.Second

// sync handles one pod; it returns when to look at it again (0: on its
// next change).
func (c *Controller) sync(ctx context.Context, k string) (time.Duration, error) {
	logger := klog.FromContext(ctx)
	ns, name, _ := strings.Cut(k, "/")
	pod, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.forgetGone()
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	a := c.attempts[pod.UID]
	b := c.backoffs[pod.UID]
	c.mu.Unlock()

	if pod.Spec.NodeName != "" {
		if a != nil {
			logger.Info("Preemptor scheduled", "pod", klog.KObj(pod), "node", pod.Spec.NodeName, "sinceEviction", c.now().Sub(a.started).Round(time.Millisecond))
			c.opts.Metrics.outcome(OutcomeScheduled)
		}
		c.forget(pod.UID)
		return 0, nil
	}
	if a != nil {
		return c.progress(ctx, pod, a)
	}
	if b != nil && c.now().Before(b.until) {
		return b.until.Sub(c.now()), nil
	}
	if !Unschedulable(pod) {
		c.dropUnfit(pod.UID)
		return 0, nil
	}
	snap, err := c.snapshot()
	if err != nil {
		return 0, err
	}
	d, err := preempt.Decide(ctx, snap, pod)
	if err != nil {
		return 0, fmt.Errorf("deciding for pod %s: %w", k, err)
	}
	logger.V(2).Info("Preemption decision", "pod", klog.KObj(pod), "outcome", d.Outcome, "node", d.Node, "why", d.Why)
	if d.Outcome == preempt.Ineligible || d.Outcome == preempt.NoCandidate {
		c.explainUnfit(ctx, snap, pod)
	} else {
		// It fits somewhere, now or once victims go.
		c.dropUnfit(pod.UID)
	}
	switch d.Outcome {
	case preempt.Ineligible, preempt.NoCandidate:
		c.tell(pod, v1.EventTypeNormal, ReasonNotPreempting, "facet-preemptor evicts nothing for this pod: "+d.Why)
		return 0, nil
	case preempt.Fits, preempt.Wait:
		// The scheduler will place it (its queue retries when claims
		// or pods change); look again later in case it does not.
		return c.opts.Resync, nil
	}
	if c.opts.ObserveOnly {
		// Nothing is evicted, so the pod stays pending and the same
		// decision comes back each resync: raise it once.
		c.mu.Lock()
		seen := c.observed[pod.UID] == signature(d)
		c.mu.Unlock()
		if seen {
			return 0, nil
		}
	}
	return c.preempt(ctx, pod, d, snap)
}

// signature identifies a decision: its node and victims.
func signature(d preempt.Decision) string {
	sig := d.Node
	for _, v := range d.Victims {
		sig += " " + string(v.UID)
	}
	return sig
}

// tell raises an Event on pod unless it is the one last raised by tell:
// a pod looked at every resync would otherwise get the same one each time.
func (c *Controller) tell(pod *v1.Pod, eventType, reason, msg string) {
	c.mu.Lock()
	same := c.told[pod.UID] == reason+" "+msg
	c.told[pod.UID] = reason + " " + msg
	c.mu.Unlock()
	if !same {
		c.opts.Recorder.Event(pod, eventType, reason, msg)
	}
}

// explainUnfit raises ReasonUnallocatable on pod with why its claims fit on
// no node (preempt.Unfit), where the user looks first: the scheduler's own
// Event says only that they cannot be allocated. It counts the pod's
// requests in facet_preemptor_unallocatable_requests while they fit
// nowhere.
func (c *Controller) explainUnfit(ctx context.Context, snap preempt.Snapshot, pod *v1.Pod) {
	lines, err := preempt.Unfit(ctx, snap, pod)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Explaining why a pod's claims fit nowhere", "pod", klog.KObj(pod))
		c.dropUnfit(pod.UID)
		return
	}
	if len(lines) == 0 {
		c.dropUnfit(pod.UID)
		return
	}
	kinds, err := requestKinds(ctx, snap, pod)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading what a pod's requests ask for", "pod", klog.KObj(pod))
	}
	msg := "no node can allocate this pod's ResourceClaims now: " + strings.Join(lines, "; ")
	c.mu.Lock()
	same := c.toldUnfit[pod.UID] == msg
	c.toldUnfit[pod.UID] = msg
	c.unfit[pod.UID] = kinds
	c.countUnfit()
	c.mu.Unlock()
	if !same {
		c.opts.Recorder.Event(pod, v1.EventTypeWarning, ReasonUnallocatable, msg)
	}
}

// requestKinds are the DeviceClass and MIG profile of each request of the
// pod's claims (fit.RequestProfiles).
func requestKinds(ctx context.Context, snap preempt.Snapshot, pod *v1.Pod) ([]RequestKind, error) {
	claims, _ := preempt.PodClaims(pod, snap.Claims)
	profiles, err := fit.RequestProfiles(ctx, fit.Input{Slices: snap.Slices, Classes: snap.Classes, Features: snap.Features}, claims)
	if err != nil {
		return nil, err
	}
	kinds := make([]RequestKind, len(profiles))
	for i, p := range profiles {
		kinds[i] = RequestKind{DeviceClass: p.DeviceClass, MIGProfile: p.MIGProfile}
	}
	return kinds, nil
}

// dropUnfit takes the pod out of facet_preemptor_unallocatable_requests.
func (c *Controller) dropUnfit(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.unfit[uid]; ok {
		delete(c.unfit, uid)
		c.countUnfit()
	}
}

// countUnfit sets facet_preemptor_unallocatable_requests from unfit. c.mu
// is held.
func (c *Controller) countUnfit() {
	counts := map[RequestKind]int{}
	for _, kinds := range c.unfit {
		for _, k := range kinds {
			counts[k]++
		}
	}
	c.opts.Metrics.setUnallocatable(counts)
}

// victimNames are "namespace/name (priority p)" of vs.
func victimNames(vs []*v1.Pod) []string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, fmt.Sprintf("%s/%s (priority %d)", v.Namespace, v.Name, preempt.Priority(v)))
	}
	return out
}

// held says whether a decided preemption waits (for the node or the
// budget), and raises the Event that says why; it returns when to look
// again.
func (c *Controller) held(ctx context.Context, pod *v1.Pod, d preempt.Decision) (bool, time.Duration) {
	if other := c.busy(pod, d.Node); other != "" {
		// Two preemptions on one node cannot tell whose victims freed
		// what: the second would count the first's terminating victims
		// as its own room, or evict more than either needs.
		c.tell(pod, v1.EventTypeNormal, ReasonWaiting, fmt.Sprintf(
			"facet-preemptor waits: node %s, where this pod's claims would fit, has a preemption in flight for pod %s; it decides again once that one ends",
			d.Node, other))
		klog.FromContext(ctx).V(2).Info("Waiting for the preemption in flight on the node", "pod", klog.KObj(pod), "node", d.Node, "inFlightFor", other)
		c.opts.Metrics.wait(WaitNodeBusy)
		return true, c.opts.Resync
	}
	return c.overBudget(ctx, pod, d)
}

// busy names the preemptor of another preemption in flight on node, or ""
// where there is none; if there is, pod is looked at again when it ends.
func (c *Controller) busy(pod *v1.Pod, node string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, a := range c.attempts {
		if uid != pod.UID && a.node == node {
			if c.waiting[node] == nil {
				c.waiting[node] = map[string]bool{}
			}
			c.waiting[node][key(pod)] = true
			return a.key
		}
	}
	return ""
}

// overBudget says whether the victims wait for the eviction budget, and
// raises the Event that says why; it returns when to look again (0: never
// by itself, the preemption is more than the cap allows at once).
func (c *Controller) overBudget(ctx context.Context, pod *v1.Pod, d preempt.Decision) (bool, time.Duration) {
	n := len(d.Victims)
	if !c.budget.fits(n) {
		c.tell(pod, v1.EventTypeWarning, ReasonNotPreempting, fmt.Sprintf(
			"facet-preemptor evicts nothing for this pod: it needs %d evictions on node %s (%s), more than --max-evictions-per-minute=%d allows at once",
			n, d.Node, strings.Join(victimNames(d.Victims), ", "), c.budget.perMinute))
		return true, 0
	}
	wait := c.budget.wait(c.now(), n)
	if wait == 0 {
		return false, 0
	}
	// No time in the Event: it would make every look a new one.
	c.tell(pod, v1.EventTypeNormal, ReasonWaiting, fmt.Sprintf(
		"facet-preemptor waits to evict %s on node %s: the preemptor's eviction budget (--max-evictions-per-minute=%d) has fewer than %d left",
		strings.Join(victimNames(d.Victims), ", "), d.Node, c.budget.perMinute, n))
	klog.FromContext(ctx).V(2).Info("Waiting for the eviction budget", "pod", klog.KObj(pod), "node", d.Node, "victims", n, "retryIn", wait)
	c.opts.Metrics.wait(WaitBudget)
	return true, wait
}

func (c *Controller) snapshot() (preempt.Snapshot, error) {
	s := preempt.Snapshot{Features: c.opts.Features, Protected: map[types.UID]bool{}, Protection: c.opts.Protection}
	sl, err := c.slices.List(labels.Everything())
	if err != nil {
		return s, err
	}
	for _, x := range sl {
		if x.Spec.Driver == names.Driver {
			s.Slices = append(s.Slices, x)
		}
	}
	if s.Classes, err = c.classes.List(labels.Everything()); err != nil {
		return s, err
	}
	if s.Claims, err = c.claims.List(labels.Everything()); err != nil {
		return s, err
	}
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		return s, err
	}
	s.Pods = pods
	if s.Nodes, err = c.nodes.List(labels.Everything()); err != nil {
		return s, err
	}
	if s.Nodes == nil {
		s.Nodes = []*v1.Node{}
	}
	return s, nil
}

// preempt evicts the decision's victims. Each eviction is first tried as
// a dry run, so that one a PodDisruptionBudget refuses leads to other
// victims (or none) before anything is evicted.
func (c *Controller) preempt(ctx context.Context, pod *v1.Pod, d preempt.Decision, snap preempt.Snapshot) (time.Duration, error) {
	logger := klog.FromContext(ctx)
	first := d
	// Before the dry runs as well as after: no API calls for a
	// preemption that cannot go yet.
	if held, after := c.held(ctx, pod, d); held {
		return after, nil
	}
	var refusals []string
	for {
		refused, msg, err := c.dryRun(ctx, d.Victims)
		if err != nil {
			return 0, err
		}
		if refused == nil {
			break
		}
		refusals = append(refusals, fmt.Sprintf("%s/%s (%s)", refused.Namespace, refused.Name, msg))
		c.opts.Metrics.refused()
		snap.Protected[refused.UID] = true
		if d, err = preempt.Decide(ctx, snap, pod); err != nil {
			return 0, err
		}
		if d.Outcome != preempt.Preempt {
			c.opts.Recorder.Eventf(pod, v1.EventTypeWarning, ReasonBlocked,
				"facet-preemptor evicts nothing for this pod: the eviction of %s was refused, and without them %s", strings.Join(refusals, ", "), d.Why)
			c.opts.Metrics.outcome(OutcomeBlocked)
			return c.setBackoff(pod.UID), nil
		}
	}
	if held, after := c.held(ctx, pod, d); held {
		return after, nil
	}
	if !c.budget.take(c.now(), len(d.Victims)) {
		// overBudget said they were there: only a clock gone backwards.
		return poll, nil
	}
	if c.opts.ObserveOnly {
		c.observe(ctx, pod, d, first)
		return 0, nil
	}
	a := &attempt{key: key(pod), node: d.Node, victims: map[types.UID]string{}, started: c.now()}
	var evicted []string
	for _, v := range d.Victims {
		err := c.evict(ctx, v, false)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			// Refused between the dry run and now (or forbidden): stop
			// here; what was evicted is waited for as any attempt.
			c.opts.Recorder.Eventf(pod, v1.EventTypeWarning, ReasonBlocked, "facet-preemptor could not evict pod %s/%s: %v", v.Namespace, v.Name, err)
			logger.Error(err, "Eviction failed", "preemptor", klog.KObj(pod), "victim", klog.KObj(v))
			break
		}
		a.victims[v.UID] = v.Namespace + "/" + v.Name
		evicted = append(evicted, fmt.Sprintf("%s/%s (priority %d)", v.Namespace, v.Name, preempt.Priority(v)))
		c.opts.Recorder.Eventf(v, v1.EventTypeNormal, ReasonPreempted,
			"Preempted by facet-preemptor for pod %s/%s (priority %d) on node %s, whose ResourceClaims need this pod's devices", pod.Namespace, pod.Name, preempt.Priority(pod), d.Node)
		c.opts.Metrics.victim()
	}
	if len(evicted) == 0 {
		return c.setBackoff(pod.UID), nil
	}
	if err := c.nominate(ctx, pod, d.Node); err != nil {
		// The evictions stand: the nomination only shows them and
		// steers the scheduler, it is not what frees the devices.
		logger.Error(err, "Could not nominate the node", "preemptor", klog.KObj(pod), "node", d.Node)
	}
	c.opts.Recorder.Eventf(pod, v1.EventTypeNormal, ReasonPreempting,
		"facet-preemptor evicted %s on node %s so that this pod's ResourceClaims fit (%s)", strings.Join(evicted, ", "), d.Node, strings.Join(d.Devices, ", "))
	c.opts.Metrics.preemption()
	logger.Info("Preempting", "preemptor", klog.KObj(pod), "priority", preempt.Priority(pod), "node", d.Node, "victims", evicted, "devices", d.Devices)
	c.mu.Lock()
	c.attempts[pod.UID] = a
	delete(c.told, pod.UID)
	c.mu.Unlock()
	return poll, nil
}

// observe raises, in observe-only mode, the Events and metrics of the
// preemption d without carrying it out. first is the decision before the
// dry runs, by which the same one is recognised at the next look.
func (c *Controller) observe(ctx context.Context, pod *v1.Pod, d, first preempt.Decision) {
	names := victimNames(d.Victims)
	for _, v := range d.Victims {
		c.opts.Recorder.Eventf(v, v1.EventTypeNormal, ReasonPreempted,
			"facet-preemptor (observe-only) would preempt this pod for pod %s/%s (priority %d) on node %s, whose ResourceClaims need this pod's devices; nothing is evicted",
			pod.Namespace, pod.Name, preempt.Priority(pod), d.Node)
	}
	c.opts.Recorder.Eventf(pod, v1.EventTypeNormal, ReasonPreempting,
		"facet-preemptor (observe-only) would evict %s on node %s so that this pod's ResourceClaims fit (%s); nothing is evicted",
		strings.Join(names, ", "), d.Node, strings.Join(d.Devices, ", "))
	c.opts.Metrics.observed(len(d.Victims))
	klog.FromContext(ctx).Info("Would preempt (observe-only)", "preemptor", klog.KObj(pod), "priority", preempt.Priority(pod), "node", d.Node, "victims", names, "devices", d.Devices)
	c.mu.Lock()
	c.observed[pod.UID] = signature(first)
	delete(c.told, pod.UID)
	c.mu.Unlock()
}

// nominate sets the preemptor's status.nominatedNodeName to node, as the
// scheduler does when it preempts: kubectl shows where the pod is meant to
// go, a preemption that lost stays visible, and the scheduler tries that
// node first. A nomination the scheduler made (for its own preemption of
// other resources) is its to change, and is left alone; nothing is ever
// cleared.
func (c *Controller) nominate(ctx context.Context, pod *v1.Pod, node string) error {
	c.mu.Lock()
	ours := c.nominated[pod.UID]
	c.mu.Unlock()
	if was := pod.Status.NominatedNodeName; was == node || (was != "" && was != ours) {
		return nil
	}
	// The UID makes it a precondition (the API server refuses to change
	// it): never nominate for a namesake.
	patch := fmt.Sprintf(`{"metadata":{"uid":%q},"status":{"nominatedNodeName":%q}}`, pod.UID, node)
	if _, err := c.opts.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patch status.nominatedNodeName=%s of pod %s/%s: %w", node, pod.Namespace, pod.Name, err)
	}
	c.mu.Lock()
	c.nominated[pod.UID] = node
	c.mu.Unlock()
	return nil
}

// dryRun tries the victims' evictions without carrying them out; it
// returns the first that is refused, with the server's message: by a
// PodDisruptionBudget (429), or by an admission policy (403: the chart's
// policies refuse what facet-preemptor must never evict, and one that
// sees a pod as protected where the preemptor's own Protection does not
// is heeded, not fought).
func (c *Controller) dryRun(ctx context.Context, victims []*v1.Pod) (*v1.Pod, string, error) {
	for _, v := range victims {
		err := c.evict(ctx, v, true)
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsTooManyRequests(err), apierrors.IsForbidden(err):
			return v, err.Error(), nil
		default:
			return nil, "", fmt.Errorf("dry-run eviction of pod %s/%s: %w", v.Namespace, v.Name, err)
		}
	}
	return nil, "", nil
}

func (c *Controller) evict(ctx context.Context, v *v1.Pod, dry bool) error {
	ev := &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Namespace: v.Namespace, Name: v.Name, Labels: map[string]string{EvictionLabel: EvictionLabelValue}},
		// The UID precondition: never evict a namesake that replaced
		// the pod decided on.
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &v.UID}},
	}
	if dry {
		ev.DeleteOptions.DryRun = []string{metav1.DryRunAll}
	}
	return c.opts.Client.PolicyV1().Evictions(v.Namespace).Evict(ctx, ev)
}

// progress follows a preemption in flight: until the victims are gone,
// then until the preemptor is scheduled, or the claims no longer fit (the
// devices went to another pod), or the timeout.
func (c *Controller) progress(ctx context.Context, pod *v1.Pod, a *attempt) (time.Duration, error) {
	logger := klog.FromContext(ctx)
	if c.now().Sub(a.started) > c.opts.Timeout {
		var left []string
		for uid, name := range a.victims {
			if c.exists(uid, name) {
				left = append(left, name)
			}
		}
		msg := fmt.Sprintf("the preemption on node %s did not end with this pod scheduled within %s", a.node, c.opts.Timeout)
		if len(left) > 0 {
			msg += fmt.Sprintf(" (still terminating: %s)", strings.Join(left, ", "))
		}
		c.opts.Recorder.Eventf(pod, v1.EventTypeWarning, ReasonTimedOut, "%s; facet-preemptor tries again after a backoff", msg)
		c.opts.Metrics.outcome(OutcomeTimedOut)
		c.clearAttempt(pod.UID)
		return c.setBackoff(pod.UID), nil
	}
	for uid, name := range a.victims {
		if c.exists(uid, name) {
			return poll, nil
		}
	}
	snap, err := c.snapshot()
	if err != nil {
		return 0, err
	}
	d, err := preempt.Decide(ctx, snap, pod)
	if err != nil {
		return 0, err
	}
	switch d.Outcome {
	case preempt.Fits, preempt.Wait, preempt.Ineligible:
		// Fits: the scheduler has yet to retry it. Ineligible: its
		// claims are being allocated, or it is being bound.
		return poll, nil
	}
	c.opts.Recorder.Eventf(pod, v1.EventTypeWarning, ReasonLost,
		"the devices freed on node %s went to other pods before this one was scheduled; facet-preemptor tries again after a backoff", a.node)
	logger.Info("Freed devices went to another pod", "preemptor", klog.KObj(pod), "node", a.node)
	c.opts.Metrics.outcome(OutcomeLost)
	c.clearAttempt(pod.UID)
	return c.setBackoff(pod.UID), nil
}

// exists reports whether the victim (by UID) is still in the cache.
func (c *Controller) exists(uid types.UID, name string) bool {
	ns, n, _ := strings.Cut(name, "/")
	p, err := c.pods.Pods(ns).Get(n)
	return err == nil && p.UID == uid
}

func (c *Controller) setBackoff(uid types.UID) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.backoffs[uid]
	if b == nil {
		b = &backoff{next: c.opts.Backoff}
		c.backoffs[uid] = b
	}
	wait := b.next
	b.until = c.now().Add(wait)
	b.next = min(2*b.next, c.opts.MaxBackoff)
	return wait
}

func (c *Controller) clearAttempt(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endAttempt(uid)
}

// endAttempt drops the preemption in flight for uid, if any, and queues
// the preemptors that waited for its node. c.mu is held.
func (c *Controller) endAttempt(uid types.UID) {
	a := c.attempts[uid]
	if a == nil {
		return
	}
	delete(c.attempts, uid)
	for k := range c.waiting[a.node] {
		c.queue.Add(k)
	}
	delete(c.waiting, a.node)
}

func (c *Controller) forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endAttempt(uid)
	delete(c.backoffs, uid)
	delete(c.told, uid)
	delete(c.toldUnfit, uid)
	if _, ok := c.unfit[uid]; ok {
		delete(c.unfit, uid)
		c.countUnfit()
	}
	delete(c.nominated, uid)
	delete(c.observed, uid)
}

// forgetGone drops the state of pods gone from the cache.
func (c *Controller) forgetGone() {
	c.mu.Lock()
	defer c.mu.Unlock()
	pods, _ := c.pods.List(labels.Everything())
	live := map[types.UID]bool{}
	for _, p := range pods {
		live[p.UID] = true
	}
	for uid := range c.attempts {
		if !live[uid] {
			c.endAttempt(uid)
		}
	}
	dropGone(c.backoffs, live)
	dropGone(c.told, live)
	dropGone(c.toldUnfit, live)
	if dropGone(c.unfit, live) {
		c.countUnfit()
	}
	dropGone(c.nominated, live)
	dropGone(c.observed, live)
}

// dropGone deletes the entries of pods not live from one of the
// controller's per-pod maps, and says whether there were any.
func dropGone[V any](m map[types.UID]V, live map[types.UID]bool) bool {
	gone := false
	for uid := range m {
		if !live[uid] {
			delete(m, uid)
			gone = true
		}
	}
	return gone
}
