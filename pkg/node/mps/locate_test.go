package mps

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
)

// simVersion is the driver version of the tests' prefix libraries.
const simVersion = "580.159.04"

// writePrefixLibraries puts libcuda.so.<version> and its SONAME link in a
// simulated prefix's lib64, as a driver's installer leaves them (the
// stand-in only looks for the link; Locate for the versioned file).
func writePrefixLibraries(t testing.TB, hostRoot, prefix string) string {
	t.Helper()
	dir := filepath.Join(hostRoot, prefix, mpssim.PrefixLibDir)
	if err := os.WriteFile(filepath.Join(dir, "libcuda.so."+simVersion), []byte("simulated libcuda\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libcuda.so."+simVersion, filepath.Join(dir, "libcuda.so.1")); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	return dir
}

// TestLocate: a root the program can run chrooted in is used as it is; a
// driver under a prefix (GKE's, /usr/local/nvidia) runs from the host's
// root, with the prefix's program and libraries; and where neither can
// run it, the error names what each lacks.
func TestLocate(t *testing.T) {
	full := t.TempDir()
	if err := mpssim.WriteRoot(full); err != nil {
		t.Fatal(err)
	}
	type prefixed struct{ host, prefix string }
	layout := func(prefix string, libs bool) prefixed {
		host := t.TempDir()
		if err := mpssim.WritePrefix(host, prefix); err != nil {
			t.Fatal(err)
		}
		if libs {
			writePrefixLibraries(t, host, prefix)
		}
		return prefixed{host, prefix}
	}
	gke, local, noLibs := layout(mpssim.Prefixes[0], true), layout(mpssim.Prefixes[1], true), layout("/usr/local/nvidia", false)
	// A host root without /dev/shm, and one without the stand-in's
	// interpreter (a real program's: its loader).
	noShm, noLoader := layout("/usr/local/nvidia", true), layout("/usr/local/nvidia", true)
	for _, p := range []string{filepath.Join(noShm.host, "dev/shm"), filepath.Join(noLoader.host, "bin/sh")} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		name             string
		driverRoot, host string
		want             Layout
		wantErr          []string
	}{
		{name: "a root to chroot into", driverRoot: full, want: Layout{Root: full, Control: "/" + mpssim.ControlRel, Prefix: "/"}},
		{name: "a root to chroot into, a host root beside it", driverRoot: full, host: gke.host, want: Layout{Root: full, Control: "/" + mpssim.ControlRel, Prefix: "/"}},
		{
			name: "GKE's prefix", driverRoot: filepath.Join(gke.host, gke.prefix), host: gke.host,
			want: Layout{Root: gke.host, Control: "/home/kubernetes/bin/nvidia/bin/" + ControlName, LibraryPath: "/home/kubernetes/bin/nvidia/lib64", Prefix: "/home/kubernetes/bin/nvidia"},
		},
		{
			name: "/usr/local/nvidia", driverRoot: filepath.Join(local.host, local.prefix), host: local.host + "/",
			want: Layout{Root: local.host + "/", Control: "/usr/local/nvidia/bin/" + ControlName, LibraryPath: "/usr/local/nvidia/lib64", Prefix: "/usr/local/nvidia"},
		},
		{
			name: "a prefix without a host root", driverRoot: filepath.Join(local.host, local.prefix),
			wantErr: []string{"cannot run MPS chrooted: no /tmp directory; no /dev/shm directory", "nor from the host's root: none given (facet-mps --host-root"},
		},
		{
			name: "a prefix outside the host root", driverRoot: filepath.Join(local.host, local.prefix), host: gke.host,
			wantErr: []string{"cannot run MPS chrooted", "is not a directory of host root " + gke.host},
		},
		{
			name: "a host root without /dev/shm", driverRoot: filepath.Join(noShm.host, noShm.prefix), host: noShm.host,
			wantErr: []string{"nor from the host's root: root " + noShm.host + " cannot run MPS chrooted: no /dev/shm directory"},
		},
		{
			name: "a host root without the program's loader", driverRoot: filepath.Join(noLoader.host, noLoader.prefix), host: noLoader.host,
			wantErr: []string{"nor from the host's root: root " + noLoader.host + " cannot run MPS chrooted: " + ControlName + "'s interpreter /bin/sh is not in it"},
		},
		{
			name: "a prefix without driver libraries", driverRoot: filepath.Join(noLibs.host, noLibs.prefix), host: noLibs.host,
			wantErr: []string{"nor from the host's root: driver root " + filepath.Join(noLibs.host, noLibs.prefix) + ": none of libcuda.so.*.*, libnvidia-ml.so.*.* in it"},
		},
		{name: "no control program", driverRoot: t.TempDir(), host: gke.host, wantErr: []string{ControlName + " not found in usr/bin, bin, usr/local/bin"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Locate(tc.driverRoot, tc.host)
			if len(tc.wantErr) == 0 {
				if err != nil || got != tc.want {
					t.Fatalf("Locate(%s, %q) = %+v, %v; want %+v", tc.driverRoot, tc.host, got, err, tc.want)
				}
				return
			}
			for _, want := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Locate(%s, %q) = %+v, %v; want an error with %q", tc.driverRoot, tc.host, got, err, want)
				}
			}
		})
	}
}

// TestPrefixLifecycle: on a driver under a prefix (GKE's,
// /usr/local/nvidia), the daemon runs chrooted into the host's root,
// executing the prefix's control program with LD_LIBRARY_PATH into the
// prefix's lib64, where it finds the driver's libcuda; it serves the GPU's
// directories as on any root, and quits with the last claim.
func TestPrefixLifecycle(t *testing.T) {
	for _, prefix := range mpssim.Prefixes {
		t.Run(prefix, func(t *testing.T) {
			n := newNode(t)
			// newNode's root stands for nothing here: the host's root
			// with the prefix is a root of its own.
			host := t.TempDir()
			if err := mpssim.WritePrefix(host, prefix); err != nil {
				t.Fatal(err)
			}
			writePrefixLibraries(t, host, prefix)
			l, err := Locate(filepath.Join(host, prefix), host)
			if err != nil {
				t.Fatal(err)
			}
			_, ctx := ktesting.NewTestContext(t)
			m, err := New(Options{Root: l.Root, Control: l.Control, LibraryPath: l.LibraryPath, Dir: n.dir, ShmSize: shmSize, BootID: n.bootID})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Acquire(ctx, gpuA, "claim-1", 0); err != nil {
				t.Fatal(err)
			}
			pid := n.pid(gpuA)
			if pid == 0 {
				t.Fatal("no daemon after the first claim")
			}
			if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err != nil || root != host {
				t.Errorf("daemon's root %q (%v), want the host's root %s", root, err, host)
			}
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if want := prefix + "/" + mpssim.PrefixControlRel; !strings.Contains(string(cmdline), want) {
				t.Errorf("daemon's command line %q, want the prefix's %s", cmdline, want)
			}
			env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			if want := "LD_LIBRARY_PATH=" + prefix + "/lib64"; !slices.Contains(strings.Split(string(env), "\x00"), want) {
				t.Errorf("daemon's environment %q: want %s", env, want)
			}
			if got := n.log(gpuA, "startup"); len(got) != 1 || !strings.Contains(got[0], "libcuda="+prefix+"/lib64/libcuda.so.1") {
				t.Errorf("startup log %q: want the prefix's libcuda.so.1 found", got)
			}
			dirs := m.DirsOf(gpuA)
			if _, err := os.Stat(filepath.Join(dirs.Shm, fmt.Sprintf("%s.%d", mpssim.ShmMarker, pid))); err != nil {
				t.Errorf("the daemon's /dev/shm is not the GPU's shm tmpfs: %v", err)
			}
			// The tmpfs over the host root's /tmp stayed in the daemon's
			// namespace.
			if entries, _ := os.ReadDir(filepath.Join(host, "tmp")); len(entries) != 0 {
				t.Errorf("the host root's /tmp holds %d entries in this namespace, want none", len(entries))
			}
			if err := m.Release(ctx, "claim-1"); err != nil {
				t.Fatal(err)
			}
			if n.pid(gpuA) != 0 || len(n.log(gpuA, "quit")) != 1 {
				t.Errorf("after the last claim: daemon %d, quit log %q; want it stopped by quit", n.pid(gpuA), n.log(gpuA, "quit"))
			}
		})
	}
}
