package helm

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// lookupClients is what the chart's lookup calls see of a cluster that
// holds objects: Helm's engine asks a ClientProvider for a dynamic client
// per kind, here client-go's fake over those objects.
type lookupClients struct {
	client *dynamicfake.FakeDynamicClient
}

// lookupKinds are the kinds the chart looks up, with their resources and
// whether they are namespaced; a lookup of another kind fails the render,
// so that a new lookup is added here on purpose.
var lookupKinds = map[schema.GroupVersionKind]struct {
	resource   string
	namespaced bool
}{
	{Version: "v1", Kind: "Secret"}: {"secrets", true},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingWebhookConfiguration"}: {"validatingwebhookconfigurations", false},
}

func newLookupClients(objects []*unstructured.Unstructured) lookupClients {
	lists := map[schema.GroupVersionResource]string{}
	for gvk, k := range lookupKinds {
		lists[gvk.GroupVersion().WithResource(k.resource)] = gvk.Kind + "List"
	}
	objs := make([]runtime.Object, len(objects))
	for i, o := range objects {
		objs[i] = o
	}
	return lookupClients{dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists, objs...)}
}

// GetClientFor is engine.ClientProvider's.
func (c lookupClients) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, false, err
	}
	k, ok := lookupKinds[gv.WithKind(kind)]
	if !ok {
		return nil, false, fmt.Errorf("the chart looks up %s %s, which test/helm's lookupKinds does not list", apiVersion, kind)
	}
	return c.client.Resource(gv.WithResource(k.resource)), k.namespaced, nil
}
