// Package computedomain is what the kubelet plugin reads and writes of
// the cluster for IMEX channel claims (docs/design/compute-domains.md):
// the ComputeDomains, from an informer that starts with the first channel
// claim a node prepares, and its own Node's compute-domain label, which
// pulls the domain's IMEX daemon onto the node. Deciding what the label
// should be is the driver's (package dradriver), from its checkpoint.
package computedomain

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// Resource is the ComputeDomains' group and resource, for errors.
var Resource = configapi.SchemeGroupVersion.WithResource(configapi.ComputeDomainResource).GroupResource()

// DefaultSyncTimeout bounds how long Domain waits for the informer's first
// list, within the caller's context: a prepare that waits longer fails
// and is retried by the kubelet.
const DefaultSyncTimeout = 10 * time.Second

// Cluster is the ComputeDomains and the node's label. Safe for concurrent
// use.
type Cluster struct {
	client kubernetes.Interface
	node   string
	lw     cache.ListerWatcher
	// ctx is the informer's lifetime: the plugin's.
	ctx         context.Context
	syncTimeout time.Duration

	start    sync.Once
	informer cache.SharedIndexInformer

	mu sync.Mutex
	// listErr is the informer's last list or watch error, for the error
	// of a Domain call that finds it unsynced.
	listErr error
}

// New reads ComputeDomains through lw (NewListWatch) once Domain is first
// called, for as long as ctx lasts, and labels the Node named node
// through client (get and patch on nodes).
func New(ctx context.Context, client kubernetes.Interface, lw cache.ListerWatcher, node string) *Cluster {
	return &Cluster{client: client, node: node, lw: lw, ctx: ctx, syncTimeout: DefaultSyncTimeout}
}

// NewRESTClient is a REST client of cfg for gpu.facet.dev/v1alpha1's
// served kinds (configapi.AddServedToScheme: ComputeDomain and its list),
// typed, in JSON, with client-go's user agent where cfg names none: what
// the kubelet plugin's informer and facet-imex's watch read ComputeDomains
// through. cfg is copied, not changed. Errors: a configuration the REST
// client refuses.
func NewRESTClient(cfg *rest.Config) (rest.Interface, error) {
	scheme := runtime.NewScheme()
	if err := configapi.AddServedToScheme(scheme); err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &configapi.SchemeGroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if err := rest.SetKubernetesDefaults(c); err != nil {
		return nil, err
	}
	client, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("ComputeDomain client: %w", err)
	}
	return client, nil
}

// NewListWatch lists and watches every namespace's ComputeDomains through
// NewRESTClient. Errors: NewRESTClient's.
func NewListWatch(cfg *rest.Config) (cache.ListerWatcher, error) {
	client, err := NewRESTClient(cfg)
	if err != nil {
		return nil, err
	}
	return cache.ToListWatcherWithWatchListSemantics(
		cache.NewListWatchFromClient(client, configapi.ComputeDomainResource, metav1.NamespaceAll, fields.Everything()), client), nil
}

// Domain returns the ComputeDomain namespace/name as the informer last saw
// it (a copy), or an error: NotFound (apierrors.IsNotFound) where there is
// none, or, when the informer has not listed them within the sync timeout
// and ctx, one that says so with the last list error (the CRD not
// installed, RBAC).
func (c *Cluster) Domain(ctx context.Context, namespace, name string) (*configapi.ComputeDomain, error) {
	c.start.Do(func() {
		c.informer = cache.NewSharedIndexInformerWithOptions(c.lw, &configapi.ComputeDomain{}, cache.SharedIndexInformerOptions{})
		_ = c.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			c.mu.Lock()
			c.listErr = err
			c.mu.Unlock()
			cache.DefaultWatchErrorHandler(ctx, r, err)
		})
		go c.informer.RunWithContext(c.ctx)
	})
	if !c.informer.HasSynced() {
		wait, cancel := context.WithTimeout(ctx, c.syncTimeout)
		defer cancel()
		if !cache.WaitForCacheSync(wait.Done(), c.informer.HasSynced) {
			c.mu.Lock()
			why := c.listErr
			c.mu.Unlock()
			if why == nil {
				why = wait.Err()
			}
			// %v: a list error of NotFound (no CRD) must not read as
			// this domain's NotFound.
			return nil, fmt.Errorf("ComputeDomains (%s) not listed yet: %v", Resource, why)
		}
	}
	obj, ok, err := c.informer.GetIndexer().GetByKey(namespace + "/" + name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, apierrors.NewNotFound(Resource, name)
	}
	d, ok := obj.(*configapi.ComputeDomain)
	if !ok {
		return nil, fmt.Errorf("ComputeDomain %s/%s: the informer holds a %T", namespace, name, obj)
	}
	return d.DeepCopy(), nil
}

// NodeLabel returns the node's compute-domain label (names.LabelComputeDomain),
// "" where it has none.
func (c *Cluster) NodeLabel(ctx context.Context) (string, error) {
	n, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read Node %s's %s label: %w", c.node, names.LabelComputeDomain, err)
	}
	return n.Labels[names.LabelComputeDomain], nil
}

// ErrLabelChanged is SetNodeLabel's error when the label is neither what
// the caller saw nor what it wants: someone else changed it.
var ErrLabelChanged = errors.New("the node's compute-domain label changed")

// SetNodeLabel changes the node's compute-domain label from from to to
// ("": absent), touching nothing else of the Node: a merge patch of the
// one label, conditional on the Node's resourceVersion, and retried on a
// conflict. A label that is to already is left alone; one that is neither
// fails with ErrLabelChanged, naming the value found.
func (c *Cluster) SetNodeLabel(ctx context.Context, from, to string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read Node %s: %w", c.node, err)
		}
		cur := n.Labels[names.LabelComputeDomain]
		switch cur {
		case to:
			return nil
		case from:
		default:
			return fmt.Errorf("%w: Node %s has %s=%q, not %q", ErrLabelChanged, c.node, names.LabelComputeDomain, cur, from)
		}
		var value any // JSON null removes the label
		if to != "" {
			value = to
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": n.ResourceVersion,
			"labels":          map[string]any{names.LabelComputeDomain: value},
		}})
		if err != nil {
			return err
		}
		if _, err := c.client.CoreV1().Nodes().Patch(ctx, c.node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager}); err != nil {
			return fmt.Errorf("label Node %s %s=%q: %w", c.node, names.LabelComputeDomain, to, err)
		}
		klog.FromContext(ctx).V(2).Info("Node label changed", "label", names.LabelComputeDomain, "from", from, "to", to)
		return nil
	})
}

// FieldManager is the kubelet plugin's field manager on its Node.
const FieldManager = "facet.dev/kubelet-plugin"
