// Package probes serves the kubelet plugin's liveness and readiness probes
// (and its metrics) over HTTP, on TCP or a unix socket, and asks them for
// the plugin's exec probe (facet-kubeletplugin --probe).
package probes

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
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/facet-gpu/facet/pkg/model/names"
)

// Checker serves the plugin's probes, like the upstream example driver's
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
type Checker struct {
	// RegistrarSocket and DRASocket are the paths of the plugin's unix
	// sockets (Sockets).
	RegistrarSocket, DRASocket string
	// Registered reports the kubelet's registration (the helper's
	// RegistrationStatus); nil until known.
	Registered func() *registerapi.RegistrationStatus
	// SlicesPublished is true once the API server has held all the slices
	// (SlicesPublished).
	SlicesPublished func(context.Context) (bool, error)
	// Timeout bounds each probe's gRPC calls.
	Timeout time.Duration
	// Metrics serves /metrics; none when nil.
	Metrics http.Handler
}

// Live returns nil if both sockets answer (the /healthz check).
func (h *Checker) Live(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.Timeout)
	defer cancel()
	reg, err := dialUnix(h.RegistrarSocket)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	defer reg.Close()
	info, err := registerapi.NewRegistrationClient(reg).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("registration socket %s: GetInfo: %w", h.RegistrarSocket, err)
	}
	if info.Name != names.Driver {
		return fmt.Errorf("registration socket %s: driver %q, want %q", h.RegistrarSocket, info.Name, names.Driver)
	}
	dra, err := dialUnix(h.DRASocket)
	if err != nil {
		return fmt.Errorf("DRA socket: %w", err)
	}
	defer dra.Close()
	// An empty request: prepares nothing, proves the service answers.
	if _, err := drapb.NewDRAPluginClient(dra).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		return fmt.Errorf("DRA socket %s: NodePrepareResources: %w", h.DRASocket, err)
	}
	return nil
}

// Ready returns nil if the plugin is live, registered with the kubelet,
// and its slices are published (the /readyz check).
func (h *Checker) Ready(ctx context.Context) error {
	if err := h.Live(ctx); err != nil {
		return err
	}
	st := h.Registered()
	if st == nil {
		return errors.New("not registered with the kubelet yet")
	}
	if !st.PluginRegistered {
		return fmt.Errorf("the kubelet refused the registration: %s", st.Error)
	}
	ok, err := h.SlicesPublished(ctx)
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

// Handler serves /healthz, /readyz and, with Metrics, /metrics.
func (h *Checker) Handler() http.Handler {
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
	mux.Handle("/healthz", probe(h.Live))
	mux.Handle("/readyz", probe(h.Ready))
	if h.Metrics != nil {
		mux.Handle("/metrics", h.Metrics)
	}
	return mux
}

// SlicesPublished returns a check that is true once the API server holds at least want of
// this node's slices of the driver; it stays true after (the slice
// controller keeps them, and a re-list per probe would load the API server
// for nothing).
func SlicesPublished(client kubernetes.Interface, node string, want int) func(context.Context) (bool, error) {
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

// Serve serves h on addr (host:port, or unix:<path>) until ctx ends. A
// stale unix socket file is replaced; an address in use is an error.
func Serve(ctx context.Context, addr string, h *Checker) error {
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
		Handler:           h.Handler(),
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
	klog.FromContext(ctx).Info("Serving health probes", "addr", ln.Addr().String(), "liveness", "/healthz", "readiness", "/readyz", "metrics", h.Metrics != nil)
	return nil
}

// Sockets returns the paths of the kubelet plugin helper's registration
// and DRA sockets under the kubelet's registrar and plugins directories;
// with rolling updates (a pod UID) their names hold the UID
// (kubeletplugin.RollingUpdate).
func Sockets(registrarDir, pluginsDir, podUID string) (registrar, dra string) {
	uidPart := ""
	if podUID != "" {
		uidPart = "-" + podUID
	}
	return filepath.Join(registrarDir, names.Driver+uidPart+"-reg.sock"),
		filepath.Join(pluginsDir, names.Driver, "dra"+uidPart+".sock")
}

// Ask asks the health server at addr for path (/healthz or /readyz) and
// returns nil if it answers ok: `facet-kubeletplugin --probe=/readyz`, the
// chart's exec probe where the plugin shares the host's network. There two
// pods of a rolling update cannot both hold a TCP port, so each serves its
// probes on a unix socket in its own container's file system.
func Ask(ctx context.Context, addr, path string, timeout time.Duration) error {
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
