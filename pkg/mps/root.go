package mps

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// controlDirs are where driver installations put nvidia-cuda-mps-control,
// relative to the driver root: distribution packages and the GPU
// Operator's driver container use usr/bin; runfile installs into
// /usr/local/nvidia keep bin/.
var controlDirs = []string{"usr/bin", "bin", "usr/local/bin"}

// libraryDirs are the driver root's library directories, for the daemon's
// LD_LIBRARY_PATH (it loads libcuda.so.1 from the driver).
var libraryDirs = []string{"usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib64", "lib"}

// FindControl returns nvidia-cuda-mps-control's path under driverRoot and
// the LD_LIBRARY_PATH its daemon needs, or an error naming where it
// looked. driverRoot is where this process reads the driver (in the
// plugin's container, its mount of the host's driver root), and so are
// the paths returned: the daemon runs in this process's mount namespace.
func FindControl(driverRoot string) (control, libraryPath string, err error) {
	for _, dir := range controlDirs {
		p := filepath.Join(driverRoot, dir, ControlName)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			control = p
			break
		}
	}
	if control == "" {
		return "", "", fmt.Errorf("%s not found in %s under driver root %s", ControlName, strings.Join(controlDirs, ", "), driverRoot)
	}
	var libs []string
	for _, dir := range libraryDirs {
		if st, err := os.Stat(filepath.Join(driverRoot, dir)); err == nil && st.IsDir() {
			libs = append(libs, filepath.Join(driverRoot, dir))
		}
	}
	return control, strings.Join(libs, ":"), nil
}
