package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/facet-gpu/facet/internal/nvml/sim"
	"github.com/facet-gpu/facet/pkg/model/nodemodel"
	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

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
