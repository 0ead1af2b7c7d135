package imex

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
)

// TestProbe: the probe reads the state and answers for the facet-imex
// that wrote it, only while that process runs.
func TestProbe(t *testing.T) {
	self := os.Getpid()
	start, err := procStartTime(self)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		state *State
		want  string // "" is ready
	}{
		{name: "no state yet", want: "facet-imex has written no state in"},
		{name: "ready stand-in", state: &State{Mode: ModeSimulate, PID: self, StartTime: start, Ready: true}},
		{name: "stand-in not ready", state: &State{Mode: ModeSimulate, PID: self, StartTime: start, Reason: "ComputeDomain ml/train: the peer list holds 3 of spec.numNodes 4 nodes (a, b, c)"},
			want: "ComputeDomain ml/train: the peer list holds 3 of spec.numNodes 4 nodes (a, b, c)"},
		{name: "written by the container's last run (same PID, another start)", state: &State{Mode: ModeSimulate, PID: self, StartTime: start + 1, Ready: true},
			want: "no longer runs"},
		{name: "written by a process that is gone", state: &State{Mode: ModeSimulate, PID: 1 << 30, Ready: true}, want: "no longer runs"},
		{name: "nvidia-imex not started", state: &State{Mode: ModeIMEX, PID: self, StartTime: start, Reason: "ComputeDomain ml/train: node tray-1 is not in status.nodes yet"},
			want: "node tray-1 is not in status.nodes yet"},
		{name: "ready without a layout", state: &State{Mode: ModeIMEX, PID: self, StartTime: start, Ready: true}, want: "ready without nvidia-imex's layout"},
		{name: "unknown mode", state: &State{Mode: "other", PID: self, StartTime: start, Ready: true}, want: `unknown mode "other"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.state != nil {
				if err := WriteState(dir, *tc.state); err != nil {
					t.Fatal(err)
				}
			}
			var out, errOut bytes.Buffer
			rc := ProbeMain(context.Background(), []string{"--state-dir", dir}, &out, &errOut)
			if tc.want == "" {
				if rc != 0 || out.String() != "READY\n" {
					t.Fatalf("probe: %d %q %q, want READY", rc, out.String(), errOut.String())
				}
				return
			}
			if rc != 1 || !strings.HasPrefix(out.String(), "not ready: ") || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("probe: %d %q, want 1 and %q", rc, out.String(), tc.want)
			}
		})
	}
	var out, errOut bytes.Buffer
	if rc := ProbeMain(context.Background(), []string{"extra"}, &out, &errOut); rc != 2 || !strings.Contains(errOut.String(), `unexpected arguments ["extra"]`) {
		t.Errorf("probe with an argument: %d %q", rc, errOut.String())
	}
}

// Stand-ins of NVIDIA's programs for a root of mpssim.WriteRoot's (a shell
// and busybox). nvidia-imex logs to imex.log in its state directory what
// it sees and the signals it gets; nvidia-imex-ctl -q says READY while
// the peer list it reads from the configuration exists and no file
// "unready" is beside it.
const (
	imexScript = `#!/bin/sh
[ "$1" = -c ] || { echo "usage: nvidia-imex -c CONFIG" >&2; exit 2; }
nodes=$(sed -n 's/^IMEX_NODE_CONFIG_FILE=//p' "$2")
log=$(dirname "$nodes")/imex.log
echo "started $(cat "$nodes" | tr '\n' ' ')" >>"$log"
trap 'echo "usr1 $(cat "$nodes" | tr "\n" " ")" >>"$log"' USR1
trap 'echo term >>"$log"; exit 0' TERM
while :; do sleep 0.02; done
`
	ctlScript = `#!/bin/sh
nodes=$(sed -n 's/^IMEX_NODE_CONFIG_FILE=//p' "$2")
if [ "$3" = -q ] && [ -f "$nodes" ] && [ ! -f "$(dirname "$nodes")/unready" ]; then echo READY; else echo UNAVAILABLE; fi
`
)

// TestIMEXChrooted: nvidia-imex runs chrooted into the driver root with
// the state directory bound where its configuration says; the probe runs
// nvidia-imex-ctl the same way; SIGUSR1 reaches it and it reads the new
// peer list; at the end it gets SIGTERM.
func TestIMEXChrooted(t *testing.T) {
	if os.Geteuid() != 0 {
		// Not a skip that hides a defect: CI runs as root, as the
		// DaemonSet's facet-imex does.
		t.Skip("running nvidia-imex chrooted mounts a tmpfs and chroots: needs root")
	}
	root := t.TempDir()
	if err := mpssim.WriteRoot(root); err != nil {
		t.Fatal(err)
	}
	for name, script := range map[string]string{"nvidia-imex": imexScript, "nvidia-imex-ctl": ctlScript} {
		if err := os.WriteFile(filepath.Join(root, "usr/bin", name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := NewDaemon(Options{Namespace: "ml", Name: "train", UID: testUID, Node: "tray-1", DriverRoot: root})
	h := start(t, d)
	state := filepath.Join(h.dir, "state")
	imexLog := filepath.Join(state, "imex.log")
	logHas := func(what string) {
		t.Helper()
		h.childLog = imexLog
		h.childLines(what, 1)
	}
	a, b := node("tray-1", "10.0.3.11", 0), node("tray-2", "10.0.3.12", 1)
	h.mb.Put(version(domain(2, a, b), "1"))
	s := h.waitState("nvidia-imex started", func(s State) bool { return s.IMEX != nil })
	if s.IMEX.Root != root || s.IMEX.Ctl != "/usr/bin/nvidia-imex-ctl" {
		t.Fatalf("layout %+v", s.IMEX)
	}
	logHas("started")
	if b, _ := os.ReadFile(imexLog); !strings.Contains(string(b), "started 10.0.3.11 10.0.3.12") {
		t.Fatalf("nvidia-imex read %q", b)
	}
	if err := Probe(context.Background(), state, 10*time.Second); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if err := os.WriteFile(filepath.Join(state, "unready"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Probe(context.Background(), state, 10*time.Second); err == nil || err.Error() != `nvidia-imex is not ready: nvidia-imex-ctl -q says "UNAVAILABLE"` {
		t.Fatalf("probe with nvidia-imex-ctl saying UNAVAILABLE: %v", err)
	}

	h.mb.Put(version(domain(2, a, node("tray-2", "10.0.3.22", 1)), "2"))
	h.waitState("version 2", func(s State) bool { return s.ResourceVersion == "2" })
	h.clock.Step(reloadEvery)
	logHas("usr1")
	if b, _ := os.ReadFile(imexLog); !strings.Contains(string(b), "usr1 10.0.3.11 10.0.3.22") {
		t.Fatalf("after SIGUSR1 nvidia-imex read %q", b)
	}
	h.cancel()
	if err := <-h.errc; err != nil {
		t.Fatal(err)
	}
	h.errc <- nil
	logHas("term")
}
