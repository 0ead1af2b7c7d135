package sim

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// TestHealthFaults injects each kind of fault into a simulated DGX H100
// and checks what nvmlgpu.Library.WatchHealth reports: the same code path a
// real node's plugin runs.
func TestHealthFaults(t *testing.T) {
	faults := filepath.Join(t.TempDir(), FaultFileName)
	// A fault from before the library opened is not delivered again.
	if _, err := InjectFault(faults, 8, Fault{GPU: 5, Kind: FaultXID, XID: 48}); err != nil {
		t.Fatal(err)
	}
	lib, node := discoverMachine(t, "dgx-h100", WithFaultFile(faults))
	var uuids []string
	for _, g := range node.GPUs {
		uuids = append(uuids, g.UUID)
	}

	var mu sync.Mutex
	var got []nvmlgpu.HealthEvent
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- lib.WatchHealth(ctx, uuids, 50*time.Millisecond, func(ev nvmlgpu.HealthEvent) {
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchHealth: %v", err)
		}
	}()
	// wait returns the first fault (not Healthy) on gpu after mark.
	wait := func(gpu string, mark int) (nvmlgpu.HealthEvent, int) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute) // only turns a hang into a failure
		for time.Now().Before(deadline) {
			mu.Lock()
			for i := mark; i < len(got); i++ {
				if got[i].GPU == gpu && !got[i].Healthy {
					ev := got[i]
					mu.Unlock()
					return ev, i + 1
				}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("no fault reported on %s", gpu)
		return nvmlgpu.HealthEvent{}, 0
	}
	mark := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	healthyAfter := func(gpu string, m int) bool {
		mu.Lock()
		defer mu.Unlock()
		for i := m; i < len(got); i++ {
			if got[i].GPU == gpu && got[i].Healthy {
				return true
			}
		}
		return false
	}

	tests := []struct {
		name   string
		fault  Fault
		reason string
		fatal  bool
	}{
		{"fatal XID", Fault{GPU: 1, Kind: FaultXID, XID: 79}, "xid-79", true},
		{"recoverable XID", Fault{GPU: 2, Kind: FaultXID, XID: 92}, "xid-92", false},
		{"double-bit ECC", Fault{GPU: 3, Kind: FaultECC}, "ecc-dbe", true},
		// Its XID 79 event and its failing probe race; either is right.
		{"lost GPU", Fault{GPU: 4, Kind: FaultLost}, "xid-79|gpu-lost", true},
		{"failing query", Fault{GPU: 6, Kind: FaultQuery}, "nvml-query-failed", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := mark()
			if _, err := InjectFault(faults, len(uuids), tc.fault); err != nil {
				t.Fatal(err)
			}
			ev, _ := wait(uuids[tc.fault.GPU], m)
			if !strings.Contains("|"+tc.reason+"|", "|"+ev.Reason+"|") || ev.Fatal != tc.fatal {
				t.Errorf("got %s fatal=%v (%s), want %s fatal=%v", ev.Reason, ev.Fatal, ev.Detail, tc.reason, tc.fatal)
			}
		})
	}
	// A lost GPU keeps failing its probes until reset, with the fatal
	// gpu-lost; clearing it (a reset) makes it answer again.
	m := mark()
	ev, m := wait(uuids[4], m)
	if ev.Reason == "xid-79" {
		ev, _ = wait(uuids[4], m)
	}
	if ev.Reason != "gpu-lost" || !ev.Fatal {
		t.Errorf("lost GPU probe: got %s fatal=%v, want gpu-lost fatal", ev.Reason, ev.Fatal)
	}
	if err := lib.ProbeGPU(uuids[4]); err == nil || !strings.Contains(err.Error(), "fallen off the bus") {
		t.Errorf("ProbeGPU of a lost GPU: %v", err)
	}
	if n, err := ClearFaults(faults, 4); err != nil || n != 1 {
		t.Fatalf("ClearFaults: %d, %v", n, err)
	}
	if err := lib.ProbeGPU(uuids[4]); err != nil {
		t.Errorf("ProbeGPU after reset: %v", err)
	}
	m = mark()
	deadline := time.Now().Add(2 * time.Minute) // only turns a hang into a failure
	for !healthyAfter(uuids[4], m) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !healthyAfter(uuids[4], m) {
		t.Error("no healthy probe after the lost GPU was reset")
	}
	// An application XID never makes a GPU unhealthy; the next fault on
	// the same GPU is the one reported.
	m = mark()
	if _, err := InjectFault(faults, len(uuids), Fault{GPU: 0, Kind: FaultXID, XID: 13}); err != nil {
		t.Fatal(err)
	}
	if _, err := InjectFault(faults, len(uuids), Fault{GPU: 0, Kind: FaultXID, XID: 119}); err != nil {
		t.Fatal(err)
	}
	if ev, _ := wait(uuids[0], m); ev.Reason != "xid-119" {
		t.Errorf("after an application XID: got %s, want xid-119", ev.Reason)
	}
	// The fault injected before the library opened was never reported.
	mu.Lock()
	for _, ev := range got {
		if ev.GPU == uuids[5] && !ev.Healthy {
			t.Errorf("replayed an event from before the start: %+v", ev)
		}
	}
	mu.Unlock()
}

func TestInjectFaultErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), FaultFileName)
	tests := []struct {
		fault Fault
		want  string
	}{
		{Fault{GPU: 0, Kind: FaultXID}, "needs its XID"},
		{Fault{GPU: 0, Kind: FaultECC, XID: 48}, "takes no XID"},
		{Fault{GPU: 0, Kind: "melt"}, "unknown fault kind"},
		{Fault{GPU: 8, Kind: FaultLost}, "has 8 GPUs"},
	}
	for _, tc := range tests {
		if _, err := InjectFault(path, 8, tc.fault); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error containing %q", tc.fault, err, tc.want)
		}
	}
	// Sequence numbers survive clearing.
	a, _ := InjectFault(path, 8, Fault{GPU: 0, Kind: FaultLost})
	if _, err := ClearFaults(path, -1); err != nil {
		t.Fatal(err)
	}
	b, _ := InjectFault(path, 8, Fault{GPU: 0, Kind: FaultLost})
	if b.Seq <= a.Seq {
		t.Errorf("Seq reused after clearing: %d then %d", a.Seq, b.Seq)
	}
}
