// Command facet-preemptor evicts lower-priority pods for pods whose
// ResourceClaims for Facet's devices cannot be allocated, which the
// kube-scheduler does not do for DRA claims through Kubernetes 1.37
// (KEP-5690). See pkg/preempt and docs/preemption.md.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/preempt/controller"
)

func main() {
	var cfg controller.Config
	var mode, gates string
	fs := flag.NewFlagSet("facet-preemptor", flag.ExitOnError)
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig; default: the in-cluster service account")
	fs.StringVar(&cfg.FeatureGates, "feature-gates", "", "the kube-scheduler's DRA gates where they differ from the API server's (DRAPartitionableDevices=true,...); applied over what /metrics says")
	fs.StringVar(&mode, "scheduler-preempts-claims", string(controller.SchedulerAuto), "auto (read the API server's feature gates), true (the kube-scheduler preempts for DRA claims: stay idle) or false (it does not: preempt)")
	fs.StringVar(&gates, "scheduler-preemption-gates", strings.Join(controller.SchedulerPreemptionGates, ","), "feature gates that give the kube-scheduler DRA preemption, for auto")
	fs.BoolVar(&cfg.LeaderElect, "leader-elect", true, "preempt only while holding the leader Lease (run several replicas)")
	fs.StringVar(&cfg.LeaseNamespace, "leader-elect-namespace", envOr("POD_NAMESPACE", "default"), "namespace of the leader Lease")
	fs.StringVar(&cfg.LeaseName, "leader-elect-name", "facet-preemptor", "name of the leader Lease")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", ":8080", "address for /metrics and /healthz; empty: none")
	fs.DurationVar(&cfg.Timeout, "preemption-timeout", 2*time.Minute, "how long one preemption may take, from the evictions to the preemptor scheduled, before it is given up")
	fs.DurationVar(&cfg.Backoff, "backoff", 10*time.Second, "first wait before preempting again for a pod whose preemption did not get it scheduled; doubles each time")
	fs.DurationVar(&cfg.MaxBackoff, "max-backoff", 5*time.Minute, "longest such wait")
	fs.DurationVar(&cfg.Resync, "resync", 10*time.Second, "how often every pending pod is looked at again")
	klog.InitFlags(fs)
	fs.Parse(os.Args[1:])

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	var err error
	if cfg.SchedulerPreempts, err = controller.ParseSchedulerMode(mode); err == nil {
		for _, g := range strings.Split(gates, ",") {
			if g = strings.TrimSpace(g); g != "" {
				cfg.PreemptionGates = append(cfg.PreemptionGates, g)
			}
		}
		err = controller.Main(ctx, cfg)
	}
	cancel()
	if err != nil {
		logger.Error(err, "facet-preemptor failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
