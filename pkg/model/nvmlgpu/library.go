package nvmlgpu

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/lookup"
	"github.com/go-logr/logr"
)

// Library is an initialised NVML, real or simulated. It is safe for
// concurrent use.
type Library struct {
	lib   nvml.Interface
	sysfs Sysfs

	// gpusMu guards gpus, the per-GPU state of MIG operations (mig.go).
	// It is held only to look an entry up, never across an NVML call.
	gpusMu sync.Mutex
	gpus   map[string]*gpuState

	closeOnce sync.Once
}

// OpenReal loads libnvidia-ml.so.1 (or libraryPath when not empty) and
// initialises it. It fails on a node without the NVIDIA driver.
func OpenReal(libraryPath string) (*Library, error) {
	var opts []nvml.LibraryOption
	if libraryPath != "" {
		opts = append(opts, nvml.WithLibraryPath(libraryPath))
	}
	lib := nvml.New(opts...)
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initialise NVML: %w", nvmlError("nvmlInit", ret))
	}
	return &Library{lib: lib, sysfs: HostSysfs()}, nil
}

// NVMLLibrary is the SONAME of NVML, the library go-nvml loads.
const NVMLLibrary = "libnvidia-ml.so.1"

// OpenDriver is OpenReal with NVML taken from a driver root: libraryPath
// when it is not empty, else NVMLLibrary as FindDriverLibrary finds it under
// driverRoot, the path where this process sees the driver's files (the
// plugin container's mount of the host's driver root).
func OpenDriver(driverRoot, libraryPath string) (*Library, error) {
	if libraryPath == "" {
		var err error
		if libraryPath, err = FindDriverLibrary(driverRoot, NVMLLibrary); err != nil {
			return nil, err
		}
	}
	return OpenReal(libraryPath)
}

// FindDriverLibrary returns the path of the driver library name (a SONAME
// such as libnvidia-ml.so.1) under root, found the way nvcdi finds the
// driver's libraries (lookup.NewLibraryLocator of the NVIDIA Container
// Toolkit): first in the root itself and in its /usr/lib64,
// /usr/lib/<triplet>, /lib64 and /lib/<triplet> (with their
// nvidia/current), then in the root's /etc/ld.so.cache. So a driver in the
// host's /, the GPU Operator's /run/nvidia/driver (usr/lib/<triplet>) and
// one under /usr/local/nvidia (lib64) are all found. Symlinks are resolved:
// the path is that of the file, e.g. <root>/usr/lib64/libnvidia-ml.so.580.95.05.
//
// It fails, naming the root, when root is not an absolute directory or the
// library is in none of those places.
func FindDriverLibrary(root, name string) (string, error) {
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("driver root %q is not an absolute path", root)
	}
	root = filepath.Clean(root)
	loc := lookup.NewLibraryLocator(lookup.WithLogger(nvcdiLogger{logr.Discard()}), lookup.WithRoot(root))
	found, err := loc.Locate(name)
	if err == nil && len(found) == 0 {
		err = lookup.ErrNotFound
	}
	if err != nil {
		if errors.Is(err, lookup.ErrNotFound) {
			return "", fmt.Errorf("%s not found in driver root %s (searched it, its usr/lib64, usr/lib/<triplet>, lib64, lib/<triplet> and its etc/ld.so.cache): is the NVIDIA driver installed there?", name, root)
		}
		return "", fmt.Errorf("find %s in driver root %s: %w", name, root, err)
	}
	return found[0], nil
}

// New wraps an NVML implementation other than the real library: the
// simulator (internal/nvml/sim) hands its go-nvml mock server in here, so the
// simulated node goes through the same discovery and MIG code as a real one.
// sysfs answers for the GPUs' PCI devices (the simulator's from its machine
// file). lib must be initialised.
func New(lib nvml.Interface, sysfs Sysfs) *Library {
	return &Library{lib: lib, sysfs: sysfs}
}

// Discover reads the node's driver and GPUs.
func (l *Library) Discover() (*Node, error) {
	return discover(l.lib, l.sysfs)
}

// Close shuts NVML down. Safe to call more than once.
func (l *Library) Close() error {
	var err error
	l.closeOnce.Do(func() {
		err = nvmlError("nvmlShutdown", l.lib.Shutdown())
	})
	return err
}
