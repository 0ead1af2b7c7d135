package plugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/facet-gpu/facet/pkg/cdihook"
	"github.com/facet-gpu/facet/pkg/mps"
)

// TestMissingHAMiLibraryIsNotFatal: a missing --hami-library is a reason
// for share claims to fail, returned with no editor; the plugin goes on
// (L4: run used to return it and exit).
func TestMissingHAMiLibraryIsNotFatal(t *testing.T) {
	dir := t.TempDir()
	e, err := openHAMi(filepath.Join(dir, "missing", "libvgpu.so"), filepath.Join(dir, "vgpu"))
	if e != nil || err == nil || !strings.Contains(err.Error(), "libvgpu.so") {
		t.Fatalf("editor %v, error %v", e, err)
	}
	if e, err := openHAMi("", dir); e != nil || err != nil {
		t.Fatalf("no library asked for: %v %v", e, err)
	}
	lib := filepath.Join(dir, "libvgpu.so")
	if err := os.WriteFile(lib, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := openHAMi(lib, filepath.Join(dir, "vgpu")); e == nil || err != nil {
		t.Fatalf("with a library: %v %v", e, err)
	}
}

// TestMPSControlFromTheContainerDriverRoot: the plugin runs
// nvidia-cuda-mps-control itself, so it finds it where it reads the driver
// root (--container-driver-root), not at the host path --driver-root names,
// which its container may not have (the host's / is read at /driver-root).
func TestMPSControlFromTheContainerDriverRoot(t *testing.T) {
	ctrRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(ctrRoot, "usr", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctrRoot, "usr", "bin", mps.ControlName), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	hostRoot := filepath.Join(t.TempDir(), "host-root") // absent here, as the host's path is in the container
	for _, tc := range []struct {
		name          string
		driverRoot    string
		containerRoot string
		wantReason    string // "" for a manager
	}{
		{name: "read at the container's mount", driverRoot: hostRoot, containerRoot: ctrRoot},
		{name: "on the host", driverRoot: ctrRoot},
		{name: "no mount given: the host path", driverRoot: hostRoot, wantReason: "under driver root " + hostRoot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Config{DriverRoot: tc.driverRoot, ContainerDriverRoot: tc.containerRoot,
				MPS: MPSConfig{Mode: "auto", Dir: filepath.Join(t.TempDir(), "mps")}}
			mgr, reason, err := f.openMPS(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantReason != "" {
				if mgr != nil || reason == nil || !strings.Contains(reason.Error(), tc.wantReason) {
					t.Fatalf("manager %v, reason %v; want none, and a reason containing %q", mgr, reason, tc.wantReason)
				}
				return
			}
			if mgr == nil || reason != nil {
				t.Fatalf("manager %v, reason %v; want a manager", mgr, reason)
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
