package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/facet-gpu/facet/pkg/model/nvmlgpu"
)

// runIMEXChannels prints the IMEX channels as the kubelet plugin reads
// them from the driver's proc files, and checks the channel device nodes
// the host has against them (docs/driver-roots.md, "IMEX channels"). It
// reads only.
func runIMEXChannels(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("imex-channels", flag.ContinueOnError)
	procRoot := fs.String("proc-root", nvmlgpu.DefaultProcRoot, "where the driver's proc files are (the node's /proc; a simulated driver root's proc/)")
	devRoot := fs.String("dev-root", "/", "the root whose dev/nvidia-caps-imex-channels holds the host's channel nodes, if any")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := nvmlgpu.ReadIMEXChannels(*procRoot)
	if err != nil {
		return err
	}
	if c == nil {
		return fmt.Errorf("%s/devices lists no character device %s: the driver offers no IMEX channels (no NVIDIA driver, one before R550, or NVreg_ImexChannelCount=0); the node publishes no imex-channel device", *procRoot, nvmlgpu.IMEXChannelsDriverName)
	}
	fmt.Fprintf(out, "%s: major %d (%s), %d channels (%s)\n", nvmlgpu.IMEXChannelsDriverName, c.Major, c.Source, c.Count, c.CountFrom)
	nodes, err := nvmlgpu.CheckIMEXChannelNodes(*devRoot, c)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "channel device nodes on this host: %d (the plugin's CDI specs need none: the runtime makes the claim's in its containers)\n", len(nodes))
	bad := 0
	for _, n := range nodes {
		verdict := "ok"
		if n.Problem != "" {
			verdict, bad = n.Problem, bad+1
		}
		fmt.Fprintf(out, "  %s  c %d:%d  %s\n", n.Path, n.Major, n.Minor, verdict)
	}
	if bad > 0 {
		return fmt.Errorf("%d channel device nodes disagree with the driver's numbers", bad)
	}
	return nil
}
