package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
	"github.com/facet-gpu/facet/pkg/model/resourceslices"
)

func runTopo(args []string) error {
	fs := flag.NewFlagSet("topo", flag.ExitOnError)
	machine := fs.String("machine", "", "machine file of a simulated node (default: the real NVML of this host)")
	fs.Parse(args)
	lib, err := openLibrary(*machine)
	if err != nil {
		return err
	}
	defer lib.Close()
	node, err := lib.Discover()
	if err != nil {
		return err
	}
	return printTopo(os.Stdout, node)
}

// printTopo prints the node's GPU matrix as `nvidia-smi topo -m` does (NV#
// where NVLink joins two GPUs, else their closest common PCIe ancestor),
// its legend, and each GPU's published topology attributes.
func printTopo(out io.Writer, node *nvmlgpu.Node) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	header := []string{""}
	for _, g := range node.GPUs {
		header = append(header, fmt.Sprintf("GPU%d", g.Index))
	}
	fmt.Fprintln(w, strings.Join(append(header, "NUMA Affinity"), "\t"))
	for i, g := range node.GPUs {
		row := []string{fmt.Sprintf("GPU%d", g.Index)}
		for j := range node.GPUs {
			row = append(row, topoCell(node, i, j))
		}
		numa := "N/A"
		if g.NUMANode >= 0 {
			numa = fmt.Sprint(g.NUMANode)
		}
		fmt.Fprintln(w, strings.Join(append(row, numa), "\t"))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprint(out, `
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  BRD  = On one board (NVML_TOPOLOGY_INTERNAL)
  NV#  = Connection traversing a bonded set of # NVLinks
  ?    = NVML does not say

`)
	for _, g := range node.GPUs {
		attrs := resourceslices.TopologyAttributes(&g)
		fmt.Fprintf(out, "GPU%d %s %s\n", g.Index, g.PCIBusID, g.UUID)
		if len(attrs) == 0 {
			fmt.Fprintln(out, "  (no topology attributes)")
		}
		for _, k := range slices.Sorted(maps.Keys(attrs)) {
			a := attrs[k]
			v := ""
			switch {
			case a.StringValue != nil:
				v = *a.StringValue
			case a.IntValue != nil:
				v = fmt.Sprint(*a.IntValue)
			case a.BoolValue != nil:
				v = fmt.Sprint(*a.BoolValue)
			}
			fmt.Fprintf(out, "  %s: %s\n", k, v)
		}
	}
	return nil
}

func topoCell(node *nvmlgpu.Node, i, j int) string {
	if i == j {
		return "X"
	}
	if i >= len(node.Pairs) || j >= len(node.Pairs[i]) {
		return "?"
	}
	p := node.Pairs[i][j]
	switch {
	case p.NVLinks > 0:
		return fmt.Sprintf("NV%d", p.NVLinks)
	case p.Ancestor != nvmlgpu.TopologyUnknown:
		return string(p.Ancestor)
	}
	return "?"
}
