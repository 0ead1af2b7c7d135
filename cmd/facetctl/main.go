// Command facetctl is the operator's CLI for Facet.
//
//	facetctl slices --machine FILE --node NAME   print the node's ResourceSlices
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/features"
	"github.com/facet-gpu/facet/pkg/model/inventory"
	"github.com/facet-gpu/facet/pkg/model/names"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
	"github.com/facet-gpu/facet/pkg/model/sharemem"
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
           instances, vGPU shares and slots, memory and SM used and free
           (-o table, picture or yaml)
  classes  print DeviceClasses that name every shape the nodes publish
           (whole GPUs per product family, MIG profiles, vGPU slot and share
           sizes), for quota by class with Kueue (docs/kueue.md)
  fit      run the scheduler's allocator offline: does a claim (or a pod's
           claims) fit, where, and, where not, why (-f FILE)
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

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "slices":
		err = runSlices(os.Args[2:])
	case "features":
		err = runFeatures(os.Args[2:])
	case "occupancy":
		err = runOccupancy(os.Args[2:])
	case "fit":
		err = runFit(os.Args[2:])
	case "classes":
		err = runClasses(os.Args[2:])
	case "topo":
		err = runTopo(os.Args[2:])
	case "top":
		err = runTop(os.Args[2:], os.Stdout)
	case "fault":
		err = runFault(os.Args[2:])
	case "health":
		err = runHealth(os.Args[2:])
	case "mig-instances":
		err = runMIGInstances(os.Args[2:])
	case "sim-driver-root":
		err = runSimDriverRoot(os.Args[2:])
	case "node-check":
		err = runNodeCheck(os.Args[2:], os.Stdout, os.Stderr)
	case "node-check-all":
		err = runNodeCheckAll(os.Args[2:], os.Stdout)
	case "node-cleanup":
		err = runNodeCleanup(os.Args[2:], os.Stdout)
	case "install-cdi-hook":
		err = runInstallCDIHook(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "facetctl: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
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

func runSlices(args []string) error {
	fs := flag.NewFlagSet("slices", flag.ExitOnError)
	machine := fs.String("machine", "", "machine file of a simulated node (default: the real NVML of this host)")
	node := fs.String("node", "", "node name: the pool's name and the slices' nodeName (required)")
	gates := fs.String("feature-gates", "", "the cluster's DRA feature gates, as for the plugin (DRAPartitionableDevices=true,...); a gate not named is off, as on stock Kubernetes 1.35. Without this flag every gate is on")
	version := fs.String("kubernetes-version", "v1.35.4", "with --feature-gates: the cluster's Kubernetes version (the default mode depends on it)")
	layouts := fs.String("mig-layouts", "", "preview MIG layouts on static-mig GPUs, as the plugin's --mig-layouts would carve them on idle GPUs")
	mpsState := fs.String("mps", "auto", "the node's MPS, as its shares and slots publish it: auto (facet-mps answers: computePartitioning mps), down (--mps=auto, facet-mps not answering: time-sliced) or off (--mps=off: time-sliced, and no MPS server memory kept out of shares)")
	var modes inventory.ModeFlags
	modes.Register(fs)
	fs.Parse(args)
	if *node == "" {
		return fmt.Errorf("--node is required")
	}
	cfg, err := modes.Config()
	if err != nil {
		return err
	}
	partitioning := names.PartitioningTimeSliced
	switch *mpsState {
	case "auto":
		partitioning = names.PartitioningMPS
		fallthrough
	case "down":
		// As the plugin: kept out wherever MPS is configured, whether
		// facet-mps answers or not.
		cfg.MPSReserveBytes = sharemem.MPSServerBytes
	case "off":
	default:
		return fmt.Errorf("--mps=%q: want auto, down or off", *mpsState)
	}
	var set features.Set
	gatesGiven := false
	fs.Visit(func(f *flag.Flag) { gatesGiven = gatesGiven || f.Name == "feature-gates" })
	if gatesGiven {
		overrides, err := features.ParseOverrides(*gates)
		if err != nil {
			return err
		}
		set = features.Stock("off unless named").Apply(overrides)
		set.ServerVersion = *version
		cfg.Features = &set
	}
	lib, err := openLibrary(*machine)
	if err != nil {
		return err
	}
	defer lib.Close()
	perGPU, err := inventory.ParsePerGPU(*layouts, "layout", func(s string) (string, error) { return s, nil })
	if err != nil {
		return fmt.Errorf("--mig-layouts: %w", err)
	}
	_, inv, err := nodemodel.Assemble(lib, cfg, perGPU)
	if err != nil {
		return err
	}
	for _, n := range inv.Notes {
		fmt.Fprintln(os.Stderr, "# note:", n)
	}
	inv.ComputePartitioning = partitioning
	objs := resourceslices.Objects(resourceslices.Resources(inv, *node), *node)
	if gatesGiven {
		if errs := resourceslices.Dropped(objs, set); len(errs) > 0 {
			return fmt.Errorf("internal error: %v", errors.Join(errs...))
		}
	}
	return writeSlices(os.Stdout, objs)
}

// writeSlices prints slices as a YAML stream, with a comment above each
// counter-only slice that says why it has no devices.
func writeSlices(w io.Writer, objs []*resourceapi.ResourceSlice) error {
	return resourceslices.WriteYAML(w, objs, true)
}

func runFeatures(args []string) error {
	fs := flag.NewFlagSet("features", flag.ExitOnError)
	kube := kubeFlag(fs)
	node := fs.String("node", "facetctl-probe", "node name the probe ResourceSlice names (nothing is created: dry-run)")
	fs.Parse(args)
	client, err := kube.Client()
	if err != nil {
		return err
	}
	s, err := features.Detect(context.Background(), client, *node)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Kubernetes %s\n\nGATE\tENFORCED\tHOW KNOWN\n", s.ServerVersion)
	for _, g := range features.Gates {
		fmt.Fprintf(w, "%s\t%t\t%s\n", g, s.Enabled[g], s.Source[g])
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Printf("\n%s\n\nThe plugin's --feature-gates (to pin this): %s\n", s.Describe(), s)
	return nil
}

func openLibrary(machine string) (*nvmlgpu.Library, error) {
	if machine != "" {
		return sim.OpenMachine(machine)
	}
	return nvmlgpu.OpenReal("")
}

func runSimDriverRoot(args []string) error {
	fs := flag.NewFlagSet("sim-driver-root", flag.ExitOnError)
	machine := fs.String("machine", "", "machine file (required)")
	root := fs.String("root", "", "directory to lay the driver root out in (required); re-running converges it")
	hamiLib := fs.String("hami-library", "", "also write a stand-in libvgpu.so (HAMi-core) at this path")
	fs.Parse(args)
	if *machine == "" || *root == "" {
		return fmt.Errorf("--machine and --root are required")
	}
	version, gpus, err := layoutSimulatedRoot(*machine, *root)
	if err != nil {
		return err
	}
	if *hamiLib != "" {
		if err := sim.WriteSimulatedHAMiCore(*hamiLib); err != nil {
			return err
		}
	}
	fmt.Printf("simulated driver %s root for %d GPUs at %s\n", version, gpus, *root)
	return nil
}

// layoutSimulatedRoot lays out the simulated driver root of a machine
// file at root, and returns its driver version and GPU count.
func layoutSimulatedRoot(machine, root string) (string, int, error) {
	lib, err := sim.OpenMachine(machine)
	if err != nil {
		return "", 0, err
	}
	defer lib.Close()
	node, err := nodemodel.Discover(lib)
	if err != nil {
		return "", 0, err
	}
	minors := make([]int, 0, len(node.GPUs))
	for _, g := range node.GPUs {
		minors = append(minors, g.Minor)
	}
	if err := sim.LayoutDriverRoot(root, node.DriverVersion, minors); err != nil {
		return "", 0, err
	}
	return node.DriverVersion, len(minors), nil
}

func runMIGInstances(args []string) error {
	fs := flag.NewFlagSet("mig-instances", flag.ExitOnError)
	machine := fs.String("machine", "", "machine file of a simulated node (default: the demo node's in --run-dir, else the real NVML of this host)")
	state := fs.String("nvml-state", "", "with --machine: the plugin's simulated NVML state file (<state-dir>/simulated-nvml.json)")
	runDir := fs.String("run-dir", defaultRunDir(), "without --machine: the demo node's run directory (make demo's RUN_DIR), searched for its machine file and NVML state")
	fs.Parse(args)
	var lib *nvmlgpu.Library
	var err error
	switch {
	case *machine != "" && *state != "":
		lib, err = sim.OpenMachine(*machine, sim.WithStateFile(*state))
	case *machine != "":
		return fmt.Errorf("--machine needs --nvml-state: a simulated node's instances live in the plugin's state file")
	case *state != "":
		return fmt.Errorf("--nvml-state needs --machine: the state file holds the instances, the machine file the GPUs")
	default:
		var demo demoNode
		demo, err = findDemoNode(*runDir)
		switch {
		case err == nil:
			fmt.Fprintf(os.Stderr, "facetctl mig-instances: the demo node's machine file %s and NVML state %s\n", demo.machine, demo.state)
			lib, err = sim.OpenMachine(demo.machine, sim.WithStateFile(demo.state))
		case errors.Is(err, errNoDemoNode):
			var realErr error
			if lib, realErr = nvmlgpu.OpenReal(""); realErr != nil {
				return fmt.Errorf("no NVML on this host (%v), and %w; pass --machine FILE --nvml-state FILE, or --run-dir DIR", realErr, err)
			}
			err = nil
		}
	}
	if err != nil {
		return err
	}
	defer lib.Close()
	instances, err := lib.ListMIG()
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "GPU\tPROFILE\tPLACEMENT\tGI\tCI\tUUID")
	for _, in := range instances {
		fmt.Fprintf(w, "%d\t%s\t%d:%d\t%d\t%d\t%s\n", in.ParentIndex, in.Profile, in.Placement.Start, in.Placement.Size, in.GIID, in.CIID, in.UUID)
	}
	return w.Flush()
}
