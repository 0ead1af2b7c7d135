package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Lease is a leader election of replicas of a Deployment: only the holder
// of the Lease Namespace/Name works.
type Lease struct {
	Namespace, Name string
	// Recorder, when set, raises the Lease's leader Events.
	Recorder resourcelock.EventRecorder
}

// RunLeader runs run while this process holds the Lease, through
// client-go's leaderelection (15s lease, renewed every 10s at the latest,
// retried every 2s; released when ctx ends). It returns nil when ctx
// ends, and an error when the lease is lost while ctx is alive: a replica
// that lost it may hold stale state, and should exit and restart as a
// follower.
func RunLeader(ctx context.Context, client kubernetes.Interface, l Lease, run func(context.Context)) error {
	logger := klog.FromContext(ctx)
	id, err := os.Hostname()
	if err != nil {
		return err
	}
	// Two replicas of one pod name (a restarted pod) must not share an
	// identity.
	id += "_" + time.Now().Format("150405.000000")
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id, EventRecorder: l.Recorder},
	}
	lost := make(chan struct{})
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: l.Name,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: run,
			OnStoppedLeading: func() { close(lost) },
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Another replica leads", "leader", identity, "lease", l.Namespace+"/"+l.Name)
				}
			},
		},
	})
	<-lost
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("lost the leader lease " + l.Namespace + "/" + l.Name)
}

// Serve serves /metrics (metrics) and /healthz (200 "ok" while healthy
// returns nil, else 503 with its error) on addr until ctx ends. It returns
// the address it listens on, and logs it ("Serving metrics and health",
// addr), which a test that asked for port 0 reads.
func Serve(ctx context.Context, addr string, metrics http.Handler, healthy func() error) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	klog.FromContext(ctx).Info("Serving metrics and health", "addr", ln.Addr().String())
	return ln.Addr().String(), nil
}

// SyncHealth is /healthz's view of a controller's informers: unhealthy
// once it has waited longer than Timeout for them to sync (missing list or
// watch rights, an API server that does not answer), so that the kubelet
// restarts the pod rather than keep a leader that never works. A replica
// that does not lead, or whose informers synced, is healthy.
type SyncHealth struct {
	// Timeout: 0 never fails.
	Timeout time.Duration
	// Needs says what the informers need, for the error.
	Needs string
	// Now is the clock; nil: time.Now.
	Now func() time.Time

	mu    sync.Mutex
	since time.Time // zero: not waiting
}

func (h *SyncHealth) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Waiting: the informers started.
func (h *SyncHealth) Waiting() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.since = h.now()
}

// Synced: they synced, or the controller stopped.
func (h *SyncHealth) Synced() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.since = time.Time{}
}

// Check is nil unless the informers have waited past Timeout.
func (h *SyncHealth) Check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.since.IsZero() || h.Timeout <= 0 {
		return nil
	}
	if waited := h.now().Sub(h.since); waited > h.Timeout {
		return fmt.Errorf("the informers have not synced in %s (--cache-sync-timeout %s): %s", waited.Round(time.Second), h.Timeout, h.Needs)
	}
	return nil
}
