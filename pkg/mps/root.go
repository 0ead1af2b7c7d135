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

// FindControl returns nvidia-cuda-mps-control's path inside driverRoot
// ("/usr/bin/nvidia-cuda-mps-control"), which is where the daemon, chrooted
// into the driver root, runs it from; or an error naming where it looked.
// driverRoot is the driver root as this process sees it (in a container,
// its mount of the host's).
func FindControl(driverRoot string) (string, error) {
	for _, dir := range controlDirs {
		p := filepath.Join(driverRoot, dir, ControlName)
		// An absolute symbolic link on the way resolves against this
		// process's root, not the driver root's; Stat is a first check,
		// and the chrooted exec the one that counts.
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return "/" + dir + "/" + ControlName, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s under driver root %s", ControlName, strings.Join(controlDirs, ", "), driverRoot)
}
