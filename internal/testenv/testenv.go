// Package testenv holds the helpers Facet's end-to-end and chart tests share
// (test/e2e and the test/helm module): polling with a deadline, and
// processes that are stopped when the test ends.
package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// WaitFor polls cond every 250 ms until it reports true, failing t after
// timeout with the last error cond gave.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, lastErr)
}

// StartProcess runs name with args, its output in logPath, and stops it
// when t ends: SIGTERM, then SIGKILL after 15 s.
func StartProcess(t testing.TB, logPath, name string, args ...string) *exec.Cmd {
	t.Helper()
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer logFile.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return cmd
}

// StartWebhook runs facet-webhook (bin) on a free loopback port with the
// given serving certificate, waits until its /healthz answers over TLS
// verified against caPEM, and returns its host:port. It stops with t.
// extra flags come after the defaults, so they may override -v.
func StartWebhook(t testing.TB, bin, logPath, certFile, keyFile string, caPEM []byte, extra ...string) string {
	t.Helper()
	// A free port: bind, read it, release.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	StartProcess(t, logPath, bin, append([]string{"--bind-address", addr, "--tls-cert-file", certFile, "--tls-private-key-file", keyFile, "-v", "2"}, extra...)...)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	WaitFor(t, "facet-webhook healthz", 30*time.Second, func() (bool, error) {
		resp, err := client.Get("https://" + addr + "/healthz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("status %d", resp.StatusCode)
	})
	return addr
}

// ClaimPod is the manifest of a pod that sleeps in the local node's busybox
// image (hostNetwork: the node has only a loopback CNI) with one claim,
// called claim, made from the ResourceClaimTemplate template. It runs as
// UID 0, said explicitly (runAsUser): MPS partitions the shares only of
// pods whose UID is known (docs/mps.md).
func ClaimPod(name, namespace, claim, template string) string {
	return ClaimsPod(name, namespace, PodClaim{Name: claim, Template: template})
}

// PodClaim is one of a pod's claims: its name in the pod and the
// ResourceClaimTemplate it is made from.
type PodClaim struct{ Name, Template string }

// ClaimsPod is ClaimPod with several claims, which its one container uses
// all of (a ComputeDomain's pod: its GPUs and its IMEX channel).
func ClaimsPod(name, namespace string, claims ...PodClaim) string {
	var uses, from []string
	for _, c := range claims {
		uses = append(uses, fmt.Sprintf("{name: %s}", c.Name))
		from = append(from, fmt.Sprintf("  - {name: %s, resourceClaimTemplateName: %s}", c.Name, c.Template))
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 0}
  containers:
  - name: c
    image: facet.local/busybox:1
    imagePullPolicy: Never
    command: ["sleep", "86400"]
    resources: {claims: [%s]}
  resourceClaims:
%s
`, name, namespace, strings.Join(uses, ", "), strings.Join(from, "\n"))
}

// ParseFlags parses a daemon's command line, args, with the flags add
// registers and klog's -v (which the chart passes), failing t where they
// do not parse: the args a chart renders, read by the binary's own flags.
func ParseFlags(t testing.TB, name string, add func(*flag.FlagSet), args []string) {
	t.Helper()
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	add(fs)
	if fs.Lookup("v") == nil {
		fs.Int("v", 0, "klog verbosity")
	}
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
}

// WantError checks err against want, a part of the error message, or no
// error where want is empty, failing t otherwise. It reports whether an
// error was wanted, where a table's case ends.
func WantError(t testing.TB, err error, want string) bool {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatal(err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("error %v, want one with %q", err, want)
	}
	return want != ""
}
