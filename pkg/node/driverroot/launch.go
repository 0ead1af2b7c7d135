package driverroot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// launchArg0 is argv[0] under which this binary, re-executed, becomes the
// launcher of a driver program chrooted into a root (see init).
const launchArg0 = "facet-driver-launch"

// Bind is a directory of this process (From) bound into the root at To, a
// path inside the root.
type Bind struct {
	From, To string
}

// Spec is a driver program to run chrooted (Command).
type Spec struct {
	// Root is the root to chroot into as this process sees it
	// (Layout.Root); Path the program's path inside it (Layout.Path).
	Root, Path string
	// Args are the program's arguments.
	Args []string
	// Scratch, when set, is a directory of the root ("/tmp") over which a
	// small tmpfs named ScratchName is mounted in the program's mount
	// namespace only, to hold the mount points of the binds under it
	// without creating anything in the host's directory.
	Scratch, ScratchName string
	// Binds are bound into the root before the chroot. A bind's To under
	// Scratch is created on the tmpfs; any other To must be a directory
	// of the root already.
	Binds []Bind
	// Purpose says what the binds hold, for errors: "the GPU's MPS
	// directories".
	Purpose string
}

// Command returns a command that re-executes this binary in a new mount
// namespace (Go makes every mount private in it before exec, so nothing
// reaches the host), where init binds spec.Binds into spec.Root, chroots
// into it and executes the program. What the program forks keeps that
// namespace and root. The caller sets the command's environment and
// standard streams.
//
// Why chroot: driver programs (nvidia-cuda-mps-control, nvidia-imex) are
// the host's binaries, linked against the host's glibc, and must be
// loaded by the host's own loader. Started from Facet's image with
// LD_LIBRARY_PATH into the driver root, the image's loader meets the
// host's libc.so.6 and fails unless both are one glibc build. NVIDIA's DRA
// driver starts its MPS daemon with `chroot /driver-root` for the same
// reason (templates/mps-control-daemon.tmpl.yaml); like it, Facet gives
// the program no LD_LIBRARY_PATH into a root it is chrooted into. A
// driver under a prefix of its own has no loader or libc: its programs
// are run chrooted into the host's root, whose loader they were installed
// for, with LD_LIBRARY_PATH set to the prefix's libraries (Locate).
func Command(ctx context.Context, spec Spec) *exec.Cmd {
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
	var spec Spec
	if err := json.Unmarshal([]byte(os.Args[1]), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", launchArg0, err)
		os.Exit(1)
	}
	if err := chrootInto(spec); err != nil {
		fmt.Fprintf(os.Stderr, "%s: root %s: %v\n", launchArg0, spec.Root, err)
		os.Exit(1)
	}
	argv := append([]string{spec.Path}, spec.Args...)
	err := syscall.Exec(spec.Path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "%s: exec %s in root %s: %v\n", launchArg0, spec.Path, spec.Root, err)
	os.Exit(1)
}

// under says whether p lies in dir (both paths inside the root).
func under(p, dir string) bool {
	return dir != "" && (p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/"))
}

// chrootInto prepares the namespace and enters spec.Root.
//
// The bind sources are opened before anything is mounted, and bound from
// their descriptors (/proc/self/fd/N), never looked up by path after a
// mount: the tmpfs over the root's /tmp, or a bind over its /dev/shm,
// would otherwise hide a directory that lies under them. Seen on a real
// H200: with the driver root / and the node check's scratch directory in
// /tmp, the tmpfs hid the MPS pipe directory, and every MPS prepare
// failed with "bind …/pipe on /tmp/nvidia-mps: no such file or
// directory". A descriptor holds the directory itself, whatever is later
// mounted over its path, where binding the sources to a staging place
// first would need a place no mount covers, and leaving /tmp alone when a
// source lies under it would keep the program's mount points in the
// host's /tmp. runc mounts a container's sources from descriptors too
// (libcontainer/mount_linux.go, mountViaFds).
func chrootInto(spec Spec) error {
	// Mount points must be directories of the root itself: a symbolic
	// link would resolve against this process's root, not the driver's.
	var points []string
	if spec.Scratch != "" {
		points = append(points, spec.Scratch)
	}
	for _, b := range spec.Binds {
		if !under(b.To, spec.Scratch) {
			points = append(points, b.To)
		}
	}
	for _, p := range points {
		st, err := os.Lstat(filepath.Join(spec.Root, p))
		if err != nil || !st.IsDir() {
			return fmt.Errorf("%s must be a directory of the root (not a symbolic link) to hold %s (%v)", p, spec.Purpose, err)
		}
	}
	fds := make([]int, len(spec.Binds))
	for i, b := range spec.Binds {
		fd, err := unix.Open(b.From, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", b.From, err)
		}
		// The launcher execs the program or exits: O_CLOEXEC closes
		// these either way.
		fds[i] = fd
	}
	if spec.Scratch != "" {
		scratch := filepath.Join(spec.Root, spec.Scratch)
		if err := syscall.Mount(spec.ScratchName, scratch, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=1m,mode=1777"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", scratch, err)
		}
	}
	for i, b := range spec.Binds {
		to := filepath.Join(spec.Root, b.To)
		if err := os.MkdirAll(to, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(fmt.Sprintf("/proc/self/fd/%d", fds[i]), to, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", b.From, to, err)
		}
	}
	if err := syscall.Chroot(spec.Root); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return os.Chdir("/")
}

// LaunchHint explains an EINVAL from starting the launcher: Go makes every
// mount of the new mount namespace private from "/", which fails with
// EINVAL where this process's root is not a mount point. A container's
// root always is; a bare chroot's (seen running facetctl node-check in
// `chroot <image root>` on a real node) is not.
func LaunchHint(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) && pe.Op == "fork/exec" && errors.Is(err, syscall.EINVAL) {
		return " (a new mount namespace could not be made private: this process's root must be a mount point, as a container's is; in a chroot, bind-mount the root on itself first)"
	}
	return ""
}
