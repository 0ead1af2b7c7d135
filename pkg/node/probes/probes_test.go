package probes

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/facet-gpu/facet/pkg/model/names"
)

type fakeRegistrar struct {
	registerapi.UnimplementedRegistrationServer
	name string
}

func (f *fakeRegistrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: f.name}, nil
}

type fakeDRA struct {
	drapb.UnimplementedDRAPluginServer
	calls atomic.Int32
}

func (f *fakeDRA) NodePrepareResources(context.Context, *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	f.calls.Add(1)
	return &drapb.NodePrepareResourcesResponse{}, nil
}

// serveUnix serves a gRPC server on a unix socket until the test ends (or
// the returned stop is called).
func serveUnix(t *testing.T, path string, register func(*grpc.Server)) (stop func()) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return srv.Stop
}

func probe(t *testing.T, h *Checker, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

func TestHealthProbes(t *testing.T) {
	// Unix socket paths are short (108 bytes): not t.TempDir().
	dir, err := os.MkdirTemp("", "facet-health-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	reg, dra := filepath.Join(dir, "reg.sock"), filepath.Join(dir, "dra.sock")

	var status atomic.Pointer[registerapi.RegistrationStatus]
	client := fake.NewClientset()
	h := &Checker{
		RegistrarSocket: reg, DRASocket: dra,
		Registered:      status.Load,
		SlicesPublished: SlicesPublished(client, "node-1", 2),
		Timeout:         2 * time.Second,
	}

	if code, body := probe(t, h, "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "registration socket") {
		t.Errorf("no sockets: /healthz %d %q", code, body)
	}

	serveUnix(t, reg, func(s *grpc.Server) {
		registerapi.RegisterRegistrationServer(s, &fakeRegistrar{name: "other.example.com"})
	})
	d := &fakeDRA{}
	stopDRA := serveUnix(t, dra, func(s *grpc.Server) { drapb.RegisterDRAPluginServer(s, d) })
	if code, body := probe(t, h, "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"other.example.com"`) {
		t.Errorf("another driver's registration socket: /healthz %d %q", code, body)
	}

	// The right driver now.
	os.Remove(reg)
	serveUnix(t, reg, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, &fakeRegistrar{name: names.Driver}) })
	if code, body := probe(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("sockets answer: /healthz %d %q", code, body)
	}
	if d.calls.Load() == 0 {
		t.Error("/healthz did not call NodePrepareResources on the DRA socket")
	}
	if code, body := probe(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not registered") {
		t.Errorf("before registration: /readyz %d %q", code, body)
	}
	status.Store(&registerapi.RegistrationStatus{PluginRegistered: false, Error: "version mismatch"})
	if code, body := probe(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "version mismatch") {
		t.Errorf("registration refused: /readyz %d %q", code, body)
	}
	status.Store(&registerapi.RegistrationStatus{PluginRegistered: true})
	if code, body := probe(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not all published") {
		t.Errorf("no slices: /readyz %d %q", code, body)
	}
	for _, s := range []struct{ name, node string }{{"a", "node-1"}, {"b", "node-2"}, {"c", "node-1"}} {
		slice := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: s.name},
			Spec:       resourceapi.ResourceSliceSpec{Driver: names.Driver, NodeName: &s.node},
		}
		if _, err := client.ResourceV1().ResourceSlices().Create(context.Background(), slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if code, body := probe(t, h, "/readyz"); code != http.StatusOK || body != "ok" {
		t.Errorf("registered and published: /readyz %d %q", code, body)
	}

	// A wedged or gone DRA server fails both probes.
	stopDRA()
	os.Remove(dra)
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body := probe(t, h, p); code != http.StatusServiceUnavailable || !strings.Contains(body, "DRA socket") {
			t.Errorf("DRA socket gone: %s %d %q", p, code, body)
		}
	}
}

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	h := &Checker{RegistrarSocket: "/nonexistent/reg.sock", DRASocket: "/nonexistent/dra.sock", Timeout: time.Second}
	if err := Serve(ctx, addr, h); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/healthz without sockets: %d", resp.StatusCode)
	}
	if err := Serve(ctx, addr, h); err == nil {
		t.Error("a second server on the same address started")
	}
}

// TestHealthOnUnixSocket: --health-addr=unix:<path> serves the probes on a
// unix socket (a stale file from an earlier run is replaced), and --probe's
// Ask passes on an ok answer and fails on any other.
func TestHealthOnUnixSocket(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "facet-health-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "health.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	reg, dra := filepath.Join(dir, "reg.sock"), filepath.Join(dir, "dra.sock")
	var status atomic.Pointer[registerapi.RegistrationStatus]
	h := &Checker{RegistrarSocket: reg, DRASocket: dra, Registered: status.Load, Timeout: time.Second,
		SlicesPublished: func(context.Context) (bool, error) { return true, nil }}
	addr := "unix:" + sock
	if err := Ask(ctx, addr, "/healthz", time.Second); err == nil {
		t.Fatal("Ask passed with no server")
	}
	if err := Serve(ctx, addr, h); err != nil {
		t.Fatal(err)
	}
	if err := Ask(ctx, addr, "/healthz", time.Second); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("no plugin sockets: Ask /healthz = %v, want a 503", err)
	}
	serveUnix(t, reg, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, &fakeRegistrar{name: names.Driver}) })
	serveUnix(t, dra, func(s *grpc.Server) { drapb.RegisterDRAPluginServer(s, &fakeDRA{}) })
	if err := Ask(ctx, addr, "/healthz", time.Second); err != nil {
		t.Errorf("sockets answer: Ask /healthz = %v", err)
	}
	if err := Ask(ctx, addr, "/readyz", time.Second); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Errorf("unregistered: Ask /readyz = %v", err)
	}
	status.Store(&registerapi.RegistrationStatus{PluginRegistered: true})
	if err := Ask(ctx, addr, "/readyz", time.Second); err != nil {
		t.Errorf("registered: Ask /readyz = %v", err)
	}
}
