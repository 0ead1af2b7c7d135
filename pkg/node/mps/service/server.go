package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/pkg/node/mps"
)

// Config configures facet-mps.
type Config struct {
	// Root is the driver root as facet-mps sees it (the chart mounts the
	// host's at /driver-root, or, where it is not /, the host's / at
	// /host and passes the driver root under it).
	Root string
	// HostRoot is the host's / as facet-mps sees it, "" if it has none:
	// the daemons of a driver under a prefix run chrooted there
	// (mps.Locate).
	HostRoot string
	// Dir is the MPS directory, the same path on the host and here
	// (mps.Options.Dir); the socket is Dir/SocketName.
	Dir string
	// ShmSize is each GPU's /dev/shm tmpfs in bytes (mps.Options.ShmSize).
	ShmSize int64
	// BootID is this boot's ID (mps.Options.BootID).
	BootID string
	// StopTimeout bounds a daemon's start and stop (mps.Options).
	StopTimeout time.Duration
	// ControlPoll is how often, while the driver root has no control
	// program, it is looked for again. Default 5 s.
	ControlPoll time.Duration
}

// Server serves an mps.Manager, made once the driver root has the control
// program.
type Server struct {
	cfg      Config
	instance string

	mu      sync.Mutex
	mgr     *mps.Manager
	control string
	// hostRoot is the host's root the daemons run from, when the
	// driver is under a prefix.
	hostRoot   string
	controlErr error
}

// NewServer checks the configuration; Run serves.
func NewServer(cfg Config) (*Server, error) {
	if !filepath.IsAbs(cfg.Root) || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("--driver-root %q and --mps-dir %q must be absolute paths", cfg.Root, cfg.Dir)
	}
	if cfg.HostRoot != "" && !filepath.IsAbs(cfg.HostRoot) {
		return nil, fmt.Errorf("--host-root %q must be an absolute path", cfg.HostRoot)
	}
	if cfg.ShmSize <= 0 {
		return nil, fmt.Errorf("--shm-size %d: must be positive", cfg.ShmSize)
	}
	if cfg.ControlPoll <= 0 {
		cfg.ControlPoll = 5 * time.Second
	}
	return &Server{cfg: cfg, instance: strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(os.Getpid())}, nil
}

// manager returns the Manager, making it when the control program has
// appeared; nil and why while it has not.
func (s *Server) manager() (*mps.Manager, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mgr != nil {
		return s.mgr, nil
	}
	l, err := mps.Locate(s.cfg.Root, s.cfg.HostRoot)
	if err == nil {
		s.mgr, err = mps.New(mps.Options{Root: l.Root, Control: l.Control, LibraryPath: l.LibraryPath, Dir: s.cfg.Dir, ShmSize: s.cfg.ShmSize, BootID: s.cfg.BootID, StopTimeout: s.cfg.StopTimeout})
	}
	if err == nil {
		// The program's path in the driver root, as the plugin and the
		// probe report it; under a prefix, the host's root it runs from.
		s.control = strings.TrimPrefix(l.Control, strings.TrimSuffix(l.Prefix, "/"))
		if l.Prefix != "/" {
			s.hostRoot = l.Root
		}
	}
	s.controlErr = err
	return s.mgr, err
}

// Run serves on Dir/SocketName until ctx ends. Only one facet-mps may
// serve a directory: a second fails at once (a lock file beside the
// socket). The daemons are left running when it returns: they go with
// facet-mps's container, not with its serving.
func (s *Server) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if err := os.MkdirAll(s.cfg.Dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(s.cfg.Dir, "facet-mps.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("another facet-mps serves %s (its lock file is held): %w", s.cfg.Dir, err)
	}
	sock := filepath.Join(s.cfg.Dir, SocketName)
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		return err
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	// The plugin's pods run as root; nobody else may drive the daemons.
	if err := os.Chmod(sock, 0o600); err != nil {
		return err
	}
	if _, err := s.manager(); err != nil {
		logger.Error(err, "No MPS control program yet; looking again", "every", s.cfg.ControlPoll)
		go func() {
			_ = wait.PollUntilContextCancel(ctx, s.cfg.ControlPoll, false, func(context.Context) (bool, error) {
				_, err := s.manager()
				return err == nil, nil
			})
			if _, err := s.manager(); err == nil {
				logger.Info("Found the MPS control program; serving MPS control daemons", "root", s.cfg.Root, "hostRoot", s.hostRootNow(), "dir", s.cfg.Dir, "socket", sock)
			}
		}()
	} else {
		logger.Info("Serving MPS control daemons", "control", s.control, "root", s.cfg.Root, "hostRoot", s.hostRootNow(), "dir", s.cfg.Dir, "shmSize", s.cfg.ShmSize, "socket", sock)
	}
	srv := &http.Server{Handler: s.Handler(ctx), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// hostRootNow is the host's root the daemons run from, "" when they run
// in the driver root.
func (s *Server) hostRootNow() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostRoot
}

// Handler is the API; each request's work runs under base's logger.
func (s *Server) Handler(base context.Context) http.Handler {
	logger := klog.FromContext(base)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		_, err := s.manager()
		info := Info{Instance: s.instance, Root: s.cfg.Root, Dir: s.cfg.Dir, ShmSize: s.cfg.ShmSize}
		s.mu.Lock()
		info.Control = s.control
		info.HostRoot = s.hostRoot
		s.mu.Unlock()
		if err != nil {
			info.ControlError = err.Error()
		}
		s.reply(w, http.StatusOK, info)
	})
	mux.HandleFunc("POST /v1/acquire", func(w http.ResponseWriter, r *http.Request) {
		var req acquireRequest
		m, ok := s.decode(w, r, &req)
		if !ok {
			return
		}
		s.replyDone(w, m.Acquire(klog.NewContext(r.Context(), logger), req.GPU, req.Claim, req.User))
	})
	mux.HandleFunc("POST /v1/release", func(w http.ResponseWriter, r *http.Request) {
		var req releaseRequest
		m, ok := s.decode(w, r, &req)
		if !ok {
			return
		}
		s.replyDone(w, m.Release(klog.NewContext(r.Context(), logger), req.Claim))
	})
	mux.HandleFunc("POST /v1/restore", func(w http.ResponseWriter, r *http.Request) {
		var req restoreRequest
		m, ok := s.decode(w, r, &req)
		if !ok {
			return
		}
		s.reply(w, http.StatusOK, restarted(m.Restore(klog.NewContext(r.Context(), logger), req.Holders)))
	})
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		m, ok := s.decode(w, r, nil)
		if !ok {
			return
		}
		s.reply(w, http.StatusOK, restarted(m.Check(klog.NewContext(r.Context(), logger))))
	})
	mux.HandleFunc("GET /v1/daemon", func(w http.ResponseWriter, r *http.Request) {
		m, ok := s.decode(w, r, nil)
		if !ok {
			return
		}
		s.reply(w, http.StatusOK, daemonResponse{Daemon: m.Daemon(r.URL.Query().Get("gpu"))})
	})
	return mux
}

// decode reads a request's JSON body into into (nil: none) and returns the
// Manager; it answers the request itself when it fails.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, into any) (*mps.Manager, bool) {
	m, err := s.manager()
	if err != nil {
		s.reply(w, http.StatusServiceUnavailable, errorResponse{Error: "facet-mps: " + err.Error()})
		return nil, false
	}
	if into != nil {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(into); err != nil {
			s.reply(w, http.StatusBadRequest, errorResponse{Error: "facet-mps: request body: " + err.Error()})
			return nil, false
		}
	}
	return m, true
}

// replyDone answers a request whose work returned err: 409 Conflict with
// the holders for a *mps.UserConflictError (Acquire's refusal), 500 for
// any other error, 200 with an empty object for none.
func (s *Server) replyDone(w http.ResponseWriter, err error) {
	var conflict *mps.UserConflictError
	switch {
	case errors.As(err, &conflict):
		s.reply(w, http.StatusConflict, errorResponse{Error: err.Error(), Conflict: conflict})
	case err != nil:
		s.reply(w, http.StatusInternalServerError, errorResponse{Error: err.Error()})
	default:
		s.reply(w, http.StatusOK, struct{}{})
	}
}

func (s *Server) reply(w http.ResponseWriter, code int, body any) {
	w.Header().Set(instanceHeader, s.instance)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
