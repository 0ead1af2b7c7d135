package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
	"github.com/facet-gpu/facet/pkg/node/mps"
)

const gpu = "GPU-aaaaaaaa-0000-0000-0000-000000000000"

// node is a simulated driver root and MPS directory on which tests start
// facet-mps servers.
type node struct {
	t         *testing.T
	root, dir string
}

func newNode(t *testing.T) *node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("facet-mps mounts a tmpfs and chroots into the driver root: needs root (CI runs as root)")
	}
	n := &node{t: t, root: t.TempDir(), dir: filepath.Join(t.TempDir(), "mps")}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(n.dir)
		for _, en := range entries {
			b, _ := os.ReadFile(filepath.Join(n.dir, en.Name(), "pipe", "nvidia-cuda-mps-control.pid"))
			var pid int
			if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			_ = syscall.Unmount(filepath.Join(n.dir, en.Name(), "shm"), syscall.MNT_DETACH)
		}
	})
	return n
}

// serve starts a facet-mps on the node until the returned stop is called.
func (n *node) serve() (stop func()) {
	n.t.Helper()
	return n.serveFrom(n.root, "")
}

// serveFrom starts a facet-mps with the driver root root and the host
// root host ("": none) until the returned stop is called.
func (n *node) serveFrom(root, host string) (stop func()) {
	n.t.Helper()
	_, ctx := ktesting.NewTestContext(n.t)
	ctx, cancel := context.WithCancel(ctx)
	s, err := NewServer(Config{Root: root, HostRoot: host, Dir: n.dir, ShmSize: 1 << 20, BootID: "boot-1", ControlPoll: 50 * time.Millisecond})
	if err != nil {
		n.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			n.t.Errorf("facet-mps: %v", err)
		}
	}
}

// TestClient drives a daemon through the socket as the plugin does: Dial
// waits for the driver root to have its control program, a UID conflict
// arrives typed, a facet-mps gone fails the call naming its socket, and a
// restarted one is reported by Check and adopts the daemon on Restore.
func TestClient(t *testing.T) {
	n := newNode(t)
	_, ctx := ktesting.NewTestContext(t)
	stop := n.serve()
	// The driver root is laid out after facet-mps starts (as the
	// simulated node's plugin lays it out): until then Dial does not
	// return a client, and says why; afterwards facet-mps finds the
	// control program by itself.
	if _, err := Dial(ctx, n.dir, 3*time.Second); err == nil || !strings.Contains(err.Error(), "has no MPS control program") {
		t.Fatalf("Dial before the driver root has a control program: %v, want it refused, saying so", err)
	}
	if err := mpssim.WriteRoot(n.root); err != nil {
		t.Fatal(err)
	}
	c, err := Dial(ctx, n.dir, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Acquire(ctx, gpu, "claim-1", 1000); err != nil {
		t.Fatal(err)
	}
	d := c.Daemon(gpu)
	if d == nil || d.PID <= 0 {
		t.Fatalf("no daemon after Acquire: %+v", d)
	}
	var conflict *mps.UserConflictError
	if err := c.Acquire(ctx, gpu, "claim-2", 1001); !errors.As(err, &conflict) || conflict.Served != 1000 || conflict.User != 1001 {
		t.Fatalf("a claim of UID 1001 on UID 1000's daemon: %v, want a *mps.UserConflictError", err)
	}
	if e := c.Edits(gpu, 20); len(e.Mounts) != 2 || e.Mounts[0].HostPath != mps.DirsIn(n.dir, gpu).Pipe {
		t.Fatalf("edits %+v", e)
	}
	if _, err := c.Check(ctx); err != nil {
		t.Fatal(err)
	}

	stop()
	err = c.Acquire(ctx, gpu, "claim-3", 1000)
	if err == nil || !strings.Contains(err.Error(), "facet-mps unreachable at "+filepath.Join(n.dir, SocketName)) {
		t.Fatalf("Acquire with facet-mps gone: %v, want it named unreachable", err)
	}

	stop = n.serve()
	defer stop()
	if _, err := Dial(ctx, n.dir, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(ctx); !errors.Is(err, mps.ErrHoldersLost) {
		t.Fatalf("Check after facet-mps restarted: %v, want ErrHoldersLost", err)
	}
	restarted, err := c.Restore(ctx, map[string]map[types.UID]int64{gpu: {"claim-1": 1000}})
	if err != nil || len(restarted) != 0 {
		t.Fatalf("Restore: restarted %v, %v; want the live daemon adopted", restarted, err)
	}
	if got := c.Daemon(gpu); got == nil || got.PID != d.PID {
		t.Fatalf("daemon %+v after the restart, want %d adopted", got, d.PID)
	}
	if _, err := c.Check(ctx); err != nil {
		t.Fatalf("Check after Restore: %v", err)
	}
	if err := c.Release(ctx, "claim-1"); err != nil {
		t.Fatal(err)
	}
	if got := c.Daemon(gpu); got != nil {
		t.Fatalf("daemon %+v after the last release", got)
	}
}

// TestDriverUnderAPrefix: facet-mps given the host's root (--host-root)
// runs the daemons of a driver under a prefix from there, and says so;
// without it, it serves no MPS and says what is missing.
func TestDriverUnderAPrefix(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hostRoot  bool
		wantError string
	}{
		{name: "with the host's root", hostRoot: true},
		{name: "without it", wantError: "nor from the host's root: none given (facet-mps --host-root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			const prefix = "/home/kubernetes/bin/nvidia"
			if err := mpssim.WritePrefix(n.root, prefix); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(n.root, prefix, mpssim.PrefixLibDir, "libcuda.so.580.159.04"), nil, 0o755); err != nil {
				t.Fatal(err)
			}
			host := ""
			if tc.hostRoot {
				host = n.root
			}
			stop := n.serveFrom(filepath.Join(n.root, prefix), host)
			defer stop()
			_, ctx := ktesting.NewTestContext(t)
			var info *Info
			deadline := time.Now().Add(10 * time.Second)
			for err := errors.New("not asked"); err != nil; info, err = NewClient(n.dir).Info(ctx) {
				if time.Now().After(deadline) {
					t.Fatalf("facet-mps does not answer: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if tc.wantError != "" {
				if info.Control != "" || !strings.Contains(info.ControlError, tc.wantError) {
					t.Fatalf("info %+v, want no control program and an error with %q", info, tc.wantError)
				}
				return
			}
			if info.Control != "/bin/"+mps.ControlName || info.HostRoot != n.root || info.ControlError != "" {
				t.Fatalf("info %+v, want the prefix's /bin/%s run from the host's root %s", info, mps.ControlName, n.root)
			}
			c, err := Dial(ctx, n.dir, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Acquire(ctx, gpu, "claim-1", 1000); err != nil {
				t.Fatal(err)
			}
			d := c.Daemon(gpu)
			if d == nil {
				t.Fatal("no daemon after Acquire")
			}
			if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", d.PID)); err != nil || root != n.root {
				t.Errorf("daemon's root %q (%v), want the host's %s", root, err, n.root)
			}
			if err := c.Release(ctx, "claim-1"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOneServerPerDirectory: a second facet-mps on a directory fails.
func TestOneServerPerDirectory(t *testing.T) {
	n := newNode(t)
	stop := n.serve()
	defer stop()
	_, ctx := ktesting.NewTestContext(t)
	// The first one holds the lock once it listens.
	deadline := time.Now().Add(10 * time.Second)
	for _, err := NewClient(n.dir).Info(ctx); err != nil; _, err = NewClient(n.dir).Info(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("the first facet-mps does not answer: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s, err := NewServer(Config{Root: n.root, Dir: n.dir, ShmSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "another facet-mps serves") {
		t.Fatalf("second facet-mps: %v", err)
	}
}

// BenchmarkAcquireOverSocket times what a prepare of a share pays for
// facet-mps being a process of its own: one Acquire of a GPU whose daemon
// runs, over the unix socket. Run: go test ./pkg/node/mps/service -run '^$'
// -bench . -benchtime 200x
func BenchmarkAcquireOverSocket(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	n := &node{root: b.TempDir(), dir: filepath.Join(b.TempDir(), "mps")}
	if err := mpssim.WriteRoot(n.root); err != nil {
		b.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(b)
	sctx, cancel := context.WithCancel(ctx)
	s, err := NewServer(Config{Root: n.root, Dir: n.dir, ShmSize: 1 << 20, BootID: "boot-1"})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = s.Run(sctx); close(done) }()
	defer func() { cancel(); <-done }()
	c, err := Dial(ctx, n.dir, 30*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Acquire(ctx, gpu, "claim-0", 0); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Release(ctx, "claim-0") }()
	i := 0
	for b.Loop() {
		i++
		if err := c.Acquire(ctx, gpu, types.UID(fmt.Sprintf("claim-%d", i%40+1)), 0); err != nil {
			b.Fatal(err)
		}
	}
	for j := 1; j <= 40; j++ {
		_ = c.Release(ctx, types.UID(fmt.Sprintf("claim-%d", j)))
	}
}
