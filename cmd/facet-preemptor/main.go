// Command facet-preemptor evicts lower-priority pods for pods whose
// ResourceClaims for Facet's devices cannot be allocated, which the
// kube-scheduler does not do for DRA claims through Kubernetes 1.37
// (KEP-5690). See pkg/cluster/preempt and docs/preemption.md.
package main

import (
	"github.com/facet-gpu/facet/pkg/cluster/preempt/controller"
	"github.com/facet-gpu/facet/pkg/daemon"
)

func main() {
	daemon.MainOf("facet-preemptor", controller.Main)
}
