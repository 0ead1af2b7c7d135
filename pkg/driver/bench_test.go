package driver

import (
	"fmt"
	"testing"
)

// BenchmarkPrepareUnprepare is the driver's own share of NodePrepareResources
// (checkpoint writes with fsync, CDI spec), without gRPC or the API server.
func BenchmarkPrepareUnprepare(b *testing.B) {
	r := newRig(b)
	for i := 0; b.Loop(); i++ {
		c := claim(fmt.Sprintf("b%d", i), "gpu-1")
		if err := r.prepare(c)[c.UID].Err; err != nil {
			b.Fatal(err)
		}
		if err := r.unprepare(c.UID)[c.UID]; err != nil {
			b.Fatal(err)
		}
	}
}
