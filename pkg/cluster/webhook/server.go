package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/daemon"
)

// HealthzPath answers 200 once the server is up; it needs no client
// certificate and no body, so kubelet probes (scheme HTTPS) can use it.
const HealthzPath = "/healthz"

// ServerOptions configures Serve.
type ServerOptions struct {
	// Address is the TCP address to listen on, e.g. ":8443".
	Address string
	// CertFile and KeyFile are the serving certificate and its key (PEM).
	// They are re-read when they change; see CertReloader.
	CertFile, KeyFile string
	// ReloadInterval bounds how often the files are looked at; 0 means the
	// default of one second.
	ReloadInterval time.Duration
	// ShutdownTimeout bounds the graceful shutdown; 0 means 10 seconds.
	ShutdownTimeout time.Duration
	// Mutator, when set, is served at MutatePath.
	Mutator http.Handler
	// ClaimMutator, when set, is served at MutateClaimsPath.
	ClaimMutator http.Handler
	// MetricsAddr, when set, is the TCP address (e.g. ":8082", the chart's
	// admission.webhook.metricsPort) of a plain HTTP server for /metrics
	// (Metrics) and /healthz, apart from the webhook's HTTPS one so that
	// Prometheus scrapes it without the webhook's CA.
	MetricsAddr string
	// Listening, when set, is called with the bound address once the
	// server accepts connections (for tests that listen on port 0).
	Listening func(net.Addr)
	// MetricsListening, when set, is called with the metrics server's
	// bound address (for tests that listen on port 0).
	MetricsListening func(string)
}

// Serve runs the webhook's HTTPS server until ctx is done, then shuts it
// down gracefully. It serves ValidatePath (AdmissionReviews), MutatePath
// when opts.Mutator is set, MutateClaimsPath when opts.ClaimMutator is set,
// and HealthzPath; and, with opts.MetricsAddr, /metrics over HTTP.
func Serve(ctx context.Context, opts ServerOptions) error {
	logger := klog.FromContext(ctx)
	if opts.CertFile == "" || opts.KeyFile == "" {
		return errors.New("a TLS certificate file and key file are required (the API server only calls webhooks over HTTPS)")
	}
	if opts.ReloadInterval == 0 {
		opts.ReloadInterval = time.Second
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = 10 * time.Second
	}
	certs, err := NewCertReloader(opts.CertFile, opts.KeyFile, opts.ReloadInterval, logger)
	if err != nil {
		return err
	}
	if opts.MetricsAddr != "" {
		addr, err := daemon.Serve(ctx, opts.MetricsAddr, NewMetrics(certs).Handler(), func() error { return nil })
		if err != nil {
			return err
		}
		if opts.MetricsListening != nil {
			opts.MetricsListening(addr)
		}
	}

	mux := http.NewServeMux()
	mux.Handle(ValidatePath, NewHandler(logger))
	if opts.Mutator != nil {
		mux.Handle(MutatePath, opts.Mutator)
	}
	if opts.ClaimMutator != nil {
		mux.Handle(MutateClaimsPath, opts.ClaimMutator)
	}
	mux.HandleFunc(HealthzPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	srv := &http.Server{
		Handler: mux,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: certs.GetCertificate,
		},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          klog.NewStandardLogger("INFO"),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}

	ln, err := net.Listen("tcp", opts.Address)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", opts.Address, err)
	}
	paths := []any{"validate", ValidatePath, "healthz", HealthzPath}
	if opts.Mutator != nil {
		paths = append(paths, "mutate", MutatePath)
	}
	if opts.ClaimMutator != nil {
		paths = append(paths, "mutateClaims", MutateClaimsPath)
	}
	logger.Info("Serving", append([]any{"address", ln.Addr().String()}, paths...)...)
	if opts.Listening != nil {
		opts.Listening(ln.Addr())
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("Shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), opts.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
