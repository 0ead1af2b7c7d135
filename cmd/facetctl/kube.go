package main

import (
	"flag"
	"os"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

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

// clients are the typed and the dynamic client of the cluster k names: the
// dynamic one reads ComputeDomains, a kind client-go's typed client does
// not know.
func clients(k *daemon.Kube) (kubernetes.Interface, dynamic.Interface, error) {
	cfg, err := k.Config()
	if err != nil {
		return nil, nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	return client, dyn, nil
}
