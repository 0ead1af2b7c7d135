// Package daemon is the start-up every Facet daemon (facet-kubeletplugin,
// facet-webhook, facet-preemptor, facet-controller, facet-imex, facet-mps)
// shares: klog's flags, the API client from --kubeconfig or the in-cluster
// service account, and a main that runs until SIGINT or SIGTERM and exits
// 1 on an error. One place, so that the chart's -v, --kubeconfig and
// --kube-api-qps mean the same to each daemon, and a fix to one reaches
// them all.
package daemon

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// AddLogFlags registers klog's flags (-v, --vmodule, --logtostderr, ...)
// on fs. klog's own, not component-base/logs': the daemons have always
// taken these names, and the chart passes -v.
func AddLogFlags(fs *flag.FlagSet) {
	klog.InitFlags(fs)
}

// Main is a daemon's main: it parses the command line with the flags
// addFlags registers and klog's, and runs run as Run does. It does not
// return when the flags are wrong (exit 2), -h is asked for (exit 0) or
// run fails (exit 1).
func Main(name string, addFlags func(*flag.FlagSet), run func(context.Context) error) {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	addFlags(fs)
	AddLogFlags(fs)
	// ExitOnError: Parse prints the error or the usage and exits 2, or 0
	// for -h.
	_ = fs.Parse(os.Args[1:])
	Run(name, run)
}

// MainOf is Main for a daemon whose command line is a type F, whose
// AddFlags registers its flags: it parses them into an F and runs run
// with it, e.g. MainOf("facet-imex", imex.Main). run gets F once the
// flags are parsed, and checks what they say itself.
func MainOf[F any, P interface {
	*F
	AddFlags(*flag.FlagSet)
}](name string, run func(context.Context, F) error) {
	var f F
	Main(name, P(&f).AddFlags, func(ctx context.Context) error { return run(ctx, f) })
}

// Run runs run with a context that SIGINT and SIGTERM cancel and that
// carries klog's logger. When run fails, Run logs the error as name's and
// exits 1; otherwise it flushes the log and returns.
func Run(name string, run func(context.Context) error) {
	if err := runLogged(name, run); err != nil {
		// No defer anywhere above: os.Exit would skip it.
		os.Exit(1)
	}
}

// runLogged is Run but for the exit.
func runLogged(name string, run func(context.Context) error) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	logger := klog.Background()
	err := run(klog.NewContext(ctx, logger))
	cancel()
	if err != nil {
		logger.Error(err, name+" failed")
	}
	klog.Flush()
	return err
}

// Kube is how a daemon reaches the API server.
type Kube struct {
	// Kubeconfig is a kubeconfig file; empty: the in-cluster service
	// account.
	Kubeconfig string
	// QPS and Burst limit the client's requests; 0: client-go's defaults
	// (5 and 10).
	QPS   float64
	Burst int
	// UserAgent names the daemon to the API server (its audit log, API
	// Priority and Fairness); empty: client-go's, from the binary's name.
	UserAgent string
}

// AddFlags registers --kubeconfig.
func (k *Kube) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&k.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty: the in-cluster service account")
}

// AddRateFlags registers --kube-api-qps and --kube-api-burst with these
// defaults, for a daemon whose requests client-go's defaults would throttle.
func (k *Kube) AddRateFlags(fs *flag.FlagSet, qps float64, burst int) {
	fs.Float64Var(&k.QPS, "kube-api-qps", qps, "queries per second to the API server")
	fs.IntVar(&k.Burst, "kube-api-burst", burst, "burst of queries to the API server")
}

// Config is k's client configuration.
func (k Kube) Config() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if k.Kubeconfig != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig); err != nil {
			return nil, fmt.Errorf("API client: --kubeconfig %s: %w", k.Kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("API client: no --kubeconfig, and %w", err)
	}
	cfg.QPS, cfg.Burst = float32(k.QPS), k.Burst
	if k.UserAgent != "" {
		cfg.UserAgent = k.UserAgent
	}
	return cfg, nil
}

// Client is k's client.
func (k Kube) Client() (kubernetes.Interface, error) {
	cfg, err := k.Config()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// Clients are k's typed and dynamic clients, of one configuration: the
// dynamic one reads ComputeDomains, a kind client-go's typed client does
// not know. Errors: Config's, or a configuration a client refuses.
func (k Kube) Clients() (kubernetes.Interface, dynamic.Interface, error) {
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
