package sim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/mps"
)

// TestLayoutPrefixDriverRoot: GKE's and /usr/local/nvidia's simulated
// layouts are driver roots the plugin reads as it reads a real one under a
// prefix (NVML found in lib64, the CDI edits naming the prefix's host
// paths and the host's /dev), and roots whose MPS control daemon runs
// from the host's root with the prefix's libraries.
func TestLayoutPrefixDriverRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("device nodes, mounts and chroot need root (CI runs as root)")
	}
	for _, prefix := range mpssim.Prefixes {
		t.Run(prefix, func(t *testing.T) {
			host := t.TempDir()
			for range 2 {
				if err := LayoutPrefixDriverRoot(host, prefix, simDriverVersion, []int{0, 1, 2, 3, 4, 5, 6, 7}); err != nil {
					t.Fatal(err)
				}
			}
			root := filepath.Join(host, prefix)
			for _, absent := range []string{"tmp", "dev", "usr/bin", "lib/firmware", "bin/sh"} {
				if _, err := os.Lstat(filepath.Join(root, absent)); err == nil {
					t.Errorf("%s/%s exists: a driver under a prefix has no root of its own", prefix, absent)
				}
			}
			nvmlLib, err := nvmlgpu.FindDriverLibrary(root, nvmlgpu.NVMLLibrary)
			if want := filepath.Join(root, "lib64", "libnvidia-ml.so."+simDriverVersion); err != nil || nvmlLib != want {
				t.Errorf("NVML found at %q (%v), want %s", nvmlLib, err, want)
			}

			// The plugin's view: the driver root read at <host>/<prefix>,
			// the host's /dev at <host>.
			const hook = "/var/lib/facet-cdi-hook/nvidia-cdi-hook"
			e, err := dgxH100(t).DriverEditor(nvmlgpu.DriverEditorOptions{
				DriverRoot: prefix, ContainerDriverRoot: root, DevRoot: host,
				NvidiaCDIHookPath: hook, ProcRoot: filepath.Join(root, "proc"),
			})
			if err != nil {
				t.Fatal(err)
			}
			common, err := e.CommonEdits()
			if err != nil {
				t.Fatal(err)
			}
			libcuda := "libcuda.so." + simDriverVersion
			mounted := map[string]string{}
			for _, m := range common.Mounts {
				mounted[filepath.Base(m.HostPath)] = m.HostPath + " at " + m.ContainerPath
			}
			if got, want := mounted[libcuda], filepath.Join(prefix, "lib64", libcuda)+" at /lib64/"+libcuda; got != want {
				t.Errorf("libcuda mounted from %q, want %q", got, want)
			}
			var ctl string
			for _, d := range common.DeviceNodes {
				if d.Path == "/dev/nvidiactl" {
					ctl = d.HostPath
				}
			}
			if want := filepath.Join(host, "dev", "nvidiactl"); ctl != want {
				t.Errorf("/dev/nvidiactl from host %q, want %s", ctl, want)
			}

			// MPS: from the host's root, with the prefix's program and
			// libraries.
			l, err := mps.Locate(root, host)
			want := mps.Layout{Root: host, Control: prefix + "/bin/" + mps.ControlName, LibraryPath: prefix + "/lib64", Prefix: prefix}
			if err != nil || l != want {
				t.Fatalf("mps.Locate = %+v, %v; want %+v", l, err, want)
			}
			dir := filepath.Join(t.TempDir(), "mps")
			m, err := mps.New(mps.Options{Root: l.Root, Control: l.Control, LibraryPath: l.LibraryPath, Dir: dir, ShmSize: 1 << 20, StopTimeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			const gpu = "GPU-00000000-0000-0000-0000-000000000000"
			t.Cleanup(func() {
				if pid, ok := m.Running(gpu); ok {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				_ = syscall.Unmount(mps.DirsIn(dir, gpu).Shm, syscall.MNT_DETACH)
			})
			_, ctx := ktesting.NewTestContext(t)
			if err := m.Acquire(ctx, gpu, "claim-1", 0); err != nil {
				t.Fatal(err)
			}
			log, _ := os.ReadFile(filepath.Join(mps.DirsIn(dir, gpu).Log, "control.log"))
			if want := fmt.Sprintf("libcuda=%s/lib64/libcuda.so.1", prefix); !strings.Contains(string(log), want) {
				t.Errorf("control.log has no %q: the daemon did not reach the prefix's libcuda:\n%s", want, log)
			}
			if err := m.Release(ctx, "claim-1"); err != nil {
				t.Fatal(err)
			}
			if _, ok := m.Running(gpu); ok {
				t.Error("the daemon runs after the last claim")
			}
		})
	}
	if err := LayoutPrefixDriverRoot(t.TempDir(), "/", simDriverVersion, nil); err == nil || errors.Is(err, os.ErrPermission) {
		t.Errorf("the prefix /: %v, want it refused", err)
	}
}
