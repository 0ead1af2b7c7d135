package dradriver

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
)

// TestRollingUpdateInstancesShareState: two driver instances on one state
// directory, as during a rolling update, where the kubelet may call either.
// Each sees what the other prepared and unprepared (a claim prepared by the
// old instance is unprepared by the new one), and neither runs while the
// other is inside a call.
func TestRollingUpdateInstancesShareState(t *testing.T) {
	r := newRig(t)
	r.nodeLock = filepath.Join(filepath.Dir(r.checkpoints), "plugin.lock")
	r.start()
	old := r.d
	r.start()
	cur := r.d

	a, b := claim("a", "gpu-0"), claim("b", "gpu-0")
	r.d = old
	if res := r.prepare(a)[a.UID]; res.Err != nil {
		t.Fatalf("old instance: prepare a: %v", res.Err)
	}
	// The new instance reloads the reservations the old one made.
	r.d = cur
	if res := r.prepare(b)[b.UID]; res.Err == nil || !strings.Contains(res.Err.Error(), "gpu-0") {
		t.Fatalf("new instance: prepare b on a's GPU: %v, want a refusal naming gpu-0", res.Err)
	}
	if err := r.unprepare(a.UID)[a.UID]; err != nil {
		t.Fatalf("new instance: unprepare a, prepared by the old one: %v", err)
	}
	if r.specExists(a.UID) {
		t.Fatal("a's CDI spec left after the new instance unprepared it")
	}
	// And the old instance sees that a is gone.
	r.d = old
	if res := r.prepare(b)[b.UID]; res.Err != nil {
		t.Fatalf("old instance: prepare b after a's unprepare: %v", res.Err)
	}

	// Mutual exclusion: while the new instance is inside a call, the old
	// one's call waits; an empty call (the health probe's) does not.
	_, ctx := ktesting.NewTestContext(t)
	if err := cur.enter(ctx); err != nil {
		t.Fatal(err)
	}
	// The lock is let go and both calls are waited for however the test
	// ends: they use the test's directories. The bounds below only turn
	// a hang into a failure; they are generous so that load cannot trip
	// them.
	var left atomic.Bool
	leave := func() {
		if left.CompareAndSwap(false, true) {
			cur.leave(ctx)
		}
	}
	probed := make(chan struct{})
	done := make(chan error, 1)
	started := false
	defer func() {
		leave()
		<-probed
		if started {
			if err := <-done; err != nil {
				t.Logf("the old instance's unprepare: %v", err)
			}
		}
	}()
	go func() {
		_, _ = old.PrepareResourceClaims(ctx, nil)
		close(probed)
	}()
	select {
	case <-probed:
	case <-time.After(2 * time.Minute):
		t.Fatal("an empty prepare (the health probe's) waited for the node lock")
	}
	started = true
	go func() {
		_, err := old.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "never-prepared"}})
		done <- err
	}()
	// Not synchronisation: a call that got past the lock would have
	// returned by now on most runs; on a slow one this checks less, never
	// wrongly.
	select {
	case err := <-done:
		done <- err
		t.Fatalf("the old instance ran (%v) while the new one held the node lock", err)
	case <-time.After(300 * time.Millisecond):
	}
	leave()
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the old instance still waits after the new one let go")
	}
}
