// Command facetctl is the operator's CLI for Facet.
//
//	facetctl slices --machine FILE --node NAME   print the node's ResourceSlices
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/facet-gpu/facet/pkg/node/nodecheck"
)

const usage = `facetctl: Facet's operator CLI

Commands:
  slices   print, as a YAML stream, the ResourceSlices the kubelet plugin
           publishes for a node (simulated with --machine, else real NVML),
           on a cluster with the given --feature-gates
  features ask a cluster's API server which DRA features it enforces, as the
           kubelet plugin does at start
  occupancy
           show what each GPU holds: its mode, health, whole-GPU claim, MIG
           instances, vGPU shares and slots, memory and SM used and free;
           the NVLink fabric cliques' free IMEX channels, and each
           ComputeDomain's clique and ready daemons (-o table, picture or yaml)
  classes  print DeviceClasses that name every shape the nodes publish
           (whole GPUs per product family, MIG profiles, vGPU slot and share
           sizes), for quota by class with Kueue (docs/kueue.md)
  fit      run the scheduler's allocator offline: does a claim (or a pod's
           claims) fit, where, and, where not, why (-f FILE); for a pod of a
           ComputeDomain, its domain's clique and free IMEX channels
  top      who uses what: each prepared claim's devices, shape, memory
           used and allocated, compute allocated, from the kubelet plugins'
           /metrics (through the API server's pod proxy)
  topo     print the GPU topology matrix as nvidia-smi topo -m does (NVLink,
           PCIe switch, host bridge, NUMA node) and each GPU's published
           topology attributes (simulated with --machine, else real NVML)

  fault    (simulated nodes) inject a GPU fault, or clear it as a reset
           would: fault inject --gpu 1 --kind xid --xid 79; fault clear --gpu 1
  health   health recover --node NODE --gpu UUID|INDEX|all: ask the node's
           plugin to offer a GPU with a fault again, once it is fixed

  mig-instances
           list the MIG instances carved on the node's GPUs (real NVML, or a
           simulated machine with the plugin's NVML state file)
  node-check
           on a GPU node: prepare a whole GPU, a vGPU share and a slot with
           the plugin's code in scratch directories, run a CUDA probe in each
           claim's environment, and print what each delivers against what
           it publishes; unprepares and leaves nothing behind (--machine:
           every step but the probe)
  node-check-all
           run node-check in every GPU node's kubelet plugin pod, through the
           API server (pods/exec), on an idle GPU of each: memory only unless
           --seconds; fails naming the nodes that do not deliver what they
           publish, with their reports (the chart's helm test)
  node-cleanup
           after helm uninstall, remove the files Facet left on a node (CDI
           specs, checkpoint, sockets, HAMi-core, MPS directories, the
           installed nvidia-cdi-hook); refuses while claims are prepared.
           --node runs it there in a pod of its own
  imex-channels
           on a GPU node: the driver's IMEX channels as the plugin reads them
           (the nvidia-caps-imex-channels major in /proc/devices, the
           ImexChannelCount in /proc/driver/nvidia/params), and the host's
           channel device nodes checked against them; reads only
  install-cdi-hook
           copy the image's nvidia-cdi-hook onto the node (--dir), where the
           CDI specs' hooks run it, and check that it runs (the chart's init
           container)
  sim-driver-root
           lay out a simulated NVIDIA driver root (libraries, binaries,
           device nodes) for a machine file, for demos and tests

Run 'facetctl COMMAND -h' for a command's flags.

facetctl links Facet's GPU simulator, which the shipped daemons do not: the
commands that take --machine (slices, fit, topo, mig-instances, fault,
node-check) and sim-driver-root preview a machine file with it.
`

// commands are facetctl's commands by name, each given the arguments after
// its name; usage describes each of them (TestUsageNamesEveryCommand).
var commands = map[string]func(args []string) error{
	"slices":           runSlices,
	"features":         runFeatures,
	"occupancy":        runOccupancy,
	"fit":              runFit,
	"classes":          runClasses,
	"topo":             runTopo,
	"top":              func(args []string) error { return runTop(args, os.Stdout) },
	"fault":            runFault,
	"health":           runHealth,
	"mig-instances":    runMIGInstances,
	"sim-driver-root":  runSimDriverRoot,
	"node-check":       func(args []string) error { return runNodeCheck(args, os.Stdout, os.Stderr) },
	"node-check-all":   func(args []string) error { return runNodeCheckAll(args, os.Stdout) },
	"node-cleanup":     func(args []string) error { return runNodeCleanup(args, os.Stdout) },
	"install-cdi-hook": runInstallCDIHook,
	"imex-channels":    func(args []string) error { return runIMEXChannels(args, os.Stdout) },
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if a := os.Args[1]; a == "-h" || a == "--help" || a == "help" {
		fmt.Print(usage)
		return
	}
	run, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "facetctl: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	err := run(os.Args[2:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if errors.Is(err, errNoFit) {
		os.Exit(3)
	}
	if errors.Is(err, nodecheck.ErrNoIdleGPU) {
		// node-check-all tells a busy node (skipped) from a failed one.
		fmt.Fprintf(os.Stderr, "facetctl %s: %v\n", os.Args[1], err)
		os.Exit(exitNoIdleGPU)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "facetctl %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// openInput opens the file a command's flag names, or standard input for
// "-", which closing the result leaves open.
func openInput(name string) (io.ReadCloser, error) {
	if name == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	return os.Open(name)
}
