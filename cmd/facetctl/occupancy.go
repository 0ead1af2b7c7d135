package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/facet-gpu/facet/pkg/cluster/occupancy"
)

func runOccupancy(args []string) error {
	fs := flag.NewFlagSet("occupancy", flag.ExitOnError)
	kube := kubeFlag(fs)
	node := fs.String("node", "", "show only this node's GPUs (default: every node with Facet GPUs)")
	output := fs.String("o", "table", "output: table, picture (a bar of memory slices per GPU) or yaml")
	fs.Parse(args)
	render := map[string]func(*os.File, *occupancy.Cluster) error{
		"table":   func(f *os.File, c *occupancy.Cluster) error { return occupancy.Table(f, c) },
		"picture": func(f *os.File, c *occupancy.Cluster) error { return occupancy.Picture(f, c) },
		"yaml":    func(f *os.File, c *occupancy.Cluster) error { return occupancy.YAML(f, c) },
	}[*output]
	if render == nil {
		return fmt.Errorf("-o %q: want table, picture or yaml", *output)
	}
	client, dyn, err := kube.Clients()
	if err != nil {
		return err
	}
	ctx := context.Background()
	slices, claims, err := occupancy.Read(ctx, client, *node)
	if err != nil {
		return err
	}
	c, err := occupancy.Build(slices, claims, *node, occupancy.KnownProfiles())
	if err != nil {
		return err
	}
	domains, err := occupancy.ReadDomains(ctx, dyn)
	if err != nil {
		return err
	}
	c.Domains = occupancy.DomainsOf(domains)
	if len(c.GPUs) == 0 {
		if *node != "" {
			return fmt.Errorf("node %s publishes no Facet devices", *node)
		}
		return fmt.Errorf("no node publishes Facet devices")
	}
	return render(os.Stdout, c)
}
