package controller

import (
	"strings"
	"testing"
	"time"
)

// TestCacheHealth: /healthz fails only while the controller has waited
// longer than the timeout for its informers; a replica that does not lead,
// or whose controller synced or stopped, is healthy.
func TestCacheHealth(t *testing.T) {
	now := time.Unix(1000, 0)
	h := &cacheHealth{timeout: 2 * time.Minute, now: func() time.Time { return now }}
	step := func(name string, advance time.Duration, do func(), wantErr bool) {
		t.Helper()
		now = now.Add(advance)
		if do != nil {
			do()
		}
		err := h.check()
		if (err != nil) != wantErr {
			t.Fatalf("%s: check %v, want error %v", name, err, wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "have not synced") {
			t.Fatalf("%s: %v", name, err)
		}
	}
	step("a follower", time.Hour, nil, false)
	step("leading, waiting", 0, h.waiting, false)
	step("still within the timeout", 119*time.Second, nil, false)
	step("past it", 2*time.Second, nil, true)
	step("synced at last", 0, h.synced, false)
	step("stays healthy", time.Hour, nil, false)
	step("waiting again (a new term)", 0, h.waiting, false)
	step("stopped before syncing", 0, h.stopped, false)
	step("and later", time.Hour, nil, false)
}
