package helmtest

import (
	"fmt"
	"testing"
)

// TestPortClash: a host-network port of a chart's pod must not be one that
// another round's node listens on at some offset, and every port the
// chart's live tests use passes.
func TestPortClash(t *testing.T) {
	for _, tc := range []struct {
		def   int
		clash int // the node port it meets; 0: none
	}{
		{def: 9443, clash: 6443},   // the API server at offset 3000
		{def: 11250, clash: 10250}, // the kubelet at offset 1000
		{def: 12680, clash: 10680}, // add-node's 4th node's plugin port
		{def: 8445, clash: 9445},   // at offset 1000, Kueue's webhook of the round at offset 0
		{def: 9543},                // the webhook's test port
		{def: 9581},                // the webhook's metrics test port
		{def: 8090},                // facet-controller's metrics
	} {
		p, ok := clashingNodePort(tc.def)
		if ok != (tc.clash != 0) || p != tc.clash {
			t.Errorf("clashingNodePort(%d) = %d, %v; want %d", tc.def, p, ok, tc.clash)
		}
	}
	l := &Live{}
	t.Setenv("FACET_PORT_OFFSET", "2000")
	if got := l.Port(t, 9543); got != 11543 {
		t.Errorf("Port(9543) at offset 2000 = %d, want 11543", got)
	}
	if got := l.APIServerPort(); got != 8443 {
		t.Errorf("APIServerPort at offset 2000 = %d, want 8443", got)
	}
	rec := &fatalRecorder{TB: t}
	l.Port(rec, 9443)
	if rec.msg == "" {
		t.Error("Port(9443) did not fail the test")
	}
}

// fatalRecorder records a Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }
