package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/facet-gpu/facet/pkg/names"
)

// health serves the plugin's probes, like the upstream example driver's
// health check (dra-example-driver's cmd/dra-example-kubeletplugin/health.go),
// over HTTP:
//
//	/healthz (liveness): the registration socket answers GetInfo with this
//	  driver's name, and the DRA socket answers NodePrepareResources.
//	/readyz (readiness): that, and the kubelet has registered the plugin,
//	  and the API server holds all of this node's ResourceSlices.
//
// The gRPC calls go through the same unix sockets the kubelet uses, so a
// wedged server or a socket file removed from under the plugin shows up.
type health struct {
	registrarSocket, draSocket string
	// registered reports the kubelet's registration (the helper's
	// RegistrationStatus); nil until known.
	registered func() *registerapi.RegistrationStatus
	// slicesPublished is true once the API server has held all the slices.
	slicesPublished func(context.Context) (bool, error)
	timeout         time.Duration
	// metrics serves /metrics; none when nil.
	metrics http.Handler
}

func (h *health) live(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	reg, err := dialUnix(h.registrarSocket)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	defer reg.Close()
	info, err := registerapi.NewRegistrationClient(reg).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("registration socket %s: GetInfo: %w", h.registrarSocket, err)
	}
	if info.Name != names.Driver {
		return fmt.Errorf("registration socket %s: driver %q, want %q", h.registrarSocket, info.Name, names.Driver)
	}
	dra, err := dialUnix(h.draSocket)
	if err != nil {
		return fmt.Errorf("DRA socket: %w", err)
	}
	defer dra.Close()
	// An empty request: prepares nothing, proves the service answers.
	if _, err := drapb.NewDRAPluginClient(dra).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		return fmt.Errorf("DRA socket %s: NodePrepareResources: %w", h.draSocket, err)
	}
	return nil
}

func (h *health) ready(ctx context.Context) error {
	if err := h.live(ctx); err != nil {
		return err
	}
	st := h.registered()
	if st == nil {
		return errors.New("not registered with the kubelet yet")
	}
	if !st.PluginRegistered {
		return fmt.Errorf("the kubelet refused the registration: %s", st.Error)
	}
	ok, err := h.slicesPublished(ctx)
	if err != nil {
		return fmt.Errorf("ResourceSlices: %w", err)
	}
	if !ok {
		return errors.New("ResourceSlices not all published yet")
	}
	return nil
}

func dialUnix(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func (h *health) handler() http.Handler {
	mux := http.NewServeMux()
	probe := func(check func(context.Context) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if err := check(r.Context()); err != nil {
				klog.FromContext(r.Context()).V(2).Info("Probe failed", "path", r.URL.Path, "err", err)
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		}
	}
	mux.Handle("/healthz", probe(h.live))
	mux.Handle("/readyz", probe(h.ready))
	if h.metrics != nil {
		mux.Handle("/metrics", h.metrics)
	}
	return mux
}

// slicesPublishedFunc is true once the API server holds at least want of
// this node's slices of the driver; it stays true after (the slice
// controller keeps them, and a re-list per probe would load the API server
// for nothing).
func slicesPublishedFunc(client kubernetes.Interface, node string, want int) func(context.Context) (bool, error) {
	var seen atomic.Bool
	sel := fields.Set{"spec.driver": names.Driver, "spec.nodeName": node}.AsSelector().String()
	return func(ctx context.Context) (bool, error) {
		if seen.Load() {
			return true, nil
		}
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		if len(list.Items) >= want {
			seen.Store(true)
		}
		return seen.Load(), nil
	}
}

// healthNetwork splits --health-addr: "unix:<path>" is a unix socket,
// anything else a TCP address.
func healthNetwork(addr string) (network, address string) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return "unix", path
	}
	return "tcp", addr
}

// serveHealth serves h on addr until ctx ends.
func serveHealth(ctx context.Context, addr string, h *health) error {
	network, address := healthNetwork(addr)
	if network == "unix" {
		// Left by an earlier run of this container.
		_ = os.Remove(address)
	}
	ln, err := net.Listen(network, address)
	if err != nil {
		return fmt.Errorf("--health-addr: %w", err)
	}
	srv := &http.Server{
		Handler:           h.handler(),
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Health server failed")
		}
	}()
	klog.FromContext(ctx).Info("Serving health probes", "addr", ln.Addr().String(), "liveness", "/healthz", "readiness", "/readyz", "metrics", h.metrics != nil)
	return nil
}

// startHealth serves the probes and metrics (package metrics) on
// f.healthAddr (none when empty), for the helper's sockets and the want
// slices of this node.
func startHealth(ctx context.Context, f flags, helper *kubeletplugin.Helper, client kubernetes.Interface, want int, metrics http.Handler) error {
	if f.healthAddr == "" {
		return nil
	}
	// The helper's socket names; with rolling updates they hold the pod
	// UID (kubeletplugin.RollingUpdate).
	uidPart := ""
	if f.podUID != "" {
		uidPart = "-" + f.podUID
	}
	return serveHealth(ctx, f.healthAddr, &health{
		registrarSocket: filepath.Join(f.registrarDir, names.Driver+uidPart+"-reg.sock"),
		draSocket:       filepath.Join(f.pluginsDir, names.Driver, "dra"+uidPart+".sock"),
		registered:      helper.RegistrationStatus,
		slicesPublished: slicesPublishedFunc(client, f.nodeName, want),
		timeout:         5 * time.Second,
		metrics:         metrics,
	})
}

// askHealth asks the health server at addr for path (/healthz or /readyz) and
// returns nil if it answers ok: `facet-kubeletplugin --probe=/readyz`, the
// chart's exec probe where the plugin shares the host's network. There two
// pods of a rolling update cannot both hold a TCP port, so each serves its
// probes on a unix socket in its own container's file system.
func askHealth(ctx context.Context, addr, path string, timeout time.Duration) error {
	network, address := healthNetwork(addr)
	var d net.Dialer
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, address)
		}},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://facet-kubeletplugin"+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s on %s: %w", path, addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s on %s: %s: %s", path, addr, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
