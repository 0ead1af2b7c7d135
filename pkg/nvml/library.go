package nvml

import (
	"fmt"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Library is an initialised NVML, real or simulated. It is safe for
// concurrent use.
type Library struct {
	lib   gonvml.Interface
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
	var opts []gonvml.LibraryOption
	if libraryPath != "" {
		opts = append(opts, gonvml.WithLibraryPath(libraryPath))
	}
	lib := gonvml.New(opts...)
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("initialise NVML: %w", nvmlError("nvmlInit", ret))
	}
	return &Library{lib: lib, sysfs: HostSysfs()}, nil
}

// New wraps an NVML implementation other than the real library: the
// simulator (pkg/nvml/sim) hands its go-nvml mock server in here, so the
// simulated node goes through the same discovery and MIG code as a real one.
// sysfs answers for the GPUs' PCI devices (the simulator's from its machine
// file). lib must be initialised.
func New(lib gonvml.Interface, sysfs Sysfs) *Library {
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
