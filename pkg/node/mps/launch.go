package mps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// launchArg0 is argv[0] under which this binary, re-executed, becomes the
// launcher of a control program chrooted into the driver root, or the
// host's root for a driver under a prefix (see init).
const launchArg0 = "facet-mps-launch"

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

// launchSpec is what the re-executed launcher does, passed as its one
// argument in JSON.
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

// launch returns a command that re-executes this binary in a new mount
// namespace (Go makes every mount private in it before exec, so nothing
// reaches the host), where init binds the GPU's directories into
// spec.Root, chroots into it and executes the control program. The
// daemon it forks keeps that namespace and root, and so do the MPS
// servers it starts.
//
// Why chroot: the control program and the servers are the host's
// binaries, linked against the host's glibc, and must be loaded by the
// host's own loader. Started from Facet's image with LD_LIBRARY_PATH into
// the driver root, the image's loader meets the host's libc.so.6 and
// fails unless both are one glibc build. NVIDIA's DRA driver starts its
// daemon with `chroot /driver-root` for the same reason
// (templates/mps-control-daemon.tmpl.yaml); like it, Facet gives the
// daemon no LD_LIBRARY_PATH into a root it is chrooted into. A driver
// under a prefix of its own has no loader or libc: its programs are run
// chrooted into the host's root, whose loader they were installed for,
// with LD_LIBRARY_PATH set to the prefix's libraries (Locate).
func launch(ctx context.Context, spec launchSpec) *exec.Cmd {
	b, _ := json.Marshal(spec)
	cmd := exec.CommandContext(ctx, "/proc/self/exe", string(b))
	cmd.Args[0] = launchArg0
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	return cmd
}

// init turns a re-executed binary into the launcher (the moby/sys/reexec
// pattern). It returns at once for every other invocation.
func init() {
	if len(os.Args) != 2 || os.Args[0] != launchArg0 {
		return
	}
	var spec launchSpec
	if err := json.Unmarshal([]byte(os.Args[1]), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", launchArg0, err)
		os.Exit(1)
	}
	if err := chrootInto(spec); err != nil {
		fmt.Fprintf(os.Stderr, "%s: root %s: %v\n", launchArg0, spec.Root, err)
		os.Exit(1)
	}
	argv := append([]string{spec.Control}, spec.Args...)
	err := syscall.Exec(spec.Control, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "%s: exec %s in root %s: %v\n", launchArg0, spec.Control, spec.Root, err)
	os.Exit(1)
}

// chrootInto prepares the namespace and enters spec.Root.
//
// The GPU's directories are opened before anything is mounted, and bound
// from their descriptors (/proc/self/fd/N), never looked up by path after
// a mount: the tmpfs over the root's /tmp, or a bind over its /dev/shm,
// would otherwise hide a directory that lies under them. Seen on a real
// H200: with the driver root / and the node check's scratch directory in
// /tmp, the tmpfs hid the pipe directory, and every MPS prepare failed
// with "bind …/pipe on /tmp/nvidia-mps: no such file or directory". A
// descriptor holds the directory itself, whatever is later mounted over
// its path, where binding the sources to a staging place first would
// need a place no mount covers, and leaving /tmp alone when a source lies
// under it would keep the daemon's mount points in the host's /tmp.
// runc mounts a container's sources from descriptors too
// (libcontainer/mount_linux.go, mountViaFds).
func chrootInto(spec launchSpec) error {
	// Mount points must be directories of the root itself: a symbolic
	// link would resolve against this process's root, not the driver's.
	for _, p := range []string{chrootScratch, "/dev/shm"} {
		st, err := os.Lstat(filepath.Join(spec.Root, p))
		if err != nil || !st.IsDir() {
			return fmt.Errorf("%s must be a directory of the root (not a symbolic link) to hold the GPU's MPS directories (%v)", p, err)
		}
	}
	binds := []struct {
		from, to string
		fd       int
	}{
		{from: spec.Pipe, to: ContainerPipeDir},
		{from: spec.Log, to: chrootLogDir},
		{from: spec.Shm, to: ContainerShmDir},
	}
	for i := range binds {
		fd, err := unix.Open(binds[i].from, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", binds[i].from, err)
		}
		// The launcher execs the control program or exits: O_CLOEXEC
		// closes these either way.
		binds[i].fd = fd
	}
	scratch := filepath.Join(spec.Root, chrootScratch)
	if err := syscall.Mount("facet-mps", scratch, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=1m,mode=1777"); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", scratch, err)
	}
	for _, b := range binds {
		to := filepath.Join(spec.Root, b.to)
		if err := os.MkdirAll(to, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(fmt.Sprintf("/proc/self/fd/%d", b.fd), to, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", b.from, to, err)
		}
	}
	if err := syscall.Chroot(spec.Root); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return os.Chdir("/")
}

// launchHint explains an EINVAL from starting the launcher: Go makes every
// mount of the new mount namespace private from "/", which fails with
// EINVAL where this process's root is not a mount point. A container's
// root always is; a bare chroot's (seen running facetctl node-check in
// `chroot <image root>` on a real node) is not.
func launchHint(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) && pe.Op == "fork/exec" && errors.Is(err, syscall.EINVAL) {
		return " (a new mount namespace could not be made private: this process's root must be a mount point, as a container's is; in a chroot, bind-mount the root on itself first)"
	}
	return ""
}
