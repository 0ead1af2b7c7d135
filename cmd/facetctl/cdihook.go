package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/facet-gpu/facet/pkg/node/cdihook"
)

func runInstallCDIHook(args []string) error {
	fs := flag.NewFlagSet("install-cdi-hook", flag.ExitOnError)
	src := fs.String("from", cdihook.ImagePath, "the nvidia-cdi-hook to install (Facet's image has it here)")
	dir := fs.String("dir", "", "host directory to install it in, as <dir>/"+cdihook.Name+" (required); the plugin's --nvidia-cdi-hook names that path")
	fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("--dir is required")
	}
	wrote, version, err := cdihook.Install(context.Background(), *src, *dir)
	if err != nil {
		return err
	}
	what := "installed"
	if !wrote {
		what = "already installed"
	}
	fmt.Printf("%s %s/%s from %s (%s)\n", what, *dir, cdihook.Name, *src, version)
	return nil
}
