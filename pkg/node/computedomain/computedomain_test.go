package computedomain

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	configapi "github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/model/names"
)

// fakeLW lists domains and then streams what the test sends; like a
// client without WatchList, it lists first.
type fakeLW struct {
	*cache.ListWatch
}

func (fakeLW) IsWatchListSemanticsUnSupported() bool { return true }

func newLW(listErr error, domains ...configapi.ComputeDomain) (*watch.FakeWatcher, *atomic.Int32, cache.ListerWatcher) {
	w := watch.NewFake()
	var lists atomic.Int32
	return w, &lists, fakeLW{&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			lists.Add(1)
			if listErr != nil {
				return nil, listErr
			}
			return &configapi.ComputeDomainList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: domains}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return w, nil },
	}}
}

func domain(ns, name, uid string) configapi.ComputeDomain {
	return configapi.ComputeDomain{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), ResourceVersion: "1"},
		Spec: configapi.ComputeDomainSpec{NumNodes: 2}}
}

// TestDomain: the informer starts with the first call (nothing is listed
// before), serves domains from its cache, follows changes, and says why
// when it cannot list.
func TestDomain(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, lists, lw := newLW(nil, domain("ns", "train", "u-1"))
	c := New(ctx, fake.NewClientset(), lw, "node-a")
	time.Sleep(50 * time.Millisecond)
	if n := lists.Load(); n != 0 {
		t.Fatalf("listed %d times before any claim asked", n)
	}
	d, err := c.Domain(ctx, "ns", "train")
	if err != nil || d.UID != "u-1" {
		t.Fatalf("Domain = %+v, %v", d, err)
	}
	d.Status.Clique = "changed by the caller"
	if again, _ := c.Domain(ctx, "ns", "train"); again.Status.Clique != "" {
		t.Error("Domain returned the cache's object, not a copy")
	}
	if _, err := c.Domain(ctx, "other", "train"); !apierrors.IsNotFound(err) {
		t.Errorf("another namespace's: %v, want NotFound", err)
	}
	ready := domain("ns", "train", "u-1")
	ready.ResourceVersion = "2"
	ready.Status.Nodes = []configapi.ComputeDomainNode{{Name: "node-a", Status: configapi.ComputeDomainReady}}
	w.Modify(&ready)
	waitFor(t, "the node's entry Ready", func() bool {
		d, err := c.Domain(ctx, "ns", "train")
		return err == nil && len(d.Status.Nodes) == 1
	})
	w.Delete(&ready)
	waitFor(t, "the domain gone", func() bool {
		_, err := c.Domain(ctx, "ns", "train")
		return apierrors.IsNotFound(err)
	})
	if n := lists.Load(); n != 1 {
		t.Errorf("listed %d times, want once", n)
	}

	// No CRD: the error says so, within the sync timeout.
	_, _, broken := newLW(apierrors.NewNotFound(Resource, ""))
	c = New(ctx, fake.NewClientset(), broken, "node-a")
	c.syncTimeout = 300 * time.Millisecond
	_, err = c.Domain(ctx, "ns", "train")
	if err == nil || !strings.Contains(err.Error(), "ComputeDomains (computedomains.gpu.facet.dev) not listed yet") || apierrors.IsNotFound(err) {
		t.Errorf("Domain without the CRD: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSetNodeLabel: the label goes from one value to the next with a
// patch of that label alone, conditional on the Node's resourceVersion;
// one found at neither value is left alone and named.
func TestSetNodeLabel(t *testing.T) {
	for _, tc := range []struct {
		name, had, from, to string
		wantErr             string
		wantPatch           string
	}{
		{name: "set", had: "", from: "", to: "u-1", wantPatch: `{"metadata":{"labels":{"gpu.facet.dev/compute-domain":"u-1"},"resourceVersion":"7"}}`},
		{name: "remove", had: "u-1", from: "u-1", to: "", wantPatch: `{"metadata":{"labels":{"gpu.facet.dev/compute-domain":null},"resourceVersion":"7"}}`},
		{name: "replace a stale one", had: "u-0", from: "u-0", to: "u-1", wantPatch: `{"metadata":{"labels":{"gpu.facet.dev/compute-domain":"u-1"},"resourceVersion":"7"}}`},
		{name: "already so", had: "u-1", from: "", to: "u-1"},
		{name: "someone else's", had: "u-9", from: "", to: "u-1", wantErr: `Node node-a has gpu.facet.dev/compute-domain="u-9", not ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "7", Labels: map[string]string{"kubernetes.io/hostname": "node-a"}}}
			if tc.had != "" {
				node.Labels[names.LabelComputeDomain] = tc.had
			}
			client := fake.NewClientset(node)
			var patches []string
			client.PrependReactor("patch", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
				patches = append(patches, string(a.(clienttesting.PatchAction).GetPatch()))
				return false, nil, nil
			})
			c := New(ctx, client, nil, "node-a")
			err := c.SetNodeLabel(ctx, tc.from, tc.to)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrLabelChanged) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("SetNodeLabel: %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if want := []string{tc.wantPatch}; tc.wantPatch == "" && len(patches) != 0 || tc.wantPatch != "" && strings.Join(patches, "\n") != strings.Join(want, "\n") {
				t.Errorf("patches %q, want %q", patches, tc.wantPatch)
			}
			got, err := c.NodeLabel(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.to
			if tc.wantErr != "" {
				want = tc.had
			}
			if got != want {
				t.Errorf("label %q, want %q", got, want)
			}
		})
	}
}

// TestSetNodeLabelRetriesConflicts: a Node that changed between the read
// and the patch (its status, another label) is read again.
func TestSetNodeLabelRetriesConflicts(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "7"}})
	conflicts := 2
	client.PrependReactor("patch", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(corev1.Resource("nodes"), "node-a", errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	c := New(ctx, client, nil, "node-a")
	if err := c.SetNodeLabel(ctx, "", "u-1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.NodeLabel(ctx); got != "u-1" || conflicts != 0 {
		t.Errorf("label %q after %d conflicts left", got, conflicts)
	}
}

// TestNewRESTClient: the client asks the API server for the group's served
// path in JSON, with client-go's user agent where the configuration names
// none (else its own), decodes a ComputeDomain typed, and leaves the
// caller's configuration as it was.
func TestNewRESTClient(t *testing.T) {
	for _, tc := range []struct{ name, userAgent, wantAgent string }{
		{name: "no user agent", wantAgent: rest.DefaultKubernetesUserAgent()},
		{name: "the caller's", userAgent: "facet-imex", wantAgent: "facet-imex"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gotPath, gotAgent, gotAccept string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gotPath, gotAgent, gotAccept = r.URL.Path, r.UserAgent(), r.Header.Get("Accept")
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"apiVersion":"gpu.facet.dev/v1alpha1","kind":"ComputeDomain","metadata":{"namespace":"ml","name":"train"},"spec":{"numNodes":2}}`))
			}))
			defer srv.Close()
			cfg := &rest.Config{Host: srv.URL, UserAgent: tc.userAgent}
			client, err := NewRESTClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.GroupVersion != nil || cfg.APIPath != "" || cfg.UserAgent != tc.userAgent {
				t.Errorf("the caller's configuration changed: %+v", cfg)
			}
			got := &configapi.ComputeDomain{}
			if err := client.Get().Namespace("ml").Resource(configapi.ComputeDomainResource).Name("train").Do(context.Background()).Into(got); err != nil {
				t.Fatal(err)
			}
			if want := "/apis/gpu.facet.dev/v1alpha1/namespaces/ml/computedomains/train"; gotPath != want {
				t.Errorf("path: got %s, want %s", gotPath, want)
			}
			if gotAgent != tc.wantAgent {
				t.Errorf("user agent: got %q, want %q", gotAgent, tc.wantAgent)
			}
			if !strings.HasPrefix(gotAccept, runtime.ContentTypeJSON) {
				t.Errorf("Accept: got %q, want JSON", gotAccept)
			}
			if got.Namespace != "ml" || got.Name != "train" || got.Spec.NumNodes != 2 {
				t.Errorf("decoded %+v", got)
			}
		})
	}
}
