package main

import (
	"flag"
	"os"

	"github.com/facet-gpu/facet/pkg/daemon"
)

// kubeFlag registers a command's --kubeconfig, $KUBECONFIG by default as
// kubectl's, and returns what reaches the cluster it names: every command
// that reads the cluster builds its client as the daemons do.
func kubeFlag(fs *flag.FlagSet) *daemon.Kube {
	k := &daemon.Kube{}
	fs.StringVar(&k.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster (default $KUBECONFIG)")
	return k
}
