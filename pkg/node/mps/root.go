package mps

import (
	"github.com/facet-gpu/facet/pkg/node/driverroot"
)

// control is nvidia-cuda-mps-control to pkg/node/driverroot: a root it
// runs chrooted in needs /tmp (the launcher's tmpfs, holding the pipe and
// log directories) and /dev/shm (the GPU's shm tmpfs is bound there).
var control = driverroot.Program{
	Name:         ControlName,
	Service:      "MPS",
	Dirs:         []string{"tmp", "dev/shm"},
	HostRootHint: "facet-mps --host-root, which the chart sets where kubeletPlugin.driver.root is not /; facetctl node-check --host-root /; docs/mps.md",
}

// FindControl returns nvidia-cuda-mps-control's path inside driverRoot
// ("/usr/bin/nvidia-cuda-mps-control"), which is where the daemon, chrooted
// into the driver root, runs it from; or an error naming where it looked
// (driverroot.Program.Find).
func FindControl(driverRoot string) (string, error) {
	return control.Find(driverRoot)
}

// CheckRoot says whether the control program (a path inside root) can run
// chrooted into root: /tmp and /dev/shm directories to hold the GPU's MPS
// directories, and the program's interpreter in it
// (driverroot.Program.CheckRoot). The error names the root and everything
// it lacks.
func CheckRoot(root, controlPath string) error {
	return control.CheckRoot(root, controlPath)
}

// Layout is where and how the daemons run a driver's control program
// (Locate).
type Layout struct {
	// Root is the root the daemons are chrooted into, as this process
	// sees it: the driver root itself, or, for a driver under a prefix
	// of its own, the host's root.
	Root string
	// Control is the control program's path inside Root:
	// "/usr/bin/nvidia-cuda-mps-control", or under a prefix
	// "/usr/local/nvidia/bin/nvidia-cuda-mps-control".
	Control string
	// LibraryPath is the daemons' LD_LIBRARY_PATH, a directory inside
	// Root: under a prefix, the one that holds its driver libraries
	// ("/usr/local/nvidia/lib64"); empty when Root is the driver root,
	// whose own loader finds them.
	LibraryPath string
	// Prefix is the driver root's path inside Root: "/" when the daemons
	// are chrooted into the driver root.
	Prefix string
}

// Locate finds the control program in driverRoot and says where it runs:
// chrooted into driverRoot, or, for a driver under a prefix of its own
// (GKE's /home/kubernetes/bin/nvidia, /usr/local/nvidia), into hostRoot
// with the prefix's libraries (driverroot.Program.Locate, which gives the
// rules, why they depart from NVIDIA's, and the errors). Both roots are
// paths as this process sees them; hostRoot is "" when there is none.
func Locate(driverRoot, hostRoot string) (Layout, error) {
	l, err := control.Locate(driverRoot, hostRoot)
	if err != nil {
		return Layout{}, err
	}
	return Layout{Root: l.Root, Control: l.Path, LibraryPath: l.LibraryPath, Prefix: l.Prefix}, nil
}
