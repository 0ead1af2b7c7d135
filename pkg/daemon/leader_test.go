package daemon

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSyncHealth: /healthz fails only while the informers have waited
// longer than the timeout; a follower, or a leader whose informers synced
// or stopped, is healthy.
func TestSyncHealth(t *testing.T) {
	now := time.Unix(1000, 0)
	h := &SyncHealth{Timeout: 2 * time.Minute, Needs: "list on pods", Now: func() time.Time { return now }}
	for _, step := range []struct {
		name    string
		advance time.Duration
		do      func()
		fails   bool
	}{
		{"a follower", time.Hour, nil, false},
		{"leading, waiting", 0, h.Waiting, false},
		{"within the timeout", 119 * time.Second, nil, false},
		{"past it", 2 * time.Second, nil, true},
		{"synced at last", 0, h.Synced, false},
		{"stays healthy", time.Hour, nil, false},
		{"no timeout never fails", 0, func() { h.Waiting(); h.Timeout = 0 }, false},
		{"even much later", 24 * time.Hour, nil, false},
	} {
		now = now.Add(step.advance)
		if step.do != nil {
			step.do()
		}
		err := h.Check()
		if (err != nil) != step.fails {
			t.Fatalf("%s: Check %v, want failure %t", step.name, err, step.fails)
		}
		if err != nil && !strings.Contains(err.Error(), "have not synced in 2m1s (--cache-sync-timeout 2m0s): list on pods") {
			t.Fatalf("%s: %v", step.name, err)
		}
	}
}

// TestServe: /metrics and /healthz on the address it returns; /healthz
// says why it fails.
func TestServe(t *testing.T) {
	var failing error
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("facet_x 1\n")) })
	addr, err := Serve(ctx, "127.0.0.1:0", metrics, func() error { return failing })
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || body != "facet_x 1\n" {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	failing = context.DeadlineExceeded
	if code, body := get("/healthz"); code != 503 || !strings.Contains(body, "deadline") {
		t.Errorf("failing /healthz: %d %q", code, body)
	}
	if _, err := Serve(ctx, "256.0.0.1:1", metrics, nil); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Errorf("a bad address: %v", err)
	}
}
