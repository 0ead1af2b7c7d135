package computedomain

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/daemon"
)

// Config is facet-controller's command line.
type Config struct {
	// Kube reaches the API server.
	Kube daemon.Kube
	// Namespace is Facet's, where the IMEX DaemonSets go (default
	// $POD_NAMESPACE).
	Namespace string
	// PodTemplate is the IMEX daemons' pod template file.
	PodTemplate string
	// LeaderElect: only the holder of the Lease LeaseNamespace/LeaseName
	// reconciles.
	LeaderElect               bool
	LeaseNamespace, LeaseName string
	// MetricsAddr serves /metrics and /healthz; empty: not served.
	MetricsAddr string
	// CacheSyncTimeout: /healthz fails once the leader has waited this
	// long for its informers.
	CacheSyncTimeout time.Duration
	// Resync: Options.Resync.
	Resync time.Duration
}

// AddFlags defines facet-controller's flags on fs; Complete checks them.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	c.Kube.AddFlags(fs)
	c.Kube.AddRateFlags(fs, 20, 40)
	ns := os.Getenv("POD_NAMESPACE")
	fs.StringVar(&c.Namespace, "namespace", ns, "Facet's namespace, where the IMEX DaemonSets go (default $POD_NAMESPACE)")
	fs.StringVar(&c.PodTemplate, "imex-pod-template", "", "YAML PodTemplateSpec of the IMEX daemons, with a container named imex that runs facet-imex (the chart's ConfigMap); required")
	fs.BoolVar(&c.LeaderElect, "leader-elect", true, "reconcile only while holding the leader Lease (run several replicas)")
	fs.StringVar(&c.LeaseNamespace, "leader-elect-namespace", ns, "namespace of the leader Lease (default $POD_NAMESPACE)")
	fs.StringVar(&c.LeaseName, "leader-elect-name", "facet-controller", "name of the leader Lease")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":8080", "address for /metrics and /healthz; empty: none")
	fs.DurationVar(&c.CacheSyncTimeout, "cache-sync-timeout", 2*time.Minute, "/healthz fails once the controller has waited this long for its informers to sync")
	fs.DurationVar(&c.Resync, "resync", time.Minute, "how often every ComputeDomain is looked at again and the DaemonSets and templates of domains that are gone are deleted")
}

// Complete checks the flags.
func (c *Config) Complete() error {
	if c.Namespace == "" {
		return errors.New("--namespace: required (or $POD_NAMESPACE): where the IMEX DaemonSets go")
	}
	namespaces := [][2]string{{"namespace", c.Namespace}}
	if c.LeaderElect {
		namespaces = append(namespaces, [2]string{"leader-elect-namespace", c.LeaseNamespace})
	}
	for _, f := range namespaces {
		if errs := validation.IsDNS1123Label(f[1]); len(errs) > 0 {
			return fmt.Errorf("--%s=%q: not a namespace name: %v", f[0], f[1], errs)
		}
	}
	if c.PodTemplate == "" {
		return errors.New("--imex-pod-template: required: the IMEX daemons' pod template (the chart mounts it from its ConfigMap)")
	}
	if c.Resync <= 0 {
		return fmt.Errorf("--resync=%s: must be positive", c.Resync)
	}
	return nil
}

// Main runs facet-controller until ctx ends. It checks cfg first
// (Complete): errors name the flag Complete refuses.
func Main(ctx context.Context, cfg Config) error {
	if err := cfg.Complete(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	tpl, err := LoadPodTemplate(cfg.PodTemplate)
	if err != nil {
		return err
	}
	kube := cfg.Kube
	kube.UserAgent = "facet-controller"
	client, dyn, err := kube.Clients()
	if err != nil {
		return err
	}
	metrics := NewMetrics()
	health := &daemon.SyncHealth{Timeout: cfg.CacheSyncTimeout,
		Needs: "facet-controller needs list and watch on computedomains, nodes, resourceclaims, resourceslices, resourceclaimtemplates, and pods and daemonsets in its namespace"}
	if cfg.MetricsAddr != "" {
		if _, err := daemon.Serve(ctx, cfg.MetricsAddr, metrics.Handler(), health.Check); err != nil {
			return err
		}
	}

	// Events name ComputeDomains, which client-go's scheme does not know.
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddServedToScheme(scheme); err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartStructuredLogging(0)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "facet-controller"})

	run := func(ctx context.Context) {
		metrics.SetLeader(true)
		defer metrics.SetLeader(false)
		health.Waiting()
		defer health.Synced()
		c := New(Options{Client: client, Dynamic: dyn, Recorder: recorder, Namespace: cfg.Namespace, PodTemplate: tpl,
			Resync: cfg.Resync, Metrics: metrics, OnSynced: health.Synced})
		if err := c.Run(ctx); err != nil {
			logger.Error(err, "ComputeDomain controller failed")
		}
	}
	if !cfg.LeaderElect {
		run(ctx)
		return nil
	}
	return daemon.RunLeader(ctx, client, daemon.Lease{Namespace: cfg.LeaseNamespace, Name: cfg.LeaseName, Recorder: recorder}, run)
}
