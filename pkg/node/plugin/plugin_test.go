package plugin

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

	"github.com/facet-gpu/facet/pkg/node/cdihook"
	"github.com/facet-gpu/facet/pkg/node/mps"
	"github.com/facet-gpu/facet/pkg/node/mps/service"
)

// TestMissingHAMiLibraryIsNotFatal: a missing --hami-library is a reason
// for share claims to fail, returned with no editor; the plugin goes on
// (L4: run used to return it and exit).
func TestMissingHAMiLibraryIsNotFatal(t *testing.T) {
	dir := t.TempDir()
	e, err := openHAMi(filepath.Join(dir, "missing", "libvgpu.so"), "", filepath.Join(dir, "vgpu"))
	if e != nil || err == nil || !strings.Contains(err.Error(), "libvgpu.so") {
		t.Fatalf("editor %v, error %v", e, err)
	}
	if e, err := openHAMi("", "", dir); e != nil || err != nil {
		t.Fatalf("no library asked for: %v %v", e, err)
	}
	lib := filepath.Join(dir, "libvgpu.so")
	if err := os.WriteFile(lib, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := openHAMi(lib, "", filepath.Join(dir, "vgpu")); e == nil || err != nil {
		t.Fatalf("with a library: %v %v", e, err)
	}
}

// TestOpenMPS: the plugin runs no MPS daemon itself; with --mps=auto it
// reaches facet-mps on the MPS directory's socket, and time-slices shares,
// naming why, when facet-mps does not answer or its driver root has no
// control program.
func TestOpenMPS(t *testing.T) {
	// A root MPS can be chrooted into (mps.CheckRoot), and a driver
	// under a prefix: the control program alone.
	withControl, prefix := t.TempDir(), t.TempDir()
	for _, f := range []string{"usr/bin/" + mps.ControlName, "bin/sh", "tmp/", "dev/shm/"} {
		p := filepath.Join(withControl, f)
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
		wantFatal  string
	}{
		{name: "facet-mps with a control program", mode: "auto", serveRoot: withControl},
		{name: "facet-mps without one", mode: "auto", serveRoot: t.TempDir(), wantReason: "has no MPS control program"},
		{name: "facet-mps on a driver under a prefix", mode: "auto", serveRoot: prefix, wantReason: "cannot run MPS chrooted: no /tmp directory"},
		{name: "no facet-mps", mode: "auto", wantReason: "facet-mps unreachable at "},
		{name: "off", mode: "off", serveRoot: withControl, wantReason: "--mps=off"},
		{name: "invalid", mode: "on", wantFatal: `--mps="on"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			dir := filepath.Join(t.TempDir(), "mps")
			if tc.serveRoot != "" {
				s, err := service.NewServer(service.Config{Root: tc.serveRoot, Dir: dir, ShmSize: 1 << 20})
				if err != nil {
					t.Fatal(err)
				}
				sctx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() { _ = s.Run(sctx); close(done) }()
				t.Cleanup(func() { cancel(); <-done })
				// Serving before the plugin asks, however loaded the
				// machine: the case is what it answers, not how soon.
				if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
					_, err := service.NewClient(dir).Info(ctx)
					return err == nil, nil
				}); err != nil {
					t.Fatalf("facet-mps does not answer: %v", err)
				}
			}
			f := Config{MPS: MPSConfig{Mode: tc.mode, Dir: dir, Wait: 2 * time.Second}}
			p, reason, err := f.openMPS(ctx)
			switch {
			case tc.wantFatal != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantFatal) {
					t.Fatalf("fatal %v, want %q", err, tc.wantFatal)
				}
			case err != nil:
				t.Fatal(err)
			case tc.wantReason != "":
				if p != nil || reason == nil || !strings.Contains(reason.Error(), tc.wantReason) {
					t.Fatalf("partitioner %v, reason %v; want none, and a reason containing %q", p, reason, tc.wantReason)
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
