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
)

func runSlices(args []string) error {
	fs := flag.NewFlagSet("slices", flag.ExitOnError)
	machine := fs.String("machine", "", "machine file of a simulated node (default: the real NVML of this host)")
	node := fs.String("node", "", "node name: the pool's name and the slices' nodeName (required)")
	gates := fs.String("feature-gates", "", "the cluster's DRA feature gates, as for the plugin (DRAPartitionableDevices=true,...); a gate not named is off, as on stock Kubernetes 1.35. Without this flag every gate is on")
	version := fs.String("kubernetes-version", "v1.35.4", "with --feature-gates: the cluster's Kubernetes version (the default mode depends on it)")
	layouts := fs.String("mig-layouts", "", "preview MIG layouts on static-mig GPUs, as the plugin's --mig-layouts would carve them on idle GPUs")
	computeDomains := fs.String("compute-domains", "auto", "the plugin's --compute-domains: auto (the node's IMEX channel device, where its driver offers channels, simulated or read from /proc, and its GPUs report one fabric clique) or off")
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
	switch *computeDomains {
	case "auto":
		if cfg.IMEXChannels, err = imexChannels(*machine); err != nil {
			return err
		}
	case "off":
	default:
		return fmt.Errorf("--compute-domains=%q: want auto or off", *computeDomains)
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
	if inv.IMEXNote != "" {
		fmt.Fprintln(os.Stderr, "# note:", inv.IMEXNote)
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

// imexChannels are the IMEX channels of the simulated driver for a
// machine file, else of this host's driver (/proc).
func imexChannels(machine string) (*nvmlgpu.IMEXChannels, error) {
	if machine != "" {
		major, count := sim.SimulatedIMEXChannels()
		return &nvmlgpu.IMEXChannels{Major: major, Count: count, CountFrom: "simulated driver"}, nil
	}
	return nvmlgpu.ReadIMEXChannels(nvmlgpu.DefaultProcRoot)
}
