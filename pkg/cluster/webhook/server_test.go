package webhook

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
)

// testCA signs serving certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "facet-webhook-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns PEM cert and key for 127.0.0.1 with the given serial.
func (ca *testCA) issue(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "facet-webhook"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour + time.Duration(serial)*time.Second), // apart per serial, for the expiry metric
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// notAfter is a PEM certificate's NotAfter in Unix seconds.
func notAfter(t *testing.T, certPEM []byte) int64 {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.NotAfter.Unix()
}

// certMetrics scrapes url for the certificate's expiry and reload errors.
func certMetrics(t *testing.T, url string) (expiry int64, reloadErrors int, stale bool) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test's local server
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	e, ok1 := families["facet_webhook_certificate_expiration_timestamp_seconds"]
	r, ok2 := families["facet_webhook_certificate_reload_errors_total"]
	s, ok3 := families["facet_webhook_certificate_stale"]
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("%s lacks the certificate metrics", url)
	}
	return int64(e.GetMetric()[0].GetGauge().GetValue()), int(r.GetMetric()[0].GetCounter().GetValue()), s.GetMetric()[0].GetGauge().GetValue() == 1
}

// writeAtomic replaces path the way a Secret volume update does: a new
// file renamed over the old one.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestNewCertReloaderErrors(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	dir := t.TempDir()
	ca := newTestCA(t)
	certA, _ := ca.issue(t, 10)
	_, keyB := ca.issue(t, 11)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")

	if _, err := NewCertReloader(certFile, keyFile, 0, logger); err == nil || !strings.Contains(err.Error(), "TLS file") {
		t.Errorf("missing files: got %v", err)
	}
	writeAtomic(t, certFile, certA)
	writeAtomic(t, keyFile, keyB)
	if _, err := NewCertReloader(certFile, keyFile, 0, logger); err == nil || !strings.Contains(err.Error(), "load TLS certificate") {
		t.Errorf("mismatched key: got %v", err)
	}
}

// TestServeReloadsCertificate runs the real server over TLS: health, a
// review, a certificate rotation, a broken rotation that must not take the
// server down, and a graceful stop.
func TestServeReloadsCertificate(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	dir := t.TempDir()
	ca := newTestCA(t)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	certA, keyA := ca.issue(t, 100)
	writeAtomic(t, certFile, certA)
	writeAtomic(t, keyFile, keyA)

	addrc := make(chan net.Addr, 1)
	metricsc := make(chan string, 1)
	errc := make(chan error, 1)
	// Serve logs through t: it must have returned before the test ends,
	// however the test ends.
	served := make(chan struct{})
	t.Cleanup(func() { cancel(); <-served })
	go func() {
		defer close(served)
		errc <- Serve(ctx, ServerOptions{
			Address: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile,
			ReloadInterval:   time.Millisecond,
			MetricsAddr:      "127.0.0.1:0",
			Listening:        func(a net.Addr) { addrc <- a },
			MetricsListening: func(a string) { metricsc <- a },
		})
	}()
	var base, metricsURL string
	select {
	case metricsURL = <-metricsc:
		metricsURL = "http://" + metricsURL + "/metrics"
	case err := <-errc:
		t.Fatalf("Serve: %v", err)
	}
	select {
	case a := <-addrc:
		base = "https://" + a.String()
	case err := <-errc:
		t.Fatalf("Serve: %v", err)
	}

	// A fresh connection per call, so every call does a handshake.
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: ca.pool},
		DisableKeepAlives: true,
	}, Timeout: 10 * time.Second}
	get := func(t *testing.T) (serial int64) {
		t.Helper()
		resp, err := client.Get(base + HealthzPath)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
			t.Fatalf("healthz: %d %q", resp.StatusCode, body)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}

	if got := get(t); got != 100 {
		t.Fatalf("serving serial %d, want 100", got)
	}
	expiry, reloadErrors, stale := certMetrics(t, metricsURL)
	if want := notAfter(t, certA); expiry != want || reloadErrors != 0 || stale {
		t.Fatalf("metrics: expiry %d, reload errors %d, stale %v; want %d (certificate A), 0, false", expiry, reloadErrors, stale, want)
	}

	t.Run("review over TLS", func(t *testing.T) {
		resp, err := client.Post(base+ValidatePath, "application/json",
			strings.NewReader(review(request("ResourceClaim", admissionv1.Create, claim(opaque("gpu.facet.dev", badVgpu)), ""))))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"allowed":false`) || !strings.Contains(string(body), "taskPriority: Invalid value: 7") {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	})

	certB, keyB := ca.issue(t, 200)
	t.Run("rotation is picked up without a restart", func(t *testing.T) {
		writeAtomic(t, keyFile, keyB)
		writeAtomic(t, certFile, certB)
		waitUntil(t, "serving the new certificate", func() bool { return get(t) == 200 })
		if got, _, _ := certMetrics(t, metricsURL); got != notAfter(t, certB) {
			t.Errorf("expiry metric %d, want certificate B's NotAfter %d", got, notAfter(t, certB))
		}
	})

	t.Run("a broken rotation keeps the current certificate", func(t *testing.T) {
		writeAtomic(t, keyFile, []byte("not a key"))
		// Not synchronisation: the files are looked at on a handshake at
		// most once per ReloadInterval (1 ms), so let one pass.
		time.Sleep(5 * time.Millisecond)
		for i := 0; i < 3; i++ {
			if got := get(t); got != 200 {
				t.Fatalf("serial %d, want the last good one, 200", got)
			}
		}
		// The pair failed once and is not tried again until it changes.
		if expiry, errs, stale := certMetrics(t, metricsURL); expiry != notAfter(t, certB) || errs != 1 || !stale {
			t.Errorf("metrics after a broken rotation: expiry %d, reload errors %d, stale %v; want certificate B's %d, 1, true", expiry, errs, stale, notAfter(t, certB))
		}
		// The rotation completes: the new pair is served.
		certC, keyC := ca.issue(t, 300)
		writeAtomic(t, certFile, certC)
		writeAtomic(t, keyFile, keyC)
		waitUntil(t, "the completed rotation picked up", func() bool { return get(t) == 300 })
		if _, _, stale := certMetrics(t, metricsURL); stale {
			t.Error("stale after the completed rotation")
		}
	})

	t.Run("a scrape sees a rotation no handshake has picked up", func(t *testing.T) {
		certD, keyD := ca.issue(t, 400)
		writeAtomic(t, keyFile, keyD)
		writeAtomic(t, certFile, certD)
		waitUntil(t, "the expiry metric of certificate D", func() bool {
			got, _, _ := certMetrics(t, metricsURL)
			return got == notAfter(t, certD)
		})
	})

	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Serve returned %v after cancel", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Serve did not stop")
	}
}

func TestServeNeedsCertificate(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	if err := Serve(ctx, ServerOptions{Address: "127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "TLS certificate file and key file are required") {
		t.Fatalf("got %v", err)
	}
}

// waitUntil polls ok until it holds. The bound only turns a hang into a
// failure; nothing here is timed.
func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return ok(), nil
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
