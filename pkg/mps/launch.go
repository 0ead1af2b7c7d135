package mps

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// launchArg0 is argv[0] under which this binary, re-executed, becomes the
// launcher of a control daemon with a private /dev/shm (see init).
const launchArg0 = "facet-mps-launch"

// launchPrivateShm returns a command that re-executes this binary in a new
// mount namespace (Go makes its mounts private before exec), where init
// binds shm over /dev/shm and then executes "control -d". The daemon the
// control program forks keeps that namespace, and so do the MPS servers it
// starts: they share memory with the clients through shm, which every
// share of the GPU mounts as its /dev/shm.
func launchPrivateShm(ctx context.Context, shm, control string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "/proc/self/exe", shm, control)
	cmd.Args[0] = launchArg0
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	return cmd
}

// init turns a re-executed binary into the launcher (the moby/sys/reexec
// pattern): bind the shm directory over /dev/shm, then exec the control
// program with -d. It returns at once for every other invocation.
func init() {
	if len(os.Args) != 3 || os.Args[0] != launchArg0 {
		return
	}
	shm, control := os.Args[1], os.Args[2]
	if err := syscall.Mount(shm, "/dev/shm", "", syscall.MS_BIND, ""); err != nil {
		fmt.Fprintf(os.Stderr, "%s: bind %s on /dev/shm: %v\n", launchArg0, shm, err)
		os.Exit(1)
	}
	err := syscall.Exec(control, []string{control, "-d"}, os.Environ())
	fmt.Fprintf(os.Stderr, "%s: exec %s: %v\n", launchArg0, control, err)
	os.Exit(1)
}
