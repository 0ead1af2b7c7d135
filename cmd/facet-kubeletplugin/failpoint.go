//go:build facet_failpoints

package main

import (
	"context"
	"os"

	"k8s.io/klog/v2"
)

// failpointsCompiled tells tests which build this is.
const failpointsCompiled = true

// failpoint returns the hook named by $FACET_FAILPOINT: when prepare or
// unprepare reaches that point the plugin logs it and hangs, so an
// end-to-end test can SIGKILL it there. Only binaries built with
// -tags facet_failpoints (bin/failpoints/, for test/e2e) have it.
func failpoint(ctx context.Context) func(string) {
	name := os.Getenv("FACET_FAILPOINT")
	if name == "" {
		return nil
	}
	klog.FromContext(ctx).Info("Test failpoint armed", "name", name)
	return func(at string) {
		if at == name {
			klog.FromContext(ctx).Info("Failpoint reached; hanging until killed", "name", name)
			klog.Flush()
			select {}
		}
	}
}
