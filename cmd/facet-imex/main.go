// Command facet-imex is the IMEX daemon of one ComputeDomain on one node:
// it runs NVIDIA's nvidia-imex with the domain's peers, or with --simulate
// a stand-in, and `facet-imex probe` is its readiness probe. Facet's
// controller runs it as the DaemonSet imex-<domain UID>; see pkg/node/imex
// and docs/design/compute-domains.md.
package main

import (
	"context"
	"os"

	"github.com/facet-gpu/facet/pkg/daemon"
	"github.com/facet-gpu/facet/pkg/node/imex"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		os.Exit(imex.ProbeMain(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
	daemon.MainOf("facet-imex", imex.Main)
}
