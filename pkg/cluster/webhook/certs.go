package webhook

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// CertReloader serves a TLS certificate from a cert and a key file and picks
// up new files without a restart: a Secret volume or cert-manager renewing
// the certificate swaps both files (atomically, through the volume's ..data
// symlink), and the next handshake after that gets the new pair.
//
// On a handshake, at most once per interval, it stats both files; when
// either changed (size, modification time, inode), it loads the pair. A pair
// that does not load (a half-written file, a key that does not match the
// certificate) is logged and the previous certificate stays in use; the
// files are tried again on a later handshake. So a failed rotation never
// takes the webhook down, and a completed one never needs a restart.
type CertReloader struct {
	certFile, keyFile string
	interval          time.Duration
	logger            klog.Logger

	mu        sync.Mutex
	cert      *tls.Certificate
	loadedID  [2]fileID // of the files the current cert came from
	failedID  [2]fileID // of the files that last failed to load
	lastCheck time.Time
	now       func() time.Time
	// reloadErrors counts the times the files could not be looked at or
	// a changed pair did not load (facet_webhook_certificate_reload_errors_total).
	reloadErrors uint64
}

// fileID is what tells a replaced file from the one loaded before.
type fileID struct {
	size    int64
	modTime time.Time
	ino     uint64
}

// NewCertReloader loads the pair once and fails if it cannot: a webhook
// without a certificate must not start. interval bounds how often the files
// are looked at; 0 means on every handshake.
func NewCertReloader(certFile, keyFile string, interval time.Duration, logger klog.Logger) (*CertReloader, error) {
	r := &CertReloader{certFile: certFile, keyFile: keyFile, interval: interval, logger: logger, now: time.Now}
	ids, err := r.stat()
	if err != nil {
		return nil, err
	}
	if err := r.load(ids); err != nil {
		return nil, err
	}
	return r, nil
}

// GetCertificate is for tls.Config.GetCertificate.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.Refresh(), nil
}

// Current returns the certificate in use.
func (r *CertReloader) Current() *tls.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert
}

// Refresh looks at the files as a handshake does (at most once per
// interval) and returns the certificate in use after that, so that a
// scrape of an idle webhook reports a rotation the files already hold.
func (r *CertReloader) Refresh() *tls.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maybeReloadLocked()
	return r.cert
}

// Stale reports whether the files hold a pair that did not load, so that
// an older certificate is served: until the files change again.
func (r *CertReloader) Stale() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failedID != [2]fileID{}
}

// ReloadErrors is the number of times, since start, that a changed pair
// of files did not load, or that the files could not be looked at. A pair
// that does not load counts once (it is not tried again until the files
// change); files that cannot be looked at count at every look.
func (r *CertReloader) ReloadErrors() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadErrors
}

func (r *CertReloader) maybeReloadLocked() {
	now := r.now()
	if r.interval > 0 && now.Sub(r.lastCheck) < r.interval {
		return
	}
	r.lastCheck = now
	ids, err := r.stat()
	if err != nil {
		r.reloadErrors++
		r.logger.Error(err, "Cannot check the TLS files; keeping the current certificate")
		return
	}
	if ids == r.loadedID || ids == r.failedID {
		return
	}
	if err := r.load(ids); err != nil {
		r.reloadErrors++
		r.failedID = ids
		r.logger.Error(err, "Cannot load the new TLS certificate; keeping the current one until the files change again")
	}
}

func (r *CertReloader) stat() ([2]fileID, error) {
	var ids [2]fileID
	for i, f := range []string{r.certFile, r.keyFile} {
		st, err := os.Stat(f)
		if err != nil {
			return ids, fmt.Errorf("TLS file: %w", err)
		}
		ids[i] = fileID{size: st.Size(), modTime: st.ModTime(), ino: inode(st)}
	}
	return ids, nil
}

func (r *CertReloader) load(ids [2]fileID) error {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load TLS certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("parse TLS certificate %s: %w", r.certFile, err)
	}
	cert.Leaf = leaf
	r.cert = &cert
	r.loadedID = ids
	r.failedID = [2]fileID{}
	r.logger.Info("Serving TLS certificate", "file", r.certFile, "subject", leaf.Subject.String(),
		"dnsNames", leaf.DNSNames, "ipAddresses", leaf.IPAddresses, "notAfter", leaf.NotAfter.UTC(), "serial", leaf.SerialNumber.String())
	if time.Now().After(leaf.NotAfter) {
		r.logger.Info("Warning: the TLS certificate has expired; the API server will refuse it", "notAfter", leaf.NotAfter.UTC())
	}
	return nil
}
