package nvmlgpu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindDriverLibrary lays out the driver roots users have, each with
// libnvidia-ml.so.1 a symlink to the versioned file as the installer
// leaves it, and finds NVML in each.
func TestFindDriverLibrary(t *testing.T) {
	const version = "580.159.04"
	for _, tc := range []struct {
		name    string
		libDir  string // relative to the root; "" lays out no library
		other   string // a file that must not be taken for NVML
		want    string // relative to the root
		wantErr []string
	}{
		{name: "host root, Debian multiarch", libDir: "usr/lib/x86_64-linux-gnu", want: "usr/lib/x86_64-linux-gnu/libnvidia-ml.so." + version},
		{name: "GPU Operator, RHEL image", libDir: "usr/lib64", want: "usr/lib64/libnvidia-ml.so." + version},
		{name: "/usr/local/nvidia with lib64", libDir: "lib64", want: "lib64/libnvidia-ml.so." + version},
		{name: "arm64 multiarch", libDir: "usr/lib/aarch64-linux-gnu", want: "usr/lib/aarch64-linux-gnu/libnvidia-ml.so." + version},
		{name: "Debian's nvidia/current", libDir: "usr/lib/x86_64-linux-gnu/nvidia/current", want: "usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so." + version},
		{
			name:    "no driver",
			other:   "usr/lib/x86_64-linux-gnu/libcuda.so.1",
			wantErr: []string{"libnvidia-ml.so.1 not found in driver root", "lib64", "ld.so.cache"},
		},
		{
			name:    "outside the searched directories",
			libDir:  "opt/nvidia/lib",
			wantErr: []string{"libnvidia-ml.so.1 not found in driver root"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.libDir != "" {
				dir := filepath.Join(root, tc.libDir)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "libnvidia-ml.so."+version), []byte("ELF"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("libnvidia-ml.so."+version, filepath.Join(dir, NVMLLibrary)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.other != "" {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, tc.other)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, tc.other), nil, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			// A trailing slash, as a value may carry.
			got, err := FindDriverLibrary(root+"/", NVMLLibrary)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("found %s, want an error", got)
				}
				for _, s := range append(tc.wantErr, root) {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(root, tc.want); got != want {
				t.Errorf("found %s, want %s", got, want)
			}
		})
	}
	if _, err := FindDriverLibrary("run/nvidia/driver", NVMLLibrary); err == nil || !strings.Contains(err.Error(), `"run/nvidia/driver" is not an absolute path`) {
		t.Errorf("relative root: error %v", err)
	}
}

// TestOpenDriverWithoutNVML: a root without the driver is an error naming
// the root, before any library is loaded.
func TestOpenDriverWithoutNVML(t *testing.T) {
	root := t.TempDir()
	_, err := OpenDriver(root, "")
	if err == nil || !strings.Contains(err.Error(), root) || !strings.Contains(err.Error(), NVMLLibrary) {
		t.Fatalf("error %v, want one naming %s and the root %s", err, NVMLLibrary, root)
	}
}
