package imex

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/facet-gpu/facet/pkg/daemon"
)

// DefaultStateDir is --state-dir's default, the run's and the probe's.
const DefaultStateDir = "/run/facet-imex"

// Flags are facet-imex's command line.
type Flags struct {
	Options
	Kube daemon.Kube
}

// AddFlags registers the flags on fs.
func (f *Flags) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.Namespace, "domain-namespace", "", "the ComputeDomain's namespace (required)")
	fs.StringVar(&f.Name, "domain-name", "", "the ComputeDomain's name (required)")
	fs.StringVar(&f.UID, "domain-uid", "", "the ComputeDomain's metadata.uid (required): a domain of that name with another UID is not this daemon's")
	fs.StringVar(&f.Node, "node-name", "", "this node's name, as the domain's status.nodes names it (required; the DaemonSet passes spec.nodeName)")
	fs.StringVar(&f.StateDir, "state-dir", DefaultStateDir, "directory of nvidia-imex's configuration ("+ConfigName+"), the peer list ("+NodesName+") and the state `facet-imex probe` reads ("+StateName+")")
	fs.BoolVar(&f.Simulate, "simulate", false, "run the stand-in: no nvidia-imex; ready when the peer list holds spec.numNodes entries, this node's among them, no index twice")
	fs.StringVar(&f.DriverRoot, "driver-root", "/driver-root", "the host's driver root as this process sees it; nvidia-imex and nvidia-imex-ctl run chrooted into it, or, for a driver under a prefix of its own, into --host-root")
	fs.StringVar(&f.HostRoot, "host-root", "", "the host's / as this process sees it, for a driver under a prefix (as facet-mps's --host-root); empty: none")
	f.Kube.AddFlags(fs)
}

// validate checks the flags; errors name them.
func (f *Flags) validate() error {
	var errs []error
	for _, r := range []struct{ flag, value string }{
		{"--domain-namespace", f.Namespace}, {"--domain-name", f.Name}, {"--domain-uid", f.UID}, {"--node-name", f.Node}, {"--state-dir", f.StateDir},
	} {
		if r.value == "" {
			errs = append(errs, fmt.Errorf("%s is required", r.flag))
		}
	}
	if f.Namespace != "" {
		for _, msg := range validation.IsDNS1123Label(f.Namespace) {
			errs = append(errs, fmt.Errorf("--domain-namespace %q: %s", f.Namespace, msg))
		}
	}
	if f.Name != "" {
		for _, msg := range validation.IsDNS1123Subdomain(f.Name) {
			errs = append(errs, fmt.Errorf("--domain-name %q: %s", f.Name, msg))
		}
	}
	return errors.Join(errs...)
}

// Main runs facet-imex with f until ctx ends. Its API client is
// --kubeconfig's, else $KUBECONFIG's (as kubectl's), else the pod's
// service account; it only reads its ComputeDomain.
func Main(ctx context.Context, f Flags) error {
	if err := f.validate(); err != nil {
		return err
	}
	if f.Kube.Kubeconfig == "" {
		f.Kube.Kubeconfig = os.Getenv("KUBECONFIG")
	}
	f.Kube.UserAgent = "facet-imex"
	cfg, err := f.Kube.Config()
	if err != nil {
		return err
	}
	mb := NewMailbox()
	if err := Watch(ctx, cfg, f.Namespace, f.Name, mb); err != nil {
		return err
	}
	return NewDaemon(f.Options).Run(ctx, mb)
}
