package mpssim

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
)

// privateVersion is the symbol version that glibc's loader and libc share
// between themselves only; privateStandIn replaces it in the root's copies.
// Both are 13 bytes: the replacement moves no offset, and the ELF hash
// fields beside the name stay those of GLIBC_PRIVATE, which is what the
// loader's own code compares them with.
const (
	privateVersion = "GLIBC_PRIVATE"
	privateStandIn = "GLIBC_FACETSM"
)

// Where WriteRoot looks on this system for the shells and for the
// libraries the shell needs.
var (
	shellCandidates   = []string{"/bin/dash", "/bin/sh"}
	busyboxCandidates = []string{"/bin/busybox", "/usr/bin/busybox"}
)

// applets are the busybox applets linked into the root's bin/: every
// external command Script runs as daemon or client, with what dash would
// otherwise take from its builtins (kill, echo, printf, test) and a few a
// later Script may want. Linking an unused one costs a symlink.
var applets = []string{
	"[", "basename", "cat", "chmod", "cp", "date", "dirname", "echo", "env",
	"false", "grep", "head", "id", "kill", "ln", "ls", "mkdir", "mkfifo",
	"mv", "printf", "ps", "rm", "rmdir", "sed", "setsid", "sleep", "tail",
	"test", "touch", "tr", "true", "uname", "wc",
}

// WriteRoot lays out under root a file system that the stand-in can run
// chrooted into, as Facet runs the real nvidia-cuda-mps-control: chrooted
// into the driver root, so that the host's own loader loads the host's own
// libraries. Running it with this process's loader and LD_LIBRARY_PATH
// into the driver root fails on a node whose glibc is another build than
// the image's (the failure shared/design/real-node-review.md item 1
// predicts for a real node), and the root reproduces that failure:
//
//	usr/bin/nvidia-cuda-mps-control      Script (ControlRel)
//	bin/sh                               a dynamically linked POSIX shell of
//	                                     this system (/bin/dash, else /bin/sh)
//	<the shell's PT_INTERP>, e.g.        this system's loader, its
//	lib64/ld-linux-x86-64.so.2           GLIBC_PRIVATE renamed GLIBC_FACETSM
//	usr/lib/<triplet>/libc.so.6, ...     the libraries the shell needs, from
//	                                     this system, renamed alike
//	bin/busybox, bin/<applet> -> busybox a static busybox for the commands
//	                                     Script runs (mkdir, mkfifo, date, ...)
//	tmp, dev/shm                         mode 1777
//	dev/null                             character device 1:3
//
// The private version name makes the root's libc need the root's own
// loader, as a host glibc of another build needs its own: a process started
// with another loader and LD_LIBRARY_PATH into root/usr/lib/<triplet> (the
// driver root's library directory that the old code put there) fails with
// "version `GLIBC_FACETSM' not found", and chrooted into the root it runs.
// The loader finds the libraries in usr/lib/<triplet>, one of its default
// directories, without an etc/ld.so.cache. <triplet> is x86_64-linux-gnu or
// aarch64-linux-gnu, after runtime.GOARCH.
//
// It needs a dynamically linked shell and busybox-static on this system
// (in the simulator image: /bin/dash and /bin/busybox, hack/image.sh), and
// CAP_MKNOD for dev/null (chroot needs root anyway); without it the error
// wraps EPERM (errors.Is(err, os.ErrPermission)).
//
// It is idempotent, and safe while a daemon started from an earlier layout
// runs from root (a plugin calls it at each start): a file whose content
// and mode are right is left alone, and any other is written beside its
// path and renamed over it, so a running executable or script is never
// rewritten in place (ETXTBSY, or a shell reading a changed script).
func WriteRoot(root string) error {
	if err := writeRoot(root); err != nil {
		return fmt.Errorf("MPS stand-in root %s: %w", root, err)
	}
	if err := writeFile(filepath.Join(root, ControlRel), []byte(Script), 0o755); err != nil {
		return fmt.Errorf("MPS stand-in root %s: %w", root, err)
	}
	return nil
}

// Prefixes are where drivers installed under a directory of their own put
// it, as the simulated prefix layouts (WritePrefix) lay them out, each
// with its programs in bin/ and its libraries in lib64/: GKE's
// (/home/kubernetes/bin/nvidia, on Container-Optimized OS) and a runfile
// install's /usr/local/nvidia (the real H200 and H100 VMs of
// docs/driver-roots.md).
var Prefixes = []string{"/home/kubernetes/bin/nvidia", "/usr/local/nvidia"}

// Where WritePrefix puts the stand-in and where a prefix keeps its
// libraries, relative to the prefix.
const (
	PrefixControlRel = "bin/nvidia-cuda-mps-control"
	PrefixLibDir     = "lib64"
)

// WritePrefix lays out under hostRoot a host's root with a driver under
// prefix (one of Prefixes, or any absolute path other than /): what
// WriteRoot lays out but the stand-in, which goes to
// <prefix>/bin/nvidia-cuda-mps-control (PrefixControlRel). The prefix gets
// no loader, libc, /tmp or /dev/shm: like a real one, its programs run
// only with the host's. Its lib64/ is the caller's to fill (internal/nvml/sim
// lays out a driver's libraries there); WritePrefix only makes it. It is
// idempotent, as WriteRoot is.
func WritePrefix(hostRoot, prefix string) error {
	if err := writePrefix(hostRoot, prefix); err != nil {
		return fmt.Errorf("MPS stand-in host root %s, driver prefix %s: %w", hostRoot, prefix, err)
	}
	return nil
}

func writePrefix(hostRoot, prefix string) error {
	if !filepath.IsAbs(prefix) || filepath.Clean(prefix) == "/" {
		return errors.New("the prefix must be an absolute path other than /")
	}
	if err := writeRoot(hostRoot); err != nil {
		return err
	}
	dir := filepath.Join(hostRoot, prefix)
	if err := writeFile(filepath.Join(dir, PrefixControlRel), []byte(Script), 0o755); err != nil {
		return err
	}
	return os.MkdirAll(filepath.Join(dir, PrefixLibDir), 0o755)
}

func writeRoot(root string) error {
	if !filepath.IsAbs(root) {
		return errors.New("must be an absolute path")
	}
	// It replaces bin/sh and the loader: never the system's own.
	if filepath.Clean(root) == "/" {
		return errors.New("refusing to lay out the stand-in's root over /")
	}
	triplet, err := libraryTriplet()
	if err != nil {
		return err
	}
	shell, interp, err := findShell()
	if err != nil {
		return err
	}
	busybox, err := findBusybox()
	if err != nil {
		return err
	}
	libs, err := sharedLibraries(shell, interp, triplet)
	if err != nil {
		return err
	}
	type copied struct {
		rel, src string
		// patch renames the private version: in the loader, which
		// defines it, and in every library, since glibc's own need it.
		patch bool
	}
	files := []copied{
		{"bin/sh", shell, false},
		{"bin/busybox", busybox, false},
		{strings.TrimPrefix(interp, "/"), interp, true},
	}
	for _, lib := range libs {
		files = append(files, copied{filepath.Join("usr/lib", triplet, filepath.Base(lib)), lib, true})
	}
	for _, f := range files {
		data, err := os.ReadFile(f.src)
		if err != nil {
			return err
		}
		if f.patch {
			data = bytes.ReplaceAll(data, []byte(privateVersion), []byte(privateStandIn))
		}
		if err := writeFile(filepath.Join(root, f.rel), data, 0o755); err != nil {
			return err
		}
	}
	for _, a := range applets {
		if err := symlink(filepath.Join(root, "bin", a), "busybox"); err != nil {
			return err
		}
	}
	for _, dir := range []string{"tmp", "dev/shm"} {
		p := filepath.Join(root, dir)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		// MkdirAll's mode is subject to umask and leaves an existing
		// directory as it is.
		if err := os.Chmod(p, os.ModeSticky|0o777); err != nil {
			return err
		}
	}
	// The script redirects to and from /dev/null; without the device,
	// the shell would create a regular file there and read back what it
	// wrote.
	return nullDevice(filepath.Join(root, "dev/null"))
}

// nullDevice makes path a character device 1:3 (/dev/null), mode 0666,
// unless it is one. mknod needs CAP_MKNOD: without it the error wraps
// EPERM.
func nullDevice(path string) error {
	want := unix.Mkdev(1, 3)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && uint64(st.Rdev) == want && st.Mode&0o777 == 0o666 {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(want)); err != nil {
		return &fs.PathError{Op: "mknod", Path: path, Err: err}
	}
	return os.Chmod(path, 0o666) // mknod's mode is subject to umask
}

func libraryTriplet() (string, error) {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64-linux-gnu", nil
	case "arm64":
		return "aarch64-linux-gnu", nil
	}
	return "", fmt.Errorf("no MPS stand-in root for GOARCH %s", runtime.GOARCH)
}

// findShell returns this system's first dynamically linked POSIX shell
// among shellCandidates (symlinks resolved) and its loader. A static shell
// would run under chroot too, but would not need the root's loader and
// libc, and so would not show that Facet runs the driver's programs with
// the driver root's own.
func findShell() (path, interp string, err error) {
	for _, c := range shellCandidates {
		p, err := filepath.EvalSymlinks(c)
		if err != nil {
			continue
		}
		if interp, err := elfInterp(p); err == nil && interp != "" {
			return p, interp, nil
		}
	}
	return "", "", fmt.Errorf("no dynamically linked POSIX shell: looked for %s (install dash)", strings.Join(shellCandidates, ", "))
}

// findBusybox returns this system's static busybox: the root has no libc
// that a dynamically linked one could use unpatched.
func findBusybox() (string, error) {
	for _, c := range busyboxCandidates {
		p, err := filepath.EvalSymlinks(c)
		if err != nil {
			continue
		}
		if interp, err := elfInterp(p); err == nil && interp == "" {
			return p, nil
		}
	}
	return "", fmt.Errorf("no static busybox at %s: install busybox-static", strings.Join(busyboxCandidates, " or "))
}

// elfInterp returns the loader an ELF executable names (PT_INTERP), "" for
// a static one.
func elfInterp(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return "", fmt.Errorf("%s: PT_INTERP: %w", path, err)
		}
		return string(bytes.TrimRight(b, "\x00")), nil
	}
	return "", nil
}

// sharedLibraries returns the paths on this system of the libraries that
// exe needs, directly or through one another (DT_NEEDED), less its loader.
func sharedLibraries(exe, interp, triplet string) ([]string, error) {
	dirs := []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/usr/lib64"}
	f, err := elf.Open(exe)
	if err != nil {
		return nil, err
	}
	machine, class := f.Machine, f.Class
	f.Close()
	var out []string
	seen := map[string]bool{filepath.Base(interp): true}
	queue := []string{exe}
	for len(queue) > 0 {
		obj := queue[0]
		queue = queue[1:]
		f, err := elf.Open(obj)
		if err != nil {
			return nil, err
		}
		needed, err := f.ImportedLibraries()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", obj, err)
		}
		for _, name := range needed {
			if seen[name] {
				continue
			}
			seen[name] = true
			p, err := findLibrary(name, dirs, machine, class)
			if err != nil {
				return nil, fmt.Errorf("%s, needed by %s: %w", name, obj, err)
			}
			out = append(out, p)
			queue = append(queue, p)
		}
	}
	return out, nil
}

// findLibrary returns the first file called name in dirs that is an ELF
// object of machine and class, its symlinks resolved.
func findLibrary(name string, dirs []string, machine elf.Machine, class elf.Class) (string, error) {
	for _, d := range dirs {
		p, err := filepath.EvalSymlinks(filepath.Join(d, name))
		if err != nil {
			continue
		}
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		ok := f.Machine == machine && f.Class == class
		f.Close()
		if ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s", strings.Join(dirs, ", "))
}

// writeFile makes path a regular file with data and mode unless it is one.
// A new content is written to a temporary file beside path and renamed
// over it: a process running the old file keeps its inode.
func writeFile(path string, data []byte, mode fs.FileMode) error {
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == mode {
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
			return nil
		}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return atomicfile.WriteWith(dir, filepath.Base(path), data, atomicfile.Options{TempPattern: "." + filepath.Base(path) + ".facet-tmp*", Perm: mode, NoSync: true})
}

// symlink makes path a symlink to target unless it is one, replacing what
// is there in one rename.
func symlink(path, target string) error {
	if old, err := os.Readlink(path); err == nil && old == target {
		return nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.facet-tmp%d", filepath.Base(path), os.Getpid()))
	os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
