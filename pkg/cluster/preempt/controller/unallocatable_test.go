package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/facet-gpu/facet/internal/occupancy/occtest"
	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/pkg/model/features"
)

// migCluster is cluster's, of priority 100 throughout (so nothing is
// preempted), on one H100 of n1 in mig mode: low-0 holds its 4g.40gb
// (memory slices 0-3), low-1 a 1g.10gb at slice 4. Pending are urgent,
// for a 3g.40gb through mig.facet.dev, which the three free slices cannot
// hold, and urgent-2, for the whole GPU, which MIG instances in use keep.
func migCluster(t *testing.T) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	for _, o := range cluster(t, 100, false, nil) {
		if _, ok := o.(*resourceapi.ResourceSlice); !ok {
			objs = append(objs, o)
		}
	}
	for _, s := range occtest.Slices(t, occtest.Node{Name: "n1", Model: "H100-SXM5-80GB", GPUs: 1, Modes: "0=mig"}) {
		objs = append(objs, s)
	}
	held := map[string]string{"low-0-gpu": "gpu-0-mig-4g40gb-0", "low-1-gpu": "gpu-0-mig-1g10gb-4"}
	for _, o := range objs {
		c, ok := o.(*resourceapi.ResourceClaim)
		if !ok {
			continue
		}
		if d, ok := held[c.Name]; ok {
			c.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{occtest.Result("n1", d)}
		}
		if c.Name == "urgent-gpu" {
			c.Spec.Devices.Requests[0].Exactly.DeviceClassName = "mig.facet.dev"
			c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.attributes["gpu.facet.dev"].profile == "3g.40gb"`}}}
		}
	}
	// urgent-2's claim is a copy of urgent's, for a whole GPU again.
	objs = rival(objs)
	for _, o := range objs {
		if c, ok := o.(*resourceapi.ResourceClaim); ok && c.Name == "urgent-2-gpu" {
			c.Spec.Devices.Requests[0].Exactly.DeviceClassName = "gpu.facet.dev"
			c.Spec.Devices.Requests[0].Exactly.Selectors = nil
		}
	}
	return objs
}

// unallocatableSeries reads facet_preemptor_unallocatable_requests from
// the registry, as a scrape does: "class/profile=n", sorted.
func unallocatableSeries(t *testing.T, m *Metrics) string {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "facet_preemptor_unallocatable_requests" {
			continue
		}
		for _, s := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range s.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out = append(out, fmt.Sprintf("%s/%s=%v", l["device_class"], l["mig_profile"], s.GetGauge().GetValue()))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// TestUnallocatableRequests: the requests of pods whose claims fit on no
// node are counted by DeviceClass and MIG profile, and a pod leaves the
// count, its series with it, however it stops being such a pod.
func TestUnallocatableRequests(t *testing.T) {
	const both = "gpu.facet.dev/=1 mig.facet.dev/3g.40gb=1"
	for _, tc := range []struct {
		name string
		// end changes the cluster; it is called again until the count
		// changes, since the informers of pods and claims are not in step.
		end func(ctx context.Context, t *testing.T, client kubernetes.Interface)
	}{{
		name: "bound",
		end: func(ctx context.Context, t *testing.T, client kubernetes.Interface) {
			updateUrgent(ctx, t, client, func(p *v1.Pod) { p.Spec.NodeName = "n1" })
		},
	}, {
		name: "deleted",
		end: func(ctx context.Context, t *testing.T, client kubernetes.Interface) {
			_ = client.CoreV1().Pods("ml").Delete(ctx, "urgent", metav1.DeleteOptions{})
		},
	}, {
		name: "no longer unschedulable for its claims",
		end: func(ctx context.Context, t *testing.T, client kubernetes.Interface) {
			updateUrgent(ctx, t, client, func(p *v1.Pod) {
				p.Status.Conditions[0].Message = "0/1 nodes are available: 1 Insufficient cpu."
			})
		},
	}, {
		name: "its claims fit once the 1g.10gb is freed",
		end: func(ctx context.Context, t *testing.T, client kubernetes.Interface) {
			_ = client.ResourceV1().ResourceClaims("ml").Delete(ctx, "low-1-gpu", metav1.DeleteOptions{})
			_ = client.CoreV1().Pods("ml").Delete(ctx, "low-1", metav1.DeleteOptions{})
			updateUrgent(ctx, t, client, func(p *v1.Pod) {
				p.Labels = map[string]string{"touched": fmt.Sprint(time.Now().UnixNano())}
			})
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(migCluster(t)...)
			metrics := NewMetrics()
			c := New(Options{
				Client: client, Recorder: record.NewFakeRecorder(100), Metrics: metrics, Features: fit.FeaturesOf(features.AllOn("test")),
				Timeout: time.Minute, Backoff: time.Minute, MaxBackoff: time.Minute, Resync: time.Hour,
			})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- c.Run(ctx) }()
			stop := sync.OnceFunc(func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			})
			t.Cleanup(stop)
			wait := func(want string, do func()) {
				t.Helper()
				deadline := time.Now().Add(30 * time.Second)
				for got := unallocatableSeries(t, metrics); got != want; got = unallocatableSeries(t, metrics) {
					if time.Now().After(deadline) {
						t.Fatalf("facet_preemptor_unallocatable_requests %q, want %q", got, want)
					}
					if do != nil {
						do()
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			wait(both, nil)
			if problems, err := testutil.CollectAndLint(metrics.unallocatable); err != nil || len(problems) > 0 {
				t.Errorf("lint: %v %v", problems, err)
			}
			// urgent's series goes; urgent-2's stays.
			wait("gpu.facet.dev/=1", func() { tc.end(ctx, t, client) })
			// Stopping the controller clears what it counted.
			stop()
			if got := unallocatableSeries(t, metrics); got != "" {
				t.Errorf("after Run: %q, want no series", got)
			}
		})
	}
}

// updateUrgent changes the pending pod urgent.
func updateUrgent(ctx context.Context, t *testing.T, client kubernetes.Interface, edit func(*v1.Pod)) {
	t.Helper()
	p, err := client.CoreV1().Pods("ml").Get(ctx, "urgent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edit(p)
	if _, err := client.CoreV1().Pods("ml").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
