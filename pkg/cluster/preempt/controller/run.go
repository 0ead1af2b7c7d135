package controller

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/cluster/fit"
	"github.com/facet-gpu/facet/pkg/cluster/preempt"
	"github.com/facet-gpu/facet/pkg/daemon"
	"github.com/facet-gpu/facet/pkg/model/features"
)

// Config is facet-preemptor's command line.
type Config struct {
	// Kube reaches the API server: --kubeconfig, or the in-cluster
	// service account.
	Kube daemon.Kube
	// FeatureGates override the DRA gates read from the API server, for a
	// kube-scheduler that runs others (features.ParseOverrides syntax).
	FeatureGates string
	// SchedulerPreempts is auto, true or false (StepAside).
	SchedulerPreempts SchedulerMode
	// PreemptionGates are the gates that give the scheduler DRA preemption.
	PreemptionGates []string
	// LeaderElect: only the holder of the Lease LeaseNamespace/LeaseName
	// preempts.
	LeaderElect               bool
	LeaseNamespace, LeaseName string
	// MetricsAddr serves /metrics and /healthz; empty: not served.
	MetricsAddr string
	// CacheSyncTimeout: /healthz fails once the preemption controller
	// has waited this long for its informers (missing list or watch
	// rights, an API server that does not answer), so that the kubelet
	// restarts the pod rather than leave a leader that never preempts.
	CacheSyncTimeout time.Duration
	// Timeout, Backoff, MaxBackoff, Resync: see Options.
	Timeout, Backoff, MaxBackoff, Resync time.Duration
	// ProtectedNamespaces: their pods are never evicted. Complete adds
	// POD_NAMESPACE, where the preemptor (and Facet) runs; kube-system is
	// always protected (preempt.Protection).
	ProtectedNamespaces []string
	// MaxEvictionsPerMinute: see Options; 0 is no cap.
	MaxEvictionsPerMinute int
	// ObserveOnly: see Options.
	ObserveOnly bool

	mode, gates, protected string
}

// AddFlags defines facet-preemptor's flags on fs; Complete checks them.
func (c *Config) AddFlags(fs *flag.FlagSet) {
	c.Kube.AddFlags(fs)
	fs.StringVar(&c.FeatureGates, "feature-gates", "", "the kube-scheduler's DRA gates where they differ from the API server's (DRAPartitionableDevices=true,...); applied over what its /metrics says")
	fs.StringVar(&c.mode, "scheduler-preempts-claims", string(SchedulerAuto), "auto (read the API server's feature gates), true (the kube-scheduler preempts for DRA claims: stay idle) or false (it does not: preempt)")
	fs.StringVar(&c.gates, "scheduler-preemption-gates", strings.Join(SchedulerPreemptionGates, ","), "feature gates that give the kube-scheduler DRA preemption, for auto")
	fs.BoolVar(&c.LeaderElect, "leader-elect", true, "preempt only while holding the leader Lease (run several replicas)")
	fs.StringVar(&c.LeaseNamespace, "leader-elect-namespace", envOr("POD_NAMESPACE", "default"), "namespace of the leader Lease")
	fs.StringVar(&c.LeaseName, "leader-elect-name", "facet-preemptor", "name of the leader Lease")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":8080", "address for /metrics and /healthz; empty: none")
	fs.DurationVar(&c.CacheSyncTimeout, "cache-sync-timeout", 2*time.Minute, "/healthz fails once the preemption controller has waited this long for its informers to sync")
	fs.DurationVar(&c.Timeout, "preemption-timeout", 2*time.Minute, "how long one preemption may take, from the evictions to the preemptor scheduled, before it is given up")
	fs.DurationVar(&c.Backoff, "backoff", 10*time.Second, "first wait before preempting again for a pod whose preemption did not get it scheduled; doubles each time")
	fs.DurationVar(&c.MaxBackoff, "max-backoff", 5*time.Minute, "longest such wait")
	fs.DurationVar(&c.Resync, "resync", 10*time.Second, "how often every pending pod is looked at again")
	fs.IntVar(&c.MaxEvictionsPerMinute, "max-evictions-per-minute", 10, "evictions the preemptor may make a minute, all preemptions together (up to this many at once, then refilled at this rate); a preemption whose victims do not fit waits; 0: no cap")
	fs.BoolVar(&c.ObserveOnly, "observe-only", false, "decide and raise the Events (\"would evict\") and metrics, but evict nothing: to see what preemption would do before letting it")
	fs.StringVar(&c.protected, "protected-namespaces", "", "comma-separated namespaces whose pods are never evicted, besides kube-system and the preemptor's own (POD_NAMESPACE), which always are")
}

// Complete checks the flags and fills what they imply.
func (c *Config) Complete() error {
	var err error
	if c.SchedulerPreempts, err = ParseSchedulerMode(c.mode); err != nil {
		return err
	}
	c.PreemptionGates = nil
	for _, g := range strings.Split(c.gates, ",") {
		if g = strings.TrimSpace(g); g != "" {
			c.PreemptionGates = append(c.PreemptionGates, g)
		}
	}
	if c.FeatureGates != "" {
		if _, err := features.ParseOverrides(c.FeatureGates); err != nil {
			return err
		}
	}
	if c.MaxEvictionsPerMinute < 0 {
		return fmt.Errorf("--max-evictions-per-minute=%d: must be 0 (no cap) or more", c.MaxEvictionsPerMinute)
	}
	c.ProtectedNamespaces = nil
	// Facet's own pods (the kubelet plugin, the webhook, this preemptor)
	// keep the GPUs usable at all: never trade them for one pod.
	for _, ns := range append(strings.Split(c.protected, ","), os.Getenv("POD_NAMESPACE")) {
		if ns = strings.TrimSpace(ns); ns != "" && !slices.Contains(c.ProtectedNamespaces, ns) {
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return fmt.Errorf("--protected-namespaces: %q is no namespace name: %s", ns, strings.Join(errs, "; "))
			}
			c.ProtectedNamespaces = append(c.ProtectedNamespaces, ns)
		}
	}
	for name, d := range map[string]time.Duration{"preemption-timeout": c.Timeout, "backoff": c.Backoff, "max-backoff": c.MaxBackoff, "resync": c.Resync} {
		if d <= 0 {
			return fmt.Errorf("--%s=%s: must be positive", name, d)
		}
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Main runs facet-preemptor until ctx ends. It completes cfg first
// (Complete): errors name the flag Complete refuses.
func Main(ctx context.Context, cfg Config) error {
	if err := cfg.Complete(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	kube := cfg.Kube
	kube.UserAgent = "facet-preemptor"
	client, err := kube.Client()
	if err != nil {
		return err
	}
	metrics := NewMetrics()
	metrics.SetObserveOnly(cfg.ObserveOnly)
	if cfg.ObserveOnly {
		logger.Info("Observe-only: every decision is made and raised as Events, nothing is evicted", "flag", "--observe-only")
	}
	health := &daemon.SyncHealth{Timeout: cfg.CacheSyncTimeout,
		Needs: "facet-preemptor needs list and watch on pods, nodes, resourceclaims, resourceslices and deviceclasses"}
	if cfg.MetricsAddr != "" {
		if _, err := daemon.Serve(ctx, cfg.MetricsAddr, metrics.Handler(), health.Check); err != nil {
			return err
		}
	}

	protection := preempt.Protection{Namespaces: map[string]bool{}}
	for _, ns := range cfg.ProtectedNamespaces {
		protection.Namespaces[ns] = true
	}
	logger.Info("Pods never evicted", "namespaces", append([]string{metav1.NamespaceSystem}, cfg.ProtectedNamespaces...), "also", "DaemonSet pods, static pods")
	var overrides features.Overrides
	if cfg.FeatureGates != "" {
		if overrides, err = features.ParseOverrides(cfg.FeatureGates); err != nil {
			return err
		}
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartStructuredLogging(0)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "facet-preemptor"})

	// act preempts with the gates of the read that decided it should:
	// one read answers both questions, whether the scheduler preempts for
	// claims and which DRA features the allocator runs with.
	act := func(ctx context.Context, gates map[string]bool, gatesErr error) {
		set := features.FromGates(gates, "API server /metrics")
		if gatesErr != nil {
			// Where the gates cannot be read, all on is right wherever the
			// scheduler and the API server agree: the API server drops the
			// fields of a gate that is off from slices and claims, and the
			// allocator then has nothing gated to enforce.
			set = features.AllOn("assumed: " + gatesErr.Error())
		}
		if cfg.FeatureGates != "" {
			set = set.Apply(overrides)
		}
		logger.Info("Allocator features", "gates", set.String())
		metrics.SetActive(true)
		defer metrics.SetActive(false)
		health.Waiting()
		defer health.Synced()
		c := New(Options{
			OnSynced: health.Synced,
			Client:   client, Recorder: recorder, Metrics: metrics, Features: fit.FeaturesOf(set), Protection: protection,
			Timeout: cfg.Timeout, Backoff: cfg.Backoff, MaxBackoff: cfg.MaxBackoff, Resync: cfg.Resync,
			MaxEvictionsPerMinute: cfg.MaxEvictionsPerMinute, ObserveOnly: cfg.ObserveOnly,
		})
		if err := c.Run(ctx); err != nil {
			logger.Error(err, "Preemption controller failed")
		}
	}
	read := func(ctx context.Context) (map[string]bool, error) { return features.ServerGates(ctx, client) }
	run := func(ctx context.Context) {
		Supervise(ctx, cfg.SchedulerPreempts, cfg.PreemptionGates, read, SchedulerRecheck, metrics, act)
	}
	if !cfg.LeaderElect {
		run(ctx)
		return nil
	}
	// A replica that lost its lease may hold stale in-flight state:
	// RunLeader's error exits it, and the Deployment restarts it as a
	// follower.
	return daemon.RunLeader(ctx, client, daemon.Lease{Namespace: cfg.LeaseNamespace, Name: cfg.LeaseName, Recorder: recorder}, run)
}
