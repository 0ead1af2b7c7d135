package mps

import (
	"context"
	"os/exec"

	"github.com/facet-gpu/facet/pkg/node/driverroot"
)

// Paths the control program, its daemon and servers see inside the root
// they run in, the same for every GPU: each GPU's daemon runs in a mount namespace
// of its own where these are its directories. ContainerPipeDir is also the
// path every client container gets: NVIDIA's MPS documentation asks for
// one CUDA_MPS_PIPE_DIRECTORY for the control daemon, its servers and its
// clients.
const (
	// chrootScratch is a small tmpfs mounted over the root's /tmp
	// in the daemon's namespace only, to hold the mount points below
	// without creating anything in the host's /tmp.
	chrootScratch = "/tmp"
	chrootLogDir  = "/tmp/nvidia-mps-log"
)

// launchSpec is the control program launch runs, and the GPU's
// directories it sees.
type launchSpec struct {
	// Root is the root to chroot into as this process sees it (the
	// driver root, or the host's: Layout.Root); Control the control
	// program's path inside it.
	Root, Control string
	// Pipe, Log and Shm are the GPU's directories as this process sees
	// them, bound at ContainerPipeDir, chrootLogDir and /dev/shm.
	Pipe, Log, Shm string
	// Args are the control program's: ["-d"] starts the daemon, none is
	// a client reading commands on its standard input.
	Args []string
}

// launch returns the control program, run by pkg/node/driverroot's
// launcher in a mount namespace of its own, chrooted into spec.Root, with
// the GPU's directories bound at ContainerPipeDir, chrootLogDir and
// ContainerShmDir. The daemon it forks keeps that namespace and root, and
// so do the MPS servers it starts (driverroot.Command says why chroot).
func launch(ctx context.Context, spec launchSpec) *exec.Cmd {
	return driverroot.Command(ctx, driverroot.Spec{
		Root: spec.Root, Path: spec.Control, Args: spec.Args,
		Scratch: chrootScratch, ScratchName: "facet-mps",
		Binds: []driverroot.Bind{
			{From: spec.Pipe, To: ContainerPipeDir},
			{From: spec.Log, To: chrootLogDir},
			{From: spec.Shm, To: ContainerShmDir},
		},
		Purpose: "the GPU's MPS directories",
	})
}

// launchHint explains an error from starting the launcher
// (driverroot.LaunchHint).
func launchHint(err error) string {
	return driverroot.LaunchHint(err)
}
