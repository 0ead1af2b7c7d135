// Command facet-install puts HAMi-core's libvgpu.so on a node without a
// shell from HAMi's image: the chart's <release>-hami-core DaemonSet copies
// facet-install from Facet's image into an emptyDir (stage), runs that copy
// in HAMi's image, whose root filesystem holds the library, to verify and
// install it (hami-core), and then keeps the pod Running with Facet's image
// (hold), so that the pod's state says whether the node has the library.
//
//	facet-install stage --dir=DIR
//	facet-install hami-core --from=GLOB --dir=DIR [--sha256=HEX]
//	facet-install hold
//
// It runs inside a root filesystem that is not Facet's, whose libc (if any)
// is unknown, so it must be static: the image builds it with CGO_ENABLED=0,
// and TestStatic keeps every package it imports free of cgo, so that any
// build of it links statically.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `facet-install: put HAMi-core's libvgpu.so on a node (the chart's hami-core DaemonSet)

Commands:
  stage      --dir=DIR: copy this executable to DIR/facet-install, for a
             container of another image (HAMi's) to run it
  hami-core  --from=GLOB --dir=DIR [--sha256=HEX]: install the one file
             GLOB matches as DIR/libvgpu.so, replaced by a rename, after
             checking that it is an ELF file and, with --sha256, its hash
  hold       wait for SIGTERM: the DaemonSet's pod stays Running once the
             library is installed
`

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	cancel()
	switch {
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	case err != nil:
		fmt.Fprintf(os.Stderr, "facet-install: %v\n", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	fs := flag.NewFlagSet("facet-install "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "stage":
		dir := fs.String("dir", "", "directory to copy this executable into, as DIR/"+StagedName+" (required)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *dir == "" {
			return fmt.Errorf("stage: --dir is required")
		}
		path, err := Stage(*dir)
		if err != nil {
			return fmt.Errorf("stage: %w", err)
		}
		fmt.Fprintf(out, "staged %s\n", path)
		return nil
	case "hami-core":
		from := fs.String("from", "", "glob that must match exactly one file: HAMi-core's libvgpu.so in the image this runs in (required)")
		dir := fs.String("dir", "", "host directory to install it in, as DIR/"+LibraryName+": the plugin's --hami-library (required)")
		sum := fs.String("sha256", "", "the SHA-256 the library must have (64 hex digits); a library with another is not installed")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *from == "" || *dir == "" {
			return fmt.Errorf("hami-core: --from and --dir are required")
		}
		r, err := InstallHAMiCore(*from, *dir, *sum)
		if err != nil {
			return fmt.Errorf("hami-core: %w", err)
		}
		what := "installed"
		if !r.Wrote {
			what = "already installed"
		}
		checked := "not checked: kubeletPlugin.hamiCore.librarySHA256 is unset"
		if *sum != "" {
			checked = "as kubeletPlugin.hamiCore.librarySHA256 requires"
		}
		fmt.Fprintf(out, "%s %s from %s (SHA-256 %s, %s)\n", what, r.Path, r.Source, r.SHA256, checked)
		return nil
	case "hold":
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		fmt.Fprintln(out, "holding until SIGTERM")
		<-ctx.Done()
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(out, usage)
		return nil
	}
	return errUsage
}
