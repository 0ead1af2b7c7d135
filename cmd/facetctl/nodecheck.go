package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/node/checkpoint"
	"github.com/facet-gpu/facet/pkg/node/nodecheck"
	"github.com/facet-gpu/facet/pkg/node/nodecheck/probe"
)

// errNodeCheckFailed: the check ran and found a failure or a problem; its
// report says which.
var errNodeCheckFailed = errors.New("the node does not deliver what it publishes (see above)")

// nodeCheckArgs are node-check's flags, once parsed.
type nodeCheckArgs struct {
	machine     *string
	nvmlLib     *string
	gpu         *string
	stateDir    *string
	shareMemory *string
	shareCores  *int64
	slots       *string
	gpuSlots    *string
	driverRoot  *string
	devRoot     *string
	cdiHook     *string
	hamiLib     *string
	seconds     *float64
	scratch     *string
	useMPS      *bool
	hostRoot    *string
	verbose     *bool
}

// nodeCheckFlags is node-check's command line (docs/node-check.md; its
// commands are parsed with it in TestNodeCheckDocCommands).
func nodeCheckFlags(stderr io.Writer) (*flag.FlagSet, *nodeCheckArgs) {
	a := &nodeCheckArgs{}
	fs := flag.NewFlagSet("node-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	a.machine = fs.String("machine", "", "machine file of a simulated node: every step runs except the CUDA probe (default: the real NVML of this host); without --driver-root, the check lays out the machine's simulated driver root in a scratch directory")
	a.nvmlLib = fs.String("nvml-library", "", "path of libnvidia-ml.so.1 (default: found in --driver-root as nvcdi finds the driver's libraries), as the plugin's --nvml-library")
	a.gpu = fs.String("gpu", "0", "NVML index of the GPU to check; it must be idle (no claim, no process) and have MIG mode off. \"idle\": the lowest-indexed GPU with MIG mode off that no claim in the plugin's checkpoint (--state-dir) holds; where there is none the check exits with status 4")
	a.stateDir = fs.String("state-dir", "", "with --gpu idle: the plugin's --state-dir, whose checkpoint says which GPUs hold claims (read only)")
	a.shareMemory = fs.String("share-memory", "2000Mi", "memory of the vGPU share, a Kubernetes quantity in whole MiB")
	a.shareCores = fs.Int64("share-cores", 20, "SM time of the vGPU share in percent (0: best effort)")
	a.slots = fs.String("slots", inventory.DefaultSlotLayout.String(), "the node's slot layout, as the plugin's --slots; the check prepares its smallest slot")
	a.gpuSlots = fs.String("gpu-slots", "", "per-GPU slot layouts, as the plugin's --gpu-slots")
	a.driverRoot = fs.String("driver-root", "/", "host path of the NVIDIA driver's files, as the plugin's --driver-root")
	a.devRoot = fs.String("dev-root", "", "host path whose dev/ holds the NVIDIA device nodes (default: --driver-root), as the plugin's --dev-root")
	a.cdiHook = fs.String("nvidia-cdi-hook", "/usr/bin/nvidia-cdi-hook", "host path of nvidia-cdi-hook, as the plugin's --nvidia-cdi-hook")
	a.hamiLib = fs.String("hami-library", "/var/lib/facet-hami-core/libvgpu.so", "host path of HAMi-core's libvgpu.so, as the plugin's --hami-library (the chart installs it here)")
	a.seconds = fs.Float64("seconds", 10, "how long the compute kernel runs per claim; its throughput is taken over the second half, once HAMi-core's throttle has settled; 0 measures memory only")
	a.scratch = fs.String("scratch-dir", "", "where to make the check's scratch directory (CDI specs, checkpoint, HAMi-core regions), removed at the end (default: $TMPDIR or /tmp)")
	a.useMPS = fs.Bool("mps", true, "partition the share and the slot with MPS, as the plugin does by default: the check runs its own MPS control daemon for the GPU, chrooted into --driver-root (or --host-root for a driver under a prefix), and judges the SMs each client sees; false: time-sliced by HAMi-core")
	a.hostRoot = fs.String("host-root", "", "the host's / as this process sees it (/ on the host), for a driver under a prefix of its own such as /usr/local/nvidia, which has no loader to chroot into: its MPS daemon runs chrooted into --host-root, of which --driver-root must then be a directory, as facet-mps's --host-root; empty: none")
	a.verbose = fs.Bool("v", false, "also print the plugin code's log")
	return fs, a
}

// runNodeCheck is `facetctl node-check`; `facetctl node-check probe` is the
// CUDA probe's process, which the check starts in each claim's environment.
func runNodeCheck(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "probe" {
		return probe.Command(args[1:], stdout)
	}
	fs, a := nodeCheckFlags(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	mem, err := resource.ParseQuantity(*a.shareMemory)
	if err != nil {
		return fmt.Errorf("--share-memory: %w", err)
	}
	layout, err := inventory.ParseSlotLayout(*a.slots)
	if err != nil {
		return fmt.Errorf("--slots: %w", err)
	}
	perGPU, err := inventory.ParsePerGPU(*a.gpuSlots, "layout", inventory.ParseSlotLayout)
	if err != nil {
		return fmt.Errorf("--gpu-slots: %w", err)
	}
	gpu, idle := 0, *a.gpu == "idle"
	switch {
	case idle && *a.stateDir == "":
		return errors.New("--gpu idle needs --state-dir, the plugin's, to tell the GPUs its claims hold")
	case !idle:
		if gpu, err = strconv.Atoi(*a.gpu); err != nil {
			return fmt.Errorf("--gpu %q: want an NVML index or \"idle\"", *a.gpu)
		}
	}
	opts := nodecheck.Options{
		GPU: gpu, ShareMemoryBytes: mem.Value(), ShareCores: *a.shareCores,
		DriverRoot: *a.driverRoot, DevRoot: *a.devRoot, NvidiaCDIHook: *a.cdiHook, HAMiLibrary: *a.hamiLib,
		ScratchParent: *a.scratch, ProbeSeconds: *a.seconds, Log: stderr, MPS: *a.useMPS, HostRoot: *a.hostRoot,
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *a.machine != "" {
		opts.SkipProbe = fmt.Sprintf("simulated GPU (--machine %s): no CUDA device behind it, and its libcuda.so is a stand-in", *a.machine)
		if !set["driver-root"] {
			// The machine's driver is nowhere on this host: the check
			// reads a simulated root, as the simulated node's plugin does.
			root, err := os.MkdirTemp(*a.scratch, "facet-node-check-driver-root-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(root)
			version, _, err := layoutSimulatedRoot(*a.machine, root)
			if err != nil {
				return fmt.Errorf("lay out the simulated driver root of %s (or pass --driver-root): %w", *a.machine, err)
			}
			opts.DriverRoot, opts.DevRoot = root, root
			if !set["hami-library"] {
				opts.HAMiLibrary = filepath.Join(root, "hami", "libvgpu.so")
				if err := sim.WriteSimulatedHAMiCore(opts.HAMiLibrary); err != nil {
					return err
				}
			}
			fmt.Fprintf(stderr, "simulated driver %s root at %s, HAMi-core %s (--machine without --driver-root)\n", version, root, opts.HAMiLibrary)
		}
		opts.Library, err = openLibrary(*a.machine)
	} else {
		self, exeErr := os.Executable()
		if exeErr != nil {
			return fmt.Errorf("find facetctl's own path for the probe process: %w", exeErr)
		}
		opts.Prober = nodecheck.ExecProber{Path: self, Args: []string{"node-check", "probe"}}
		opts.Library, err = nvmlgpu.OpenDriver(*a.driverRoot, *a.nvmlLib)
	}
	if err != nil {
		return err
	}
	defer opts.Library.Close()
	if idle {
		if opts.GPU, err = pickIdleGPU(opts.Library, *a.stateDir); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "GPU %d is idle: MIG mode off, and no claim in %s holds it\n", opts.GPU, filepath.Join(*a.stateDir, "claims"))
	}
	opts.Slots = layout
	if l, ok := perGPU[opts.GPU]; ok {
		opts.Slots = l
	}
	// Ctrl-C stops the probe, and the claims are still unprepared.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := logr.Discard()
	if *a.verbose {
		logger = klog.Background()
	}
	rep, err := nodecheck.Run(klog.NewContext(ctx, logger), opts)
	if rep != nil {
		fmt.Fprintln(stdout)
		if werr := rep.WriteTable(stdout); werr != nil {
			return werr
		}
	}
	if err != nil {
		return err
	}
	if rep.Failed() {
		return errNodeCheckFailed
	}
	return nil
}

// pickIdleGPU is --gpu idle: nodecheck.IdleGPU over the node lib sees and
// the claims of the plugin's checkpoint under stateDir, read without
// opening it (the plugin keeps it open).
func pickIdleGPU(lib *nvmlgpu.Library, stateDir string) (int, error) {
	node, err := nodemodel.Discover(lib)
	if err != nil {
		return 0, err
	}
	claims, corrupt, err := checkpoint.PeekAll(filepath.Join(stateDir, "claims"))
	if err != nil {
		return 0, fmt.Errorf("--state-dir %s: %w", stateDir, err)
	}
	return nodecheck.IdleGPU(node, claims, corrupt)
}
