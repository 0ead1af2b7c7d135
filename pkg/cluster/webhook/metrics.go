package webhook

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are facet-webhook's, on a registry of its own, read from its
// CertReloader at scrape time:
//
//   - facet_webhook_certificate_expiration_timestamp_seconds (gauge): the
//     serving certificate's NotAfter, in seconds since the Unix epoch, as
//     cert-manager's certmanager_certificate_expiration_timestamp_seconds.
//     With tls.mode selfSigned only a helm upgrade renews the certificate,
//     and an expired one fails every claim with a Facet config (the
//     webhook's failurePolicy Fail), so this is what alerts ahead of that.
//   - facet_webhook_certificate_stale (gauge): 1 while the files hold a
//     pair that did not load (a key that does not match the certificate,
//     bad PEM), so that the webhook serves the certificate it had
//     (CertReloader), else 0.
//   - facet_webhook_certificate_reload_errors_total (counter): rotations
//     whose files did not load, or files that could not be looked at.
type Metrics struct {
	reg *prometheus.Registry
}

// NewMetrics reports certs' certificate. A scrape looks at the files as a
// handshake does (CertReloader.Refresh), so the expiry is that of the
// files' certificate even when no handshake came since they changed.
func NewMetrics(certs *CertReloader) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "facet", Subsystem: "webhook", Name: "certificate_expiration_timestamp_seconds",
			Help: "NotAfter of the serving certificate in use, in seconds since the Unix epoch."},
			func() float64 { return float64(certs.Refresh().Leaf.NotAfter.Unix()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "facet", Subsystem: "webhook", Name: "certificate_stale",
			Help: "1 while the TLS files hold a certificate and key that did not load, so that an older certificate is served (the log says why), else 0."},
			func() float64 {
				if certs.Refresh(); certs.Stale() {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "facet", Subsystem: "webhook", Name: "certificate_reload_errors_total",
			Help: "Changed TLS files that did not load, or TLS files that could not be looked at; the webhook keeps its certificate (the log says why)."},
			func() float64 { return float64(certs.ReloadErrors()) }),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}
