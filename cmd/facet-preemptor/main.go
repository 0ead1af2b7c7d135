// Command facet-preemptor evicts lower-priority pods for pods whose
// ResourceClaims for Facet's devices cannot be allocated, which the
// kube-scheduler does not do for DRA claims through Kubernetes 1.37
// (KEP-5690). See pkg/cluster/preempt and docs/preemption.md.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/cluster/preempt/controller"
)

func main() {
	var cfg controller.Config
	fs := flag.NewFlagSet("facet-preemptor", flag.ExitOnError)
	cfg.AddFlags(fs)
	klog.InitFlags(fs)
	fs.Parse(os.Args[1:])

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	err := cfg.Complete()
	if err == nil {
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
