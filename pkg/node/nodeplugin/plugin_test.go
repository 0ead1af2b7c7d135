package nodeplugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/node/cdihook"
	"github.com/facet-gpu/facet/pkg/node/mps"
	"github.com/facet-gpu/facet/pkg/node/mps/service"
	"github.com/facet-gpu/facet/pkg/node/sharing"
)

// TestSharingHAMiArrives: a missing --hami-library is a reason for share
// claims to fail, not for the plugin to stop (L4: run used to return it and
// exit), and HAMi-core is adopted once its library appears (the chart's
// hami-core DaemonSet installs it beside the plugin, never before it), and
// dropped when it goes; no --hami-library at all is off, not a loss.
func TestSharingHAMiArrives(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	lib := filepath.Join(dir, "hami", "libvgpu.so")
	o, err := Config{HAMiLibrary: lib, StateDir: dir, MPS: MPSConfig{Mode: "off"}}.sharingOptions()
	if err != nil {
		t.Fatal(err)
	}
	s := sharing.New(o)
	changes := s.Refresh(ctx)
	if h, why := s.HAMi(); h != nil || why == nil || !strings.Contains(why.Error(), "libvgpu.so") {
		t.Fatalf("without the library: editor %v, reason %v", h, why)
	}
	if len(changes) != 2 || changes[0].Mechanism != sharing.HAMiCore || changes[0].Available || changes[0].Off ||
		changes[1].Mechanism != sharing.MPS || !changes[1].Off {
		t.Fatalf("first refresh: %+v, want HAMi-core unavailable (not off) and MPS off", changes)
	}
	if c := s.Refresh(ctx); len(c) != 0 {
		t.Fatalf("nothing changed, yet %+v", c)
	}
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c := s.Refresh(ctx); len(c) != 1 || c[0] != (sharing.Change{Mechanism: sharing.HAMiCore, Available: true}) {
		t.Fatalf("library installed: %+v, want HAMi-core available", c)
	}
	if h, _ := s.HAMi(); h == nil {
		t.Fatal("HAMi-core not adopted")
	}
	if err := os.Remove(lib); err != nil {
		t.Fatal(err)
	}
	if c := s.Refresh(ctx); len(c) != 1 || c[0].Available || !strings.Contains(c[0].Why, "gone") {
		t.Fatalf("library removed: %+v, want HAMi-core unavailable, gone", c)
	}

	o, err = Config{StateDir: dir, MPS: MPSConfig{Mode: "off"}}.sharingOptions()
	if err != nil {
		t.Fatal(err)
	}
	s = sharing.New(o)
	if c := s.Refresh(ctx); len(c) != 2 || c[0].Available || !c[0].Off {
		t.Fatalf("no --hami-library: %+v, want HAMi-core off", c)
	}
}

// serveMPS runs a facet-mps over root on dir until the returned stop.
func serveMPS(ctx context.Context, t *testing.T, root, dir string) (stop func()) {
	t.Helper()
	s, err := service.NewServer(service.Config{Root: root, Dir: dir, ShmSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = s.Run(sctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	// Serving before the plugin asks, however loaded the machine: the
	// case is what it answers, not how soon.
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := service.NewClient(dir).Info(ctx)
		return err == nil, nil
	}); err != nil {
		t.Fatalf("facet-mps does not answer: %v", err)
	}
	return stop
}

// controlRoot is a driver root MPS can be chrooted into (mps.CheckRoot).
func controlRoot(t *testing.T) string {
	root := t.TempDir()
	for _, f := range []string{"usr/bin/" + mps.ControlName, "bin/sh", "tmp/", "dev/shm/"} {
		p := filepath.Join(root, f)
		if strings.HasSuffix(f, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestSharingMPSArrivesAndGoes: facet-mps that answers after the plugin
// started is adopted at the next refresh, with nothing waited for, and
// dropped when it stops answering; the shares' published partitioning
// follows it.
func TestSharingMPSArrivesAndGoes(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := filepath.Join(t.TempDir(), "mps")
	o, err := Config{MPS: MPSConfig{Mode: "auto", Dir: dir}}.sharingOptions()
	if err != nil {
		t.Fatal(err)
	}
	s := sharing.New(o)
	start := time.Now()
	s.Refresh(ctx)
	if took := time.Since(start); took > 10*time.Second {
		// Not a timing assert: a refresh that waited for facet-mps
		// (the old --mps-wait) would take its whole wait, here forever.
		t.Fatalf("the first refresh took %v without facet-mps", took)
	}
	if p, why := s.MPS(); p != nil || why == nil || sharing.Off(why) || s.ComputePartitioning() != names.PartitioningTimeSliced {
		t.Fatalf("before facet-mps: %v, %v, %s", p, why, s.ComputePartitioning())
	}
	stop := serveMPS(ctx, t, controlRoot(t), dir)
	if c := s.Refresh(ctx); len(c) != 1 || c[0] != (sharing.Change{Mechanism: sharing.MPS, Available: true}) {
		t.Fatalf("facet-mps answering: %+v, want MPS available", c)
	}
	if s.ComputePartitioning() != names.PartitioningMPS {
		t.Fatalf("partitioning %s with facet-mps", s.ComputePartitioning())
	}
	stop()
	if c := s.Refresh(ctx); len(c) != 1 || c[0].Available || !strings.Contains(c[0].Why, "facet-mps unreachable") {
		t.Fatalf("facet-mps stopped: %+v, want MPS unavailable, unreachable", c)
	}
	if s.ComputePartitioning() != names.PartitioningTimeSliced {
		t.Fatalf("partitioning %s after facet-mps stopped", s.ComputePartitioning())
	}
}

// TestOpenMPS: the plugin runs no MPS daemon itself; with --mps=auto it
// reaches facet-mps on the MPS directory's socket, and time-slices shares,
// naming why, when facet-mps does not answer or its driver root has no
// control program.
func TestOpenMPS(t *testing.T) {
	// A driver under a prefix: the control program alone.
	withControl, prefix := controlRoot(t), t.TempDir()
	if err := os.MkdirAll(filepath.Join(prefix, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(prefix, "bin", mps.ControlName), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		mode       string
		serveRoot  string // "": no facet-mps
		wantReason string // "": a partitioner
		wantOff    bool
		wantFatal  string
	}{
		{name: "facet-mps with a control program", mode: "auto", serveRoot: withControl},
		{name: "facet-mps without one", mode: "auto", serveRoot: t.TempDir(), wantReason: "has no MPS control program"},
		{name: "facet-mps on a driver under a prefix", mode: "auto", serveRoot: prefix, wantReason: "cannot run MPS chrooted: no /tmp directory"},
		{name: "no facet-mps", mode: "auto", wantReason: "facet-mps unreachable at "},
		{name: "off", mode: "off", serveRoot: withControl, wantReason: "--mps=off", wantOff: true},
		{name: "invalid", mode: "on", wantFatal: `--mps="on"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			dir := filepath.Join(t.TempDir(), "mps")
			if tc.serveRoot != "" {
				serveMPS(ctx, t, tc.serveRoot, dir)
			}
			o, err := Config{MPS: MPSConfig{Mode: tc.mode, Dir: dir}}.sharingOptions()
			if tc.wantFatal != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantFatal) {
					t.Fatalf("fatal %v, want %q", err, tc.wantFatal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := sharing.New(o)
			s.Refresh(ctx)
			p, reason := s.MPS()
			switch {
			case tc.wantReason != "":
				if p != nil || reason == nil || !strings.Contains(reason.Error(), tc.wantReason) || sharing.Off(reason) != tc.wantOff {
					t.Fatalf("partitioner %v, reason %v; want none, and a reason containing %q (off: %v)", p, reason, tc.wantReason, tc.wantOff)
				}
			case p == nil || reason != nil:
				t.Fatalf("partitioner %v, reason %v; want one", p, reason)
			}
		})
	}
}

// TestCheckCDIHook: the plugin refuses to start without a working
// nvidia-cdi-hook, with an error naming the value to set and a Warning
// Event on its Node; a hook that runs raises nothing.
func TestCheckCDIHook(t *testing.T) {
	good := filepath.Join(t.TempDir(), cdihook.Name)
	if err := os.WriteFile(good, []byte("#!/bin/sh\necho 'NVIDIA CDI Hook version 1.19.1'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		f         Config
		wantErr   []string // "" for none
		wantEvent bool
	}{
		{name: "runs", f: Config{CDIHook: "/var/lib/facet-cdi-hook/" + cdihook.Name, ContainerCDIHook: good}},
		{
			name:      "missing",
			f:         Config{CDIHook: "/usr/bin/" + cdihook.Name, ContainerCDIHook: filepath.Join(t.TempDir(), cdihook.Name)},
			wantErr:   []string{"/usr/bin/nvidia-cdi-hook", "does not exist", cdihook.Flag, cdihook.ChartInstallVal, cdihook.ChartHostPathVal},
			wantEvent: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			tc.f.NodeName = "gpu-node-1"
			err := checkCDIHook(context.Background(), client, tc.f)
			for _, s := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Errorf("error %v, want one containing %q", err, s)
				}
			}
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatal(err)
			}
			evs, lerr := client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if !tc.wantEvent {
				if len(evs.Items) != 0 {
					t.Errorf("Events %+v, want none", evs.Items)
				}
				return
			}
			if len(evs.Items) != 1 {
				t.Fatalf("%d Events, want 1", len(evs.Items))
			}
			ev := evs.Items[0]
			if ev.Reason != cdihook.Reason || ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.Kind != "Node" ||
				ev.InvolvedObject.Name != "gpu-node-1" || ev.Message != err.Error() {
				t.Errorf("Event %+v, want a Warning %s on Node gpu-node-1 with the error", ev, cdihook.Reason)
			}
		})
	}
}
