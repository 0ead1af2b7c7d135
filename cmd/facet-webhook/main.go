// Command facet-webhook is Facet's validating admission webhook: it refuses
// ResourceClaims, ResourceClaimTemplates and DeviceClasses whose opaque
// config for gpu.facet.dev the kubelet plugin would refuse (see pkg/webhook).
// It serves HTTPS only; the certificate and key files are re-read when they
// change.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/webhook"
)

func main() {
	var opts webhook.ServerOptions
	fs := flag.NewFlagSet("facet-webhook", flag.ExitOnError)
	fs.StringVar(&opts.Address, "bind-address", ":8443", "address to serve HTTPS on")
	fs.StringVar(&opts.CertFile, "tls-cert-file", "", "serving certificate (PEM), re-read when it changes; required")
	fs.StringVar(&opts.KeyFile, "tls-private-key-file", "", "serving certificate's private key (PEM), re-read when it changes; required")
	fs.DurationVar(&opts.ReloadInterval, "tls-reload-interval", time.Second, "how often, at most, to look for a new certificate (on a TLS handshake)")
	klog.InitFlags(fs)
	fs.Parse(os.Args[1:])

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	ctx = klog.NewContext(ctx, klog.Background())
	err := webhook.Serve(ctx, opts)
	cancel()
	if err != nil {
		klog.FromContext(ctx).Error(err, "facet-webhook failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}
