// Command facet-mps keeps a node's NVIDIA MPS control daemons, one per GPU
// whose vGPU shares or slots MPS partitions, for the kubelet plugin, which
// asks for them on a unix socket. It runs apart from the plugin so that the
// daemons outlive the plugin's restarts and upgrades. See pkg/node/mps/service
// and docs/mps.md.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/node/mps/service"
)

func main() {
	var f service.Flags
	fs := flag.NewFlagSet("facet-mps", flag.ExitOnError)
	f.AddFlags(fs)
	klog.InitFlags(fs)
	fs.Parse(os.Args[1:])

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	err := service.Main(ctx, f)
	cancel()
	if err != nil {
		logger.Error(err, "facet-mps failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
