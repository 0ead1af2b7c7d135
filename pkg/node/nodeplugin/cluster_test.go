package nodeplugin

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/node/nodeevents"
)

// refusing is an API server that refuses the detection's dry-run probes.
func refusing() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	return c
}

// keeping is an API server that keeps every field of the probes: every
// gate on.
func keeping() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, a.(k8stesting.CreateAction).GetObject().DeepCopyObject(), nil
	})
	return c
}

func drain(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestClusterFeatures: a failed detection assumes a stock cluster, says so
// in a Warning, and still applies --feature-gates.
func TestClusterFeatures(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	ev := nodeevents.NewWith(rec, "node-a")
	o, err := features.ParseOverrides("DRADeviceTaints=true")
	if err != nil {
		t.Fatal(err)
	}
	s := clusterFeatures(context.Background(), refusing(), "node-a", o, ev)
	for _, g := range features.Gates {
		if want := g == features.DeviceTaints; s.Enabled[g] != want {
			t.Errorf("%s enabled %v, want %v", g, s.Enabled[g], want)
		}
	}
	got := drain(rec)
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning "+reasonFeaturesUnknown) {
		t.Errorf("events %q, want one %s Warning", got, reasonFeaturesUnknown)
	}
}

// TestWatchFeatures: the watch returns an error (the plugin restarts)
// once the detected features differ from those at start, keeps them
// while detection fails, and returns nil when its context ends.
func TestWatchFeatures(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	ev := nodeevents.NewWith(rec, "node-a")
	ctx := context.Background()

	err := watchFeatures(ctx, keeping(), "node-a", nil, features.Stock("start"), time.Millisecond, ev)
	if err == nil || !strings.Contains(err.Error(), "changed") {
		t.Fatalf("features changed: %v, want an error saying so", err)
	}
	if got := drain(rec); len(got) != 1 || !strings.HasPrefix(got[0], "Warning "+reasonFeaturesChanged) {
		t.Errorf("events %q, want one %s Warning", got, reasonFeaturesChanged)
	}

	// Failing detections keep the start's features until the context ends.
	cctx, cancel := context.WithCancel(ctx)
	c := refusing()
	var tries atomic.Int32
	c.PrependReactor("create", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		if tries.Add(1) > 3 {
			cancel()
		}
		return true, nil, errors.New("forbidden")
	})
	if err := watchFeatures(cctx, c, "node-a", nil, features.Stock("start"), time.Millisecond, ev); err != nil {
		t.Errorf("detection failing until the context ends: %v", err)
	}
	if got := drain(rec); len(got) != 0 {
		t.Errorf("events %q while detection failed, want none", got)
	}
}

// TestWatchFeaturesVersion: with the same gates, the watch restarts the
// plugin when the control plane's version crosses a fix of a known
// allocator defect, and not for a patch release that changes none.
func TestWatchFeaturesVersion(t *testing.T) {
	for _, tc := range []struct {
		start, now string
		restart    bool
	}{
		{start: "v1.35.4", now: "v1.36.3", restart: true},
		{start: "v1.36.2", now: "v1.36.3", restart: true},
		{start: "v1.36.3", now: "v1.35.4", restart: true},
		{start: "v1.36.3", now: "v1.37.2", restart: false},
		{start: "v1.35.3", now: "v1.35.4", restart: false},
	} {
		t.Run(tc.start+" to "+tc.now, func(t *testing.T) {
			rec := record.NewFakeRecorder(10)
			ev := nodeevents.NewWith(rec, "node-a")
			c := keeping()
			c.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: tc.now}
			start := features.AllOn("start")
			start.ServerVersion = tc.start
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var polls atomic.Int32
			c.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				// Enough polls for several re-checks, then the context ends.
				if polls.Add(1) > 50 {
					cancel()
				}
				return true, a.(k8stesting.CreateAction).GetObject().DeepCopyObject(), nil
			})
			err := watchFeatures(ctx, c, "node-a", nil, start, time.Millisecond, ev)
			if tc.restart != (err != nil) {
				t.Fatalf("error %v, want a restart: %v", err, tc.restart)
			}
			if tc.restart && (!strings.Contains(err.Error(), tc.start+" to "+tc.now) || !strings.Contains(err.Error(), "kubernetes#14")) {
				t.Errorf("error %q does not name the versions and defects", err)
			}
		})
	}
}
