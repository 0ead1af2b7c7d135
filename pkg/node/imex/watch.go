package imex

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/node/computedomain"
)

// Mailbox holds the newest version of a domain for Daemon.Run: a watch
// that delivers faster than the daemon acts only replaces what waits.
type Mailbox struct {
	mu    sync.Mutex
	cd    *v1alpha1.ComputeDomain
	ready chan struct{}
}

// NewMailbox returns an empty mailbox.
func NewMailbox() *Mailbox { return &Mailbox{ready: make(chan struct{}, 1)} }

// Put replaces what waits with cd (nil: the domain is gone).
func (m *Mailbox) Put(cd *v1alpha1.ComputeDomain) {
	m.mu.Lock()
	m.cd = cd
	m.mu.Unlock()
	select {
	case m.ready <- struct{}{}:
	default:
	}
}

// Ready is readable when a version waits.
func (m *Mailbox) Ready() <-chan struct{} { return m.ready }

// Take returns the newest version.
func (m *Mailbox) Take() *v1alpha1.ComputeDomain {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cd
}

// Watch watches the one ComputeDomain namespace/name (a field selector on
// metadata.name, so the daemon's RBAC may be get/list/watch of that
// resource in that namespace) and puts each version into mb, nil when it
// is deleted, until ctx ends. It returns once the informer has started;
// errors: the client cannot be made.
func Watch(ctx context.Context, cfg *rest.Config, namespace, name string, mb *Mailbox) error {
	c, err := computedomain.NewRESTClient(cfg)
	if err != nil {
		return err
	}
	lw := cache.NewListWatchFromClient(c, v1alpha1.ComputeDomainResource, namespace, fields.OneTermEqualSelector("metadata.name", name))
	put := func(obj any) {
		if cd, ok := obj.(*v1alpha1.ComputeDomain); ok {
			mb.Put(cd)
		}
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &v1alpha1.ComputeDomain{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    put,
			UpdateFunc: func(_, obj any) { put(obj) },
			DeleteFunc: func(any) { mb.Put(nil) },
		},
	})
	klog.FromContext(ctx).Info("Watching ComputeDomain", "namespace", namespace, "name", name)
	go ctrl.RunWithContext(ctx)
	return nil
}
