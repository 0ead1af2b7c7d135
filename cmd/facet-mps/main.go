// Command facet-mps keeps a node's NVIDIA MPS control daemons, one per GPU
// whose vGPU shares or slots MPS partitions, for the kubelet plugin, which
// asks for them on a unix socket. It runs apart from the plugin so that the
// daemons outlive the plugin's restarts and upgrades. See pkg/node/mps/service
// and docs/mps.md.
package main

import (
	"github.com/facet-gpu/facet/pkg/daemon"
	"github.com/facet-gpu/facet/pkg/node/mps/service"
)

func main() {
	daemon.MainOf("facet-mps", service.Main)
}
