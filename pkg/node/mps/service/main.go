package service

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// bootIDPath is the kernel's boot ID, new at every boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// Flags are facet-mps's command line.
type Flags struct {
	Root, HostRoot, Dir, ShmSize string
	StopTimeout                  time.Duration
	// Probe, when set, asks the running facet-mps for its info and exits
	// 0 if it answers (the chart's probes).
	Probe bool
}

// AddFlags registers the flags.
func (f *Flags) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.Root, "driver-root", "/driver-root", "the host's driver root as this process sees it; each MPS control daemon runs chrooted into it, or, for a driver under a prefix of its own (no loader, libc, /tmp or /dev/shm in it), into --host-root, of which it must then be a directory")
	fs.StringVar(&f.HostRoot, "host-root", "", "the host's / as this process sees it (the chart mounts it at /host where kubeletPlugin.driver.root is not /), for a driver under a prefix: its daemons run chrooted there with the host's loader and libc, executing <prefix>/bin/nvidia-cuda-mps-control with LD_LIBRARY_PATH the prefix's library directory; empty: none")
	fs.StringVar(&f.Dir, "mps-dir", "/run/facet/mps", "host directory (a tmpfs) of the per-GPU MPS pipe, log and shared-memory directories and of the socket (facet-mps.sock); the same path here as on the host, and the kubelet plugin's --mps-dir")
	fs.StringVar(&f.ShmSize, "shm-size", "1Gi", "size of each GPU's /dev/shm tmpfs, which its MPS daemon, servers and every share of the GPU share (a Kubernetes quantity)")
	fs.DurationVar(&f.StopTimeout, "stop-timeout", 10*time.Second, "how long a daemon gets to start, and to quit before it is killed")
	fs.BoolVar(&f.Probe, "probe", false, "ask the facet-mps serving --mps-dir whether it answers, print what it serves, and exit (the chart's probes)")
}

// ShmBytes is --shm-size in bytes.
func (f *Flags) ShmBytes() (int64, error) {
	q, err := resource.ParseQuantity(f.ShmSize)
	if err != nil || q.Value() <= 0 {
		return 0, fmt.Errorf("--shm-size=%q: want a positive quantity such as 1Gi (%v)", f.ShmSize, err)
	}
	return q.Value(), nil
}

// Main runs facet-mps, or the probe, until ctx ends.
func Main(ctx context.Context, f Flags) error {
	if f.Probe {
		// Serving is alive, control program or not: a node whose driver
		// has no MPS keeps a facet-mps that says so, and the plugin
		// time-slices its shares.
		info, err := NewClient(f.Dir).Info(ctx)
		if err != nil {
			return err
		}
		if info.Control == "" {
			fmt.Printf("facet-mps %s serves %s; no MPS control program in %s: %s\n", info.Instance, info.Dir, info.Root, info.ControlError)
			return nil
		}
		if info.HostRoot != "" {
			fmt.Printf("facet-mps %s serves %s with %s in %s, run from the host's root %s\n", info.Instance, info.Dir, info.Control, info.Root, info.HostRoot)
			return nil
		}
		fmt.Printf("facet-mps %s serves %s with %s in %s\n", info.Instance, info.Dir, info.Control, info.Root)
		return nil
	}
	size, err := f.ShmBytes()
	if err != nil {
		return err
	}
	boot, err := os.ReadFile(bootIDPath)
	if err != nil {
		return fmt.Errorf("read the boot ID, which tells a daemon record of this boot from an older one: %w", err)
	}
	s, err := NewServer(Config{Root: f.Root, HostRoot: f.HostRoot, Dir: f.Dir, ShmSize: size, BootID: strings.TrimSpace(string(boot)), StopTimeout: f.StopTimeout})
	if err != nil {
		return err
	}
	return s.Run(ctx)
}
