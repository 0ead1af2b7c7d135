package imex

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/facet-gpu/facet/api/gpu.facet.dev/v1alpha1"
	"github.com/facet-gpu/facet/pkg/node/driverroot"
)

// envFakeChild makes the test binary a stand-in nvidia-imex that appends
// "started", "SIGUSR1" and "SIGTERM" lines to the file it names.
const envFakeChild = "FACET_IMEX_TEST_FAKE_CHILD"

func TestMain(m *testing.M) {
	if log := os.Getenv(envFakeChild); log != "" {
		os.Exit(fakeChild(log))
	}
	os.Exit(m.Run())
}

func fakeChild(log string) int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM)
	note := func(s string) {
		f, err := os.OpenFile(log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, s)
			f.Close()
		}
	}
	note("started")
	for s := range sigs {
		if s == syscall.SIGTERM {
			note("SIGTERM")
			return 0
		}
		note("SIGUSR1")
	}
	return 0
}

// harness runs a Daemon on a fake clock.
type harness struct {
	t        *testing.T
	dir      string
	childLog string
	clock    *testingclock.FakeClock
	mb       *Mailbox
	cancel   context.CancelFunc
	errc     chan error
}

const reloadEvery = 5 * time.Second

// start runs d (its StateDir set here) until the test ends.
func start(t *testing.T, d *Daemon) *harness {
	t.Helper()
	h := &harness{t: t, dir: t.TempDir(), clock: testingclock.NewFakeClock(time.Unix(1_700_000_000, 0)), mb: NewMailbox(), errc: make(chan error, 1)}
	h.childLog = filepath.Join(h.dir, "child.log")
	d.opts.StateDir = filepath.Join(h.dir, "state")
	d.clock, d.reloadInterval = h.clock, reloadEvery
	_, ctx := ktesting.NewTestContext(t)
	ctx, h.cancel = context.WithCancel(ctx)
	go func() { h.errc <- d.Run(ctx, h.mb) }()
	t.Cleanup(func() {
		h.cancel()
		// A test that read Run's error put nil back.
		if err := <-h.errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

// fakeIMEX runs a Daemon whose nvidia-imex is this test binary
// (fakeChild).
func fakeIMEX(t *testing.T, node string) *harness {
	d := NewDaemon(Options{Namespace: "ml", Name: "train", UID: testUID, Node: node})
	var h *harness
	d.locate = func(Options) (driverroot.Layout, driverroot.Layout, error) {
		l := driverroot.Layout{Root: "/", Path: os.Args[0], Prefix: "/"}
		return l, l, nil
	}
	d.command = func(driverroot.Layout) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envFakeChild+"="+h.childLog)
		return cmd
	}
	h = start(t, d)
	return h
}

// waitState waits for the state file to satisfy ok and returns it.
func (h *harness) waitState(what string, ok func(State) bool) State {
	h.t.Helper()
	var last State
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		s, err := ReadState(filepath.Join(h.dir, "state"))
		if err != nil {
			return false, nil
		}
		last = s
		return ok(s), nil
	})
	if err != nil {
		h.t.Fatalf("waiting for %s: last state %+v", what, last)
	}
	return last
}

// childLines waits for the fake child's log to hold n lines of kind and
// returns all its lines.
func (h *harness) childLines(kind string, n int) []string {
	h.t.Helper()
	var lines []string
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		b, _ := os.ReadFile(h.childLog)
		lines = strings.Fields(string(b))
		c := 0
		for _, l := range lines {
			if l == kind {
				c++
			}
		}
		return c >= n, nil
	})
	if err != nil {
		h.t.Fatalf("waiting for %d %s in the child's log: %q", n, kind, lines)
	}
	return lines
}

func count(lines []string, kind string) int {
	c := 0
	for _, l := range lines {
		if l == kind {
			c++
		}
	}
	return c
}

// version returns cd with resourceVersion rv.
func version(cd *v1alpha1.ComputeDomain, rv string) *v1alpha1.ComputeDomain {
	cd.ResourceVersion = rv
	return cd
}

// TestReloadOnPeerChange: nvidia-imex starts once this node is in the
// peer list; a change of the list reaches it as SIGUSR1, never within
// ReloadInterval of its start or of the last signal (it would ignore
// that one), and changes within one window share one signal; a version
// of the domain that leaves the list as it was sends none; at the end it
// gets SIGTERM.
func TestReloadOnPeerChange(t *testing.T) {
	h := fakeIMEX(t, "tray-2")
	a, b, c, d := node("tray-1", "10.0.3.11", 0), node("tray-2", "10.0.3.12", 1), node("tray-3", "10.0.3.13", 2), node("tray-4", "10.0.3.14", 3)

	// Not yet in the list: nothing starts.
	h.mb.Put(version(domain(4, a), "1"))
	s := h.waitState("version 1", func(s State) bool { return s.ResourceVersion == "1" })
	if s.Ready || s.IMEX != nil || !strings.Contains(s.Reason, "node tray-2 is not in status.nodes yet") || !slices.Equal(s.Peers, []string{"10.0.3.11"}) {
		t.Fatalf("before this node is listed: %+v", s)
	}

	h.mb.Put(version(domain(4, a, b), "2"))
	s = h.waitState("nvidia-imex started", func(s State) bool { return s.ResourceVersion == "2" && s.IMEX != nil })
	if !s.Ready || s.Reason != "" || s.IMEX.Reloads != 0 {
		t.Fatalf("started: %+v", s)
	}
	h.childLines("started", 1)
	cfg, err := os.ReadFile(filepath.Join(h.dir, "state", ConfigName))
	if err != nil || !strings.Contains(string(cfg), "\nIMEX_CMD_BIND_INTERFACE_IP=10.0.3.12\n") {
		t.Fatalf("configuration: %v\n%s", err, cfg)
	}

	// Two changes within the window of the start: one signal, when it
	// has passed.
	h.mb.Put(version(domain(4, a, b, c), "3"))
	h.waitState("version 3", func(s State) bool { return s.ResourceVersion == "3" })
	h.mb.Put(version(domain(4, a, b, c, d), "4"))
	s = h.waitState("version 4", func(s State) bool { return s.ResourceVersion == "4" })
	if s.IMEX.Reloads != 0 || len(s.Peers) != 4 {
		t.Fatalf("within the window after the start: %+v %+v", s, s.IMEX)
	}
	peers, _ := os.ReadFile(filepath.Join(h.dir, "state", NodesName))
	if string(peers) != "10.0.3.11\n10.0.3.12\n10.0.3.13\n10.0.3.14\n" {
		t.Fatalf("peer list %q", peers)
	}
	h.clock.Step(reloadEvery)
	h.waitState("the delayed SIGUSR1", func(s State) bool { return s.IMEX.Reloads == 1 })
	h.childLines("SIGUSR1", 1)

	// A version that leaves the list as it was: no signal.
	h.clock.Step(reloadEvery)
	cd := version(domain(4, a, b, c, d), "5")
	cd.Status.Status = v1alpha1.ComputeDomainReady
	h.mb.Put(cd)
	if s := h.waitState("version 5", func(s State) bool { return s.ResourceVersion == "5" }); s.IMEX.Reloads != 1 {
		t.Fatalf("an unchanged list was signalled: %+v", s.IMEX)
	}

	// Past the window: at once.
	moved := node("tray-3", "10.0.3.23", 2)
	h.mb.Put(version(domain(4, a, b, moved, d), "6"))
	h.waitState("the immediate SIGUSR1", func(s State) bool { return s.ResourceVersion == "6" && s.IMEX.Reloads == 2 })
	lines := h.childLines("SIGUSR1", 2)
	if count(lines, "SIGUSR1") != 2 {
		t.Fatalf("child's log %q, want two SIGUSR1", lines)
	}

	// The end: SIGTERM, and Run returns nil.
	h.cancel()
	if err := <-h.errc; err != nil {
		t.Fatalf("Run at the end: %v", err)
	}
	h.errc <- nil // for the cleanup
	h.childLines("SIGTERM", 1)
	if s, _ := ReadState(filepath.Join(h.dir, "state")); s.Ready || s.Reason != "stopping" {
		t.Fatalf("state after the end: %+v", s)
	}
}

// TestIMEXCrash: when nvidia-imex dies, Run returns an error naming it
// (facet-imex exits, and the kubelet restarts the container), and the
// state says not ready.
func TestIMEXCrash(t *testing.T) {
	h := fakeIMEX(t, "tray-1")
	h.mb.Put(version(domain(2, node("tray-1", "10.0.3.11", 0), node("tray-2", "10.0.3.12", 1)), "1"))
	s := h.waitState("nvidia-imex started", func(s State) bool { return s.IMEX != nil })
	h.childLines("started", 1)
	if err := syscall.Kill(s.IMEX.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-h.errc
	h.errc <- nil
	want := fmt.Sprintf("nvidia-imex (pid %d) exited: signal: killed", s.IMEX.PID)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "kubelet restarts the container") {
		t.Fatalf("Run: %v, want %q", err, want)
	}
	if s, _ := ReadState(filepath.Join(h.dir, "state")); s.Ready || !strings.Contains(s.Reason, want) {
		t.Fatalf("state after the crash: %+v", s)
	}
}

// TestIMEXAddressChange: nvidia-imex reads its command service's address
// at start only; when the node's address changes, Run ends with an error
// saying so.
func TestIMEXAddressChange(t *testing.T) {
	h := fakeIMEX(t, "tray-1")
	h.mb.Put(version(domain(1, node("tray-1", "10.0.3.11", 0)), "1"))
	h.waitState("nvidia-imex started", func(s State) bool { return s.IMEX != nil })
	h.childLines("started", 1)
	h.mb.Put(version(domain(1, node("tray-1", "10.0.3.99", 0)), "2"))
	err := <-h.errc
	h.errc <- nil
	if err == nil || !strings.Contains(err.Error(), "node tray-1's address changed from 10.0.3.11 to 10.0.3.99") {
		t.Fatalf("Run: %v", err)
	}
	h.childLines("SIGTERM", 1)
}

// TestSimulate: the stand-in's state follows the domain's versions, and
// keeps the last good peer list when a version is malformed, gone, or
// another domain of the same name.
func TestSimulate(t *testing.T) {
	d := NewDaemon(Options{Namespace: "ml", Name: "train", UID: testUID, Node: "tray-2", Simulate: true})
	h := start(t, d)
	s := h.waitState("the first state", func(State) bool { return true })
	if s.Ready || s.Mode != ModeSimulate || s.PID != os.Getpid() || s.Reason != "starting: waiting for ComputeDomain ml/train" {
		t.Fatalf("first state %+v", s)
	}
	a, b, c := node("tray-1", "10.0.3.11", 0), node("tray-2", "10.0.3.12", 1), node("tray-3", "10.0.3.13", 2)
	other := domain(3, a, b, c)
	other.UID = "another-uid"
	for i, tc := range []struct {
		name       string
		domain     *v1alpha1.ComputeDomain
		wantReady  bool
		wantReason string
		wantPeers  []string
	}{
		{name: "two of three", domain: domain(3, a, b), wantReason: "holds 2 of spec.numNodes 3", wantPeers: []string{"10.0.3.11", "10.0.3.12"}},
		{name: "complete", domain: domain(3, c, a, b), wantReady: true, wantPeers: []string{"10.0.3.11", "10.0.3.12", "10.0.3.13"}},
		{name: "an index twice: the last list stays", domain: domain(3, a, b, node("tray-3", "10.0.3.13", 1)), wantReason: "status.nodes[2].index: Duplicate value", wantPeers: []string{"10.0.3.11", "10.0.3.12", "10.0.3.13"}},
		{name: "this node left", domain: domain(3, a, c), wantReason: "node tray-2 is not in status.nodes (tray-1, tray-3)", wantPeers: []string{"10.0.3.11", "10.0.3.13"}},
		{name: "re-created", domain: other, wantReason: "has UID another-uid, not this daemon's " + testUID, wantPeers: []string{"10.0.3.11", "10.0.3.13"}},
		{name: "deleted", wantReason: "ComputeDomain ml/train is gone", wantPeers: []string{"10.0.3.11", "10.0.3.13"}},
	} {
		rv := ""
		if tc.domain != nil {
			rv = fmt.Sprint(i + 1)
			tc.domain.ResourceVersion = rv
		}
		h.mb.Put(tc.domain)
		s := h.waitState(tc.name, func(s State) bool { return s.ResourceVersion == rv && (rv != "" || strings.Contains(s.Reason, "gone")) })
		if s.Ready != tc.wantReady || !strings.Contains(s.Reason, tc.wantReason) || (tc.wantReady && s.Reason != "") || !slices.Equal(s.Peers, tc.wantPeers) {
			t.Errorf("%s: state %+v, want ready %v, reason %q, peers %q", tc.name, s, tc.wantReady, tc.wantReason, tc.wantPeers)
		}
		if err := Probe(context.Background(), filepath.Join(h.dir, "state"), time.Second); (err == nil) != tc.wantReady || (err != nil && err.Error() != s.Reason) {
			t.Errorf("%s: probe %v, want ready %v", tc.name, err, tc.wantReady)
		}
	}
}

// TestLocateFails: without nvidia-imex in the driver root, Run ends at
// once and the state names what it looked for.
func TestLocateFails(t *testing.T) {
	root := t.TempDir()
	d := NewDaemon(Options{Namespace: "ml", Name: "train", UID: testUID, Node: "tray-1", DriverRoot: root})
	h := start(t, d)
	err := <-h.errc
	h.errc <- nil
	want := "nvidia-imex not found in usr/bin, bin, usr/local/bin under driver root " + root
	if err == nil || err.Error() != want {
		t.Fatalf("Run: %v, want %q", err, want)
	}
	if s, _ := ReadState(filepath.Join(h.dir, "state")); s.Ready || s.Reason != want {
		t.Fatalf("state %+v", s)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal("cancelled")
	}
}
