// Command facet-controller is Facet's compute-domain controller: for each
// ComputeDomain (computedomains.gpu.facet.dev) it pins the domain to one
// NVLink fabric clique, writes the channel ResourceClaimTemplate its pods
// use, runs the domain's IMEX daemons (facet-imex) as a DaemonSet on the
// nodes its pods land on, and tears them down when the domain goes. See
// pkg/cluster/computedomain and docs/design/compute-domains.md.
package main

import (
	"github.com/facet-gpu/facet/pkg/cluster/computedomain"
	"github.com/facet-gpu/facet/pkg/daemon"
)

func main() {
	daemon.MainOf("facet-controller", computedomain.Main)
}
