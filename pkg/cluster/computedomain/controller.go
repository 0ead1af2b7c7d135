package computedomain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// Options configure the Controller.
type Options struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Recorder raises the Events on ComputeDomains.
	Recorder record.EventRecorder
	// Namespace is Facet's, where the IMEX DaemonSets go.
	Namespace string
	// PodTemplate is the IMEX daemons' pod template (LoadPodTemplate).
	PodTemplate *corev1.PodTemplateSpec
	// Resync is how often every domain is looked at again and DaemonSets
	// and templates of domains that are gone are deleted.
	Resync time.Duration
	// Metrics, when set, are the controller's (NewMetrics).
	Metrics *Metrics
	// OnSynced, when set, is called once the informers have synced.
	OnSynced func()
}

// Indexer names.
const (
	byUID    = "uid"
	byDomain = "domain"
)

// Controller reconciles ComputeDomains. Run it once; one worker, so that
// two domains are never placed at once on the same free channels.
type Controller struct {
	opts      Options
	queue     workqueue.TypedRateLimitingInterface[string]
	domains   cache.SharedIndexInformer
	dynamic   dynamicinformer.DynamicSharedInformerFactory
	factories []informers.SharedInformerFactory
	synced    []cache.InformerSynced

	nodes     corelisters.NodeLister
	pods      corelisters.PodLister
	sets      appslisters.DaemonSetLister
	slices    resourcelisters.ResourceSliceLister
	claims    cache.Indexer
	templates resourcelisters.ResourceClaimTemplateLister

	mu sync.Mutex
	// restarts are the last restart counts seen of each domain's daemons,
	// by domain UID and node, so that a restart raises one Event.
	restarts map[types.UID]map[string]int32
	// told is the last WaitingForPods message per deleted domain.
	told map[types.UID]string
}

// hasLabel selects the objects the controller made for a domain.
func hasLabel(o *metav1.ListOptions) {
	r, _ := labels.NewRequirement(Label, selection.Exists, nil)
	o.LabelSelector = labels.NewSelector().Add(*r).String()
}

// New sets up the informers; Run starts them.
func New(opts Options) *Controller {
	c := &Controller{
		opts: opts,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "facet-controller"}),
		restarts: map[types.UID]map[string]int32{},
		told:     map[types.UID]string{},
	}
	c.dynamic = dynamicinformer.NewDynamicSharedInformerFactory(opts.Dynamic, 0)
	c.domains = c.dynamic.ForResource(occupancy.ComputeDomains).Informer()
	_ = c.domains.AddIndexers(cache.Indexers{byUID: func(o any) ([]string, error) {
		m, err := meta.Accessor(o)
		if err != nil {
			return nil, err
		}
		return []string{string(m.GetUID())}, nil
	}})

	all := informers.NewSharedInformerFactory(opts.Client, 0)
	driverSlices := informers.NewSharedInformerFactoryWithOptions(opts.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, names.Driver).String()
	}))
	own := informers.NewSharedInformerFactoryWithOptions(opts.Client, 0, informers.WithNamespace(opts.Namespace), informers.WithTweakListOptions(hasLabel))
	labelled := informers.NewSharedInformerFactoryWithOptions(opts.Client, 0, informers.WithTweakListOptions(hasLabel))
	c.factories = []informers.SharedInformerFactory{all, driverSlices, own, labelled}

	nodes := all.Core().V1().Nodes()
	claims := all.Resource().V1().ResourceClaims()
	slices := driverSlices.Resource().V1().ResourceSlices()
	pods := own.Core().V1().Pods()
	sets := own.Apps().V1().DaemonSets()
	templates := labelled.Resource().V1().ResourceClaimTemplates()
	_ = claims.Informer().AddIndexers(cache.Indexers{byDomain: func(o any) ([]string, error) {
		if cl, ok := o.(*resourceapi.ResourceClaim); ok {
			if cfg := ChannelConfigOf(cl); cfg != nil {
				return []string{cfg.DomainUID}, nil
			}
		}
		return nil, nil
	}})
	c.nodes, c.pods, c.sets = nodes.Lister(), pods.Lister(), sets.Lister()
	c.slices, c.templates = slices.Lister(), templates.Lister()
	c.claims = claims.Informer().GetIndexer()
	c.synced = []cache.InformerSynced{c.domains.HasSynced, nodes.Informer().HasSynced, claims.Informer().HasSynced,
		slices.Informer().HasSynced, pods.Informer().HasSynced, sets.Informer().HasSynced, templates.Informer().HasSynced}

	_, _ = c.domains.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, o any) { c.enqueue(o) },
		DeleteFunc: c.enqueue,
	})
	// What the controller made, and the daemon pods, name their domain
	// by the label.
	byLabel := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.enqueueLabel(o) },
		UpdateFunc: func(old, o any) { c.enqueueLabel(old); c.enqueueLabel(o) },
		DeleteFunc: func(o any) { c.enqueueLabel(o) },
	}
	_, _ = pods.Informer().AddEventHandler(byLabel)
	_, _ = sets.Informer().AddEventHandler(byLabel)
	_, _ = templates.Informer().AddEventHandler(byLabel)
	// A node's label is the plugin's word that the domain's channel is
	// prepared there; its addresses are the peer list.
	_, _ = nodes.Informer().AddEventHandler(byLabel)
	// A claim of a domain changes whether it can still move clique and
	// whether a deleted one still waits; any allocation changes the
	// free channels of the domains that wait for a clique.
	_, _ = claims.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.claimChanged(o) },
		UpdateFunc: func(_, o any) { c.claimChanged(o) },
		DeleteFunc: func(o any) { c.claimChanged(o) },
	})
	_, _ = slices.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.enqueueAll() },
		UpdateFunc: func(_, _ any) { c.enqueueAll() },
		DeleteFunc: func(any) { c.enqueueAll() },
	})
	return c
}

func (c *Controller) enqueue(o any) {
	if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
		c.queue.Add(k)
	}
}

// enqueueUID queues the domain of that UID, if it is known.
func (c *Controller) enqueueUID(uid string) {
	objs, _ := c.domains.GetIndexer().ByIndex(byUID, uid)
	for _, o := range objs {
		c.enqueue(o)
	}
}

func (c *Controller) enqueueLabel(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if m, err := meta.Accessor(o); err == nil {
		if uid := m.GetLabels()[Label]; uid != "" {
			c.enqueueUID(uid)
		}
	}
}

func (c *Controller) enqueueAll() {
	for _, o := range c.domains.GetIndexer().List() {
		c.enqueue(o)
	}
}

func (c *Controller) claimChanged(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	cl, ok := o.(*resourceapi.ResourceClaim)
	if !ok {
		return
	}
	if cfg := ChannelConfigOf(cl); cfg != nil {
		c.enqueueUID(cfg.DomainUID)
	}
	for _, o := range c.domains.GetIndexer().List() {
		if cd, err := toDomain(o); err == nil && !conditionTrue(cd, v1alpha1.ConditionCliqueAssigned) {
			c.enqueue(o)
		}
	}
}

// toDomain converts an informer object to a ComputeDomain.
func toDomain(o any) (*v1alpha1.ComputeDomain, error) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("ComputeDomain informer: unexpected %T", o)
	}
	cd := &v1alpha1.ComputeDomain{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd); err != nil {
		return nil, fmt.Errorf("ComputeDomain %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return cd, nil
}

func toUnstructured(cd *v1alpha1.ComputeDomain) (*unstructured.Unstructured, error) {
	cd.APIVersion, cd.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.ComputeDomainKind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cd)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// Run starts the informers and works until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer c.queue.ShutDown()
	defer c.shutdown()
	if !c.start(ctx) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("informers did not sync: facet-controller needs list and watch on computedomains, nodes, resourceclaims, resourceslices, resourceclaimtemplates, and pods and daemonsets in its namespace")
	}
	if c.opts.OnSynced != nil {
		c.opts.OnSynced()
	}
	c.opts.Metrics.watch(c)
	defer c.opts.Metrics.watch(nil)
	logger.Info("Reconciling ComputeDomains", "namespace", c.opts.Namespace)
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		c.Sweep(ctx)
		c.enqueueAll()
	}, c.opts.Resync)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for c.next(ctx) {
	}
	return nil
}

// start starts the informers and waits until they synced or ctx ended.
func (c *Controller) start(ctx context.Context) bool {
	c.dynamic.Start(ctx.Done())
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	return cache.WaitForCacheSync(ctx.Done(), c.synced...)
}

// shutdown waits for the informers' goroutines, once ctx ended.
func (c *Controller) shutdown() {
	c.dynamic.Shutdown()
	for _, f := range c.factories {
		f.Shutdown()
	}
}

func (c *Controller) next(ctx context.Context) bool {
	k, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(k)
	if err := c.Sync(ctx, k); err != nil {
		c.opts.Metrics.syncError()
		klog.FromContext(ctx).Error(err, "ComputeDomain sync failed; retrying", "computeDomain", k)
		c.queue.AddRateLimited(k)
		return true
	}
	c.queue.Forget(k)
	return true
}

// Sync reconciles the domain of key (namespace/name).
func (c *Controller) Sync(ctx context.Context, key string) error {
	o, exists, err := c.domains.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	cd, err := toDomain(o)
	if err != nil {
		return err
	}
	if cd.DeletionTimestamp != nil {
		return c.finalize(ctx, cd)
	}
	if !slices.Contains(cd.Finalizers, Finalizer) {
		cd.Finalizers = append(cd.Finalizers, Finalizer)
		if cd, err = c.update(ctx, cd); err != nil {
			return fmt.Errorf("ComputeDomain %s: adding finalizer %s: %w", key, Finalizer, err)
		}
	}
	st := cd.Status.DeepCopy()
	var events []Event
	if err := v1alpha1.ValidateComputeDomainSpec(&cd.Spec); err != nil {
		msg := err.Error()
		if setCondition(cd, st, metav1.ConditionFalse, CondInvalidSpec, msg) {
			events = append(events, Event{corev1.EventTypeWarning, ReasonInvalidSpec, msg})
		}
		return c.writeStatus(ctx, cd, st, events)
	}
	if err := c.ensureDaemonSet(ctx, cd); err != nil {
		return err
	}
	ev, err := c.place(ctx, cd, st)
	if err != nil {
		return err
	}
	events = append(events, ev...)
	events = append(events, c.observe(cd, st)...)
	return c.writeStatus(ctx, cd, st, events)
}

// setCondition sets CliqueAssigned; true when it changed.
func setCondition(cd *v1alpha1.ComputeDomain, st *v1alpha1.ComputeDomainStatus, status metav1.ConditionStatus, reason, msg string) bool {
	old := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionCliqueAssigned)
	changed := old == nil || old.Status != status || old.Reason != reason || old.Message != msg
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionCliqueAssigned, Status: status,
		Reason: reason, Message: msg, ObservedGeneration: cd.Generation})
	return changed
}

// writeStatus writes st where it differs from the domain's, then raises
// the events (after the write, so that a failed write raises none and
// the retry says them once).
func (c *Controller) writeStatus(ctx context.Context, cd *v1alpha1.ComputeDomain, st *v1alpha1.ComputeDomainStatus, events []Event) error {
	if !equality.Semantic.DeepEqual(&cd.Status, st) {
		next := cd.DeepCopy()
		next.Status = *st
		u, err := toUnstructured(next)
		if err != nil {
			return err
		}
		if _, err := c.opts.Dynamic.Resource(occupancy.ComputeDomains).Namespace(cd.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("ComputeDomain %s/%s: writing status: %w", cd.Namespace, cd.Name, err)
		}
	}
	for _, e := range events {
		c.opts.Recorder.Event(cd, e.Type, e.Reason, e.Message)
	}
	return nil
}

func (c *Controller) update(ctx context.Context, cd *v1alpha1.ComputeDomain) (*v1alpha1.ComputeDomain, error) {
	u, err := toUnstructured(cd)
	if err != nil {
		return nil, err
	}
	u, err = c.opts.Dynamic.Resource(occupancy.ComputeDomains).Namespace(cd.Namespace).Update(ctx, u, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	return toDomain(u)
}

// ensureDaemonSet creates the domain's DaemonSet, or updates it where the
// pod template changed.
func (c *Controller) ensureDaemonSet(ctx context.Context, cd *v1alpha1.ComputeDomain) error {
	want, err := DaemonSet(cd, c.opts.PodTemplate, c.opts.Namespace)
	if err != nil {
		return err
	}
	have, err := c.sets.DaemonSets(c.opts.Namespace).Get(want.Name)
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.opts.Client.AppsV1().DaemonSets(c.opts.Namespace).Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // the informer has not seen it yet; its event requeues
		}
		if err != nil {
			return fmt.Errorf("ComputeDomain %s/%s: creating DaemonSet %s/%s: %w", cd.Namespace, cd.Name, want.Namespace, want.Name, err)
		}
		klog.FromContext(ctx).V(2).Info("Created the IMEX DaemonSet", "computeDomain", klog.KObj(cd), "daemonSet", klog.KObj(want))
		return nil
	case err != nil:
		return err
	case have.Annotations[AnnotationHash] == want.Annotations[AnnotationHash]:
		return nil
	}
	next := have.DeepCopy()
	next.Labels, next.Annotations = want.Labels, want.Annotations
	next.Spec.Template, next.Spec.UpdateStrategy = want.Spec.Template, want.Spec.UpdateStrategy
	if _, err := c.opts.Client.AppsV1().DaemonSets(c.opts.Namespace).Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("ComputeDomain %s/%s: updating DaemonSet %s/%s to the new pod template: %w", cd.Namespace, cd.Name, have.Namespace, have.Name, err)
	}
	klog.FromContext(ctx).Info("Updated the IMEX DaemonSet to the pod template; running daemons stay until their pods are deleted (OnDelete)",
		"computeDomain", klog.KObj(cd), "daemonSet", klog.KObj(have))
	return nil
}

// domainClaims are the domain's claims, from the claims' index.
func (c *Controller) domainClaims(cd *v1alpha1.ComputeDomain) []*resourceapi.ResourceClaim {
	objs, _ := c.claims.ByIndex(byDomain, string(cd.UID))
	var claims []*resourceapi.ResourceClaim
	for _, o := range objs {
		if cl, ok := o.(*resourceapi.ResourceClaim); ok {
			claims = append(claims, cl)
		}
	}
	return ClaimsOf(cd, claims)
}

func (c *Controller) allClaims() []*resourceapi.ResourceClaim {
	objs := c.claims.List()
	out := make([]*resourceapi.ResourceClaim, 0, len(objs))
	for _, o := range objs {
		if cl, ok := o.(*resourceapi.ResourceClaim); ok {
			out = append(out, cl)
		}
	}
	return out
}

func (c *Controller) allDomains() []*v1alpha1.ComputeDomain {
	var out []*v1alpha1.ComputeDomain
	for _, o := range c.domains.GetIndexer().List() {
		if cd, err := toDomain(o); err == nil {
			out = append(out, cd)
		}
	}
	return out
}

// channels are the cluster's imex-channel devices and their holders.
func (c *Controller) channels() ([]*occupancy.Channel, error) {
	sl, err := c.slices.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	return occupancy.Channels(sl, c.allClaims(), ""), nil
}

// place pins the domain to a clique and writes its template. The clique
// is chosen while the domain has none, and chosen again while it fits
// none and no claim of it exists yet: a claim copies its template's
// selector when its pod is created, so once one exists the clique stays,
// or the domain would span two. The condition CliqueAssigned is set once,
// from where it ends (a fit, no fit, a template of another's), so that it
// never flips within a sync, and an Event says each change.
func (c *Controller) place(ctx context.Context, cd *v1alpha1.ComputeDomain, st *v1alpha1.ComputeDomainStatus) ([]Event, error) {
	assigned := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionCliqueAssigned)
	fits := assigned != nil && assigned.Status == metav1.ConditionTrue
	type outcome struct {
		status          metav1.ConditionStatus
		reason, message string
		eventType       string
		eventReason     string
	}
	var out *outcome
	if st.Clique == "" || (!fits && len(c.domainClaims(cd)) == 0) {
		chs, err := c.channels()
		if err != nil {
			return nil, err
		}
		choice := Choose(occupancy.Cliques(chs), Reserved(c.allDomains(), c.allClaims(), cd.UID), int(cd.Spec.NumNodes))
		out = &outcome{metav1.ConditionFalse, CondNoCliqueFits, choice.Why, corev1.EventTypeWarning, ReasonNoCliqueFits}
		if choice.Fits {
			out = &outcome{metav1.ConditionTrue, CondFits, choice.Why, corev1.EventTypeNormal, ReasonCliqueAssigned}
		}
		st.Clique = choice.Clique.Name
	}
	if st.Clique != "" {
		q, err := ParseClique(st.Clique)
		if err != nil {
			return nil, fmt.Errorf("ComputeDomain %s/%s: status.clique: %w", cd.Namespace, cd.Name, err)
		}
		conflict, err := c.ensureTemplate(ctx, cd, q)
		if err != nil {
			return nil, err
		}
		if conflict != "" {
			out = &outcome{metav1.ConditionFalse, CondConflict, conflict, corev1.EventTypeWarning, ReasonTemplateConflict}
		} else if out == nil && assigned != nil && assigned.Reason == CondConflict {
			// The other template went: the domain's is written now.
			out = &outcome{metav1.ConditionTrue, CondFits, "pinned to clique " + st.Clique + "; its template is written", corev1.EventTypeNormal, ReasonCliqueAssigned}
		}
	}
	if out == nil {
		return nil, nil
	}
	if setCondition(cd, st, out.status, out.reason, out.message) {
		return []Event{{out.eventType, out.eventReason, out.message}}, nil
	}
	return nil, nil
}

// ParseClique is the clique of a name "<fabricClusterUUID>.<fabricCliqueID>"
// (v1alpha1.CliqueName, status.clique).
func ParseClique(name string) (occupancy.Clique, error) {
	i := strings.LastIndex(name, ".")
	if i <= 0 {
		return occupancy.Clique{}, fmt.Errorf("%q is not <fabricClusterUUID>.<fabricCliqueID>", name)
	}
	id, err := strconv.ParseInt(name[i+1:], 10, 64)
	if err != nil || id < 0 {
		return occupancy.Clique{}, fmt.Errorf("%q is not <fabricClusterUUID>.<fabricCliqueID>: clique ID %q", name, name[i+1:])
	}
	return occupancy.Clique{Name: name, ClusterUUID: name[:i], CliqueID: id}, nil
}

// ensureTemplate writes the domain's template for the clique: creates it,
// or replaces one of the domain's that selects another clique. A template
// of that name that is not the domain's is left alone: conflict says so.
func (c *Controller) ensureTemplate(ctx context.Context, cd *v1alpha1.ComputeDomain, q occupancy.Clique) (conflict string, err error) {
	want, err := Template(cd, q)
	if err != nil {
		return "", err
	}
	api := c.opts.Client.ResourceV1().ResourceClaimTemplates(cd.Namespace)
	have, err := c.templates.ResourceClaimTemplates(cd.Namespace).Get(want.Name)
	if apierrors.IsNotFound(err) {
		// Not labelled as the controller's, so not in its informer: a
		// template of that name may still exist.
		have, err = api.Get(ctx, want.Name, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		if _, err := api.Create(ctx, want, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("ComputeDomain %s/%s: creating ResourceClaimTemplate %s: %w", cd.Namespace, cd.Name, want.Name, err)
		}
		klog.FromContext(ctx).V(2).Info("Created the channel template", "computeDomain", klog.KObj(cd), "template", want.Name, "clique", q.Name)
		return "", nil
	case err != nil:
		return "", err
	case !OwnedBy(have, cd):
		return fmt.Sprintf("ResourceClaimTemplate %s/%s exists and is not this domain's: delete it, or name another in spec.channel.resourceClaimTemplate.name", cd.Namespace, want.Name), nil
	case SameTemplate(have, want):
		return "", nil
	}
	if err := api.Delete(ctx, have.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &have.UID}}); err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("ComputeDomain %s/%s: replacing ResourceClaimTemplate %s: %w", cd.Namespace, cd.Name, have.Name, err)
	}
	if _, err := api.Create(ctx, want, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("ComputeDomain %s/%s: creating ResourceClaimTemplate %s: %w", cd.Namespace, cd.Name, want.Name, err)
	}
	klog.FromContext(ctx).Info("Replaced the channel template", "computeDomain", klog.KObj(cd), "template", want.Name, "clique", q.Name)
	return "", nil
}

// observe sets status.nodes and readiness from the labelled nodes and the
// daemon pods, and returns the Events of what changed, restarts of the
// daemons included.
func (c *Controller) observe(cd *v1alpha1.ComputeDomain, st *v1alpha1.ComputeDomainStatus) []Event {
	uid := string(cd.UID)
	sel := labels.SelectorFromSet(labels.Set{Label: uid})
	labelled, _ := c.nodes.List(sel)
	pods, _ := c.pods.Pods(c.opts.Namespace).List(sel)
	chs, _ := c.channels()
	old := st.Nodes
	st.Nodes = Nodes(cd, labelled, pods, chs)
	if len(st.Nodes) == 0 {
		st.Nodes = nil
	}
	SetReadiness(cd, st)
	gone := map[string]bool{}
	for _, o := range old {
		if _, err := c.nodes.Get(o.Name); apierrors.IsNotFound(err) {
			gone[o.Name] = true
		}
	}
	events := Transitions(cd.Spec.NumNodes, old, st.Nodes, gone)

	c.mu.Lock()
	defer c.mu.Unlock()
	seen := c.restarts[cd.UID]
	if seen == nil {
		seen = map[string]int32{}
		c.restarts[cd.UID] = seen
	}
	for _, e := range st.Nodes {
		p := DaemonPod(pods, e.Name)
		if p == nil {
			continue
		}
		n, how := Restarts(p)
		key := e.Name + "/" + string(p.UID)
		if last, ok := seen[key]; ok && n > last {
			msg := fmt.Sprintf("IMEX daemon on node %s restarted (%d restarts)", e.Name, n)
			if how != "" {
				msg += "; it ended with " + how
			}
			events = append(events, Event{corev1.EventTypeWarning, ReasonDaemonRestarted, msg})
		}
		seen[key] = n
	}
	return events
}

// finalize tears a deleted domain down once no pod holds its channels:
// the template goes at once (no new pod may join a deleted domain), the
// DaemonSet and the finalizer once no claim of it is reserved for a pod
// and no node is labelled for it (its plugins have unprepared every
// channel). Until then status.nodes stays current: the daemons still read
// their peer list from it.
func (c *Controller) finalize(ctx context.Context, cd *v1alpha1.ComputeDomain) error {
	if !slices.Contains(cd.Finalizers, Finalizer) {
		return nil
	}
	logger := klog.FromContext(ctx)
	name := cd.Spec.Channel.ResourceClaimTemplate.Name
	if t, err := c.templates.ResourceClaimTemplates(cd.Namespace).Get(name); err == nil && OwnedBy(t, cd) {
		err := c.opts.Client.ResourceV1().ResourceClaimTemplates(cd.Namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &t.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("ComputeDomain %s/%s: deleting ResourceClaimTemplate %s: %w", cd.Namespace, cd.Name, name, err)
		}
		logger.V(2).Info("Deleted the channel template of a deleted domain", "computeDomain", klog.KObj(cd), "template", name)
	} else if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	pods := Holders(c.domainClaims(cd))
	labelled, _ := c.nodes.List(labels.SelectorFromSet(labels.Set{Label: string(cd.UID)}))
	if len(pods) > 0 || len(labelled) > 0 {
		st := cd.Status.DeepCopy()
		events := c.observe(cd, st)
		msg := WaitingMessage(pods, labelled)
		c.mu.Lock()
		if c.told[cd.UID] != msg {
			c.told[cd.UID] = msg
			events = append(events, Event{corev1.EventTypeNormal, ReasonWaitingForPods, msg})
		}
		c.mu.Unlock()
		return c.writeStatus(ctx, cd, st, events)
	}
	ds := DaemonSetName(cd)
	err := c.opts.Client.AppsV1().DaemonSets(c.opts.Namespace).Delete(ctx, ds, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("ComputeDomain %s/%s: deleting DaemonSet %s/%s: %w", cd.Namespace, cd.Name, c.opts.Namespace, ds, err)
	}
	cd.Finalizers = slices.DeleteFunc(cd.Finalizers, func(f string) bool { return f == Finalizer })
	if _, err := c.update(ctx, cd); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("ComputeDomain %s/%s: removing finalizer %s: %w", cd.Namespace, cd.Name, Finalizer, err)
	}
	c.opts.Recorder.Event(cd, corev1.EventTypeNormal, ReasonTornDown,
		fmt.Sprintf("no pod holds the domain's channels: DaemonSet %s/%s and ResourceClaimTemplate %s deleted", c.opts.Namespace, ds, name))
	logger.Info("Tore a deleted domain down", "computeDomain", klog.KObj(cd), "daemonSet", ds)
	c.mu.Lock()
	delete(c.told, cd.UID)
	delete(c.restarts, cd.UID)
	c.mu.Unlock()
	return nil
}

// Holders are the pods the domain's claims are reserved for
// (namespace/name, sorted): allocated claims whose pods have not ended.
func Holders(claims []*resourceapi.ResourceClaim) []string {
	var out []string
	for _, cl := range claims {
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.ReservedFor {
			if r.Resource == "pods" {
				out = append(out, cl.Namespace+"/"+r.Name)
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// WaitingMessage says what a deleted domain waits for.
func WaitingMessage(pods []string, labelled []*corev1.Node) string {
	var parts []string
	if len(pods) > 0 {
		parts = append(parts, fmt.Sprintf("%d pod(s) hold its IMEX channels (%s)", len(pods), strings.Join(pods, ", ")))
	}
	if len(labelled) > 0 {
		var ns []string
		for _, n := range labelled {
			ns = append(ns, n.Name)
		}
		sort.Strings(ns)
		parts = append(parts, fmt.Sprintf("the kubelet plugin of %d node(s) has not unprepared its channel yet (%s)", len(ns), strings.Join(ns, ", ")))
	}
	return "deleted: its IMEX daemons stay while " + strings.Join(parts, ", and while ") +
		". A node that is gone for good keeps the label " + Label + ": delete its Node object"
}

// Sweep deletes the DaemonSets and templates of domains that are gone (a
// finalizer removed by hand, a domain deleted while no controller ran),
// and forgets their state.
func (c *Controller) Sweep(ctx context.Context) {
	known := map[string]bool{}
	for _, o := range c.domains.GetIndexer().List() {
		if m, err := meta.Accessor(o); err == nil {
			known[string(m.GetUID())] = true
		}
	}
	sets, _ := c.sets.DaemonSets(c.opts.Namespace).List(labels.Everything())
	for _, ds := range sets {
		deleteGone(ctx, known, ds, "IMEX DaemonSet", c.opts.Client.AppsV1().DaemonSets(ds.Namespace).Delete,
			"daemonSet", klog.KObj(ds), "domain", ds.Annotations[AnnotationDomain])
	}
	templates, _ := c.templates.List(labels.Everything())
	for _, t := range templates {
		deleteGone(ctx, known, t, "channel template", c.opts.Client.ResourceV1().ResourceClaimTemplates(t.Namespace).Delete,
			"template", klog.KObj(t))
	}
	c.mu.Lock()
	for uid := range c.restarts {
		if !known[string(uid)] {
			delete(c.restarts, uid)
			delete(c.told, uid)
		}
	}
	c.mu.Unlock()
}

// deleteGone deletes obj through del where its Label names a domain that
// is not in known (UIDs), with obj's UID as precondition: an object of the
// same name made since stays. what names obj's kind in the log, and kv
// (logr's key and value pairs) obj itself. A deletion that fails is logged
// and retried at the next sweep; one already gone counts as done.
func deleteGone(ctx context.Context, known map[string]bool, obj metav1.Object, what string,
	del func(context.Context, string, metav1.DeleteOptions) error, kv ...any) {
	if uid := obj.GetLabels()[Label]; uid == "" || known[uid] {
		return
	}
	logger := klog.FromContext(ctx)
	uid := obj.GetUID()
	if err := del(ctx, obj.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		logger.Error(err, "Deleting the "+what+" of a domain that is gone", kv...)
		return
	}
	logger.Info("Deleted the "+what+" of a domain that is gone", kv...)
}

// Snapshot is what the metrics read: the domains and the cliques.
func (c *Controller) Snapshot() ([]*v1alpha1.ComputeDomain, []occupancy.Clique) {
	chs, err := c.channels()
	if err != nil {
		return c.allDomains(), nil
	}
	return c.allDomains(), occupancy.Cliques(chs)
}
