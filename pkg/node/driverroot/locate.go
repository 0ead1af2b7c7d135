// Package driverroot finds an NVIDIA driver program under a node's driver
// root and runs it chrooted into the root whose loader it was installed
// for. It is the one home of that logic: facet-mps runs
// nvidia-cuda-mps-control through it (pkg/node/mps), facet-imex runs
// nvidia-imex and nvidia-imex-ctl (pkg/node/imex).
package driverroot

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/lookup"
	securejoin "github.com/cyphar/filepath-securejoin"
)

// ProgramDirs are where driver installations put their programs, relative
// to the driver root: distribution packages and the GPU Operator's driver
// container use usr/bin; runfile installs into /usr/local/nvidia keep
// bin/.
var ProgramDirs = []string{"usr/bin", "bin", "usr/local/bin"}

// Program names a driver program and what running it chrooted needs.
type Program struct {
	// Name is the program's file name, e.g. "nvidia-cuda-mps-control".
	Name string
	// Service names what runs it in errors: "MPS", "IMEX".
	Service string
	// Dirs are directories, relative to a root, that the root must have
	// for the program to run chrooted into it (mount points the launcher
	// uses), e.g. "tmp", "dev/shm".
	Dirs []string
	// HostRootHint says, after "none given", where the host's root comes
	// from, for Locate's error when a prefix needs it and none is given.
	HostRootHint string
}

// Find returns the program's path inside driverRoot
// ("/usr/bin/nvidia-imex"), which is where a process chrooted into the
// driver root runs it from; or an error naming where it looked.
// driverRoot is the driver root as this process sees it (in a container,
// its mount of the host's).
func (p Program) Find(driverRoot string) (string, error) {
	for _, dir := range ProgramDirs {
		path := filepath.Join(driverRoot, dir, p.Name)
		// An absolute symbolic link on the way resolves against this
		// process's root, not the driver root's; Stat is a first check,
		// and the chrooted exec the one that counts.
		if st, err := os.Stat(path); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return "/" + dir + "/" + p.Name, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s under driver root %s", p.Name, strings.Join(ProgramDirs, ", "), driverRoot)
}

// CheckRoot says whether the program at path (inside root) can run
// chrooted into root: the root must have p.Dirs as directories, and the
// program's interpreter (an ELF program's loader, PT_INTERP, or a
// script's "#!" program) must be in it. A driver installed under a prefix
// of its own (/usr/local/nvidia, docs/driver-roots.md) has none of these:
// its programs use the host's loader from the host's /, and Locate runs
// them from there. Seen on a real H200: without this check, each MPS
// prepare failed on such a root instead of the node saying once that it
// cannot run MPS. The error names the root and everything it lacks, or
// the program it could not read.
func (p Program) CheckRoot(root, path string) error {
	var missing []string
	for _, d := range p.Dirs {
		st, err := os.Lstat(filepath.Join(root, d))
		if err != nil || !st.IsDir() {
			missing = append(missing, "no /"+d+" directory")
		}
	}
	interp, err := Interpreter(filepath.Join(root, path))
	if err != nil {
		return fmt.Errorf("root %s: read %s: %w", root, path, err)
	}
	if interp != "" {
		// Resolved inside the root, as the chrooted exec will: a
		// loader reached through an absolute link (Debian's
		// /lib64/ld-linux-x86-64.so.2) must not be looked for in this
		// process's own root, the image's.
		ip, err := securejoin.SecureJoin(root, interp)
		if err == nil {
			_, err = os.Stat(ip)
		}
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s's interpreter %s is not in it", p.Name, interp))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("root %s cannot run %s chrooted: %s", root, p.Service, strings.Join(missing, "; "))
	}
	return nil
}

// Interpreter is the program that runs path: an ELF file's PT_INTERP
// (empty for a static one), or a script's "#!" program.
func Interpreter(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 256)
	n, _ := f.Read(head)
	head = head[:n]
	if bytes.HasPrefix(head, []byte("#!")) {
		line, _, _ := bytes.Cut(head[2:], []byte("\n"))
		fields := strings.Fields(string(line))
		if len(fields) == 0 {
			return "", errors.New(`an empty "#!" line`)
		}
		return fields[0], nil
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return "", fmt.Errorf("neither an ELF program nor a script: %w", err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", err
			}
			return strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return "", nil
}

// Layout is where and how a driver program runs (Locate).
type Layout struct {
	// Root is the root the program runs chrooted into, as this process
	// sees it: the driver root itself, or, for a driver under a prefix
	// of its own, the host's root.
	Root string
	// Path is the program's path inside Root: "/usr/bin/nvidia-imex", or
	// under a prefix "/usr/local/nvidia/bin/nvidia-imex".
	Path string
	// LibraryPath is the program's LD_LIBRARY_PATH, a directory inside
	// Root: under a prefix, the one that holds its driver libraries
	// ("/usr/local/nvidia/lib64"); empty when Root is the driver root,
	// whose own loader finds them.
	LibraryPath string
	// Prefix is the driver root's path inside Root: "/" when the program
	// runs chrooted into the driver root.
	Prefix string
}

// driverLibraries are what Locate looks for to find a prefix's library
// directory, in order, as nvcdi does to find the driver's
// (nvidia-container-toolkit internal/lookup/root/root.go, inferVersion
// and GetDriverLibDirectory): libcuda.so.<version>, else NVML's.
var driverLibraries = []string{"libcuda.so.*.*", "libnvidia-ml.so.*.*"}

// Locate finds the program in driverRoot (Find) and says where it runs.
// Both roots are paths as this process sees them; hostRoot is the host's
// / (a daemon's --host-root), "" when it has none.
//
//   - Chrooted into driverRoot, when CheckRoot passes there: a driver in
//     the host's own / (hostRoot is not needed), or the GPU Operator's
//     driver container root. Layout.Prefix is "/".
//   - Otherwise, for a driver under a prefix of its own (GKE's
//     /home/kubernetes/bin/nvidia, /usr/local/nvidia), chrooted into
//     hostRoot, of which driverRoot must be a directory: the prefix's
//     programs are the host's, loaded by the host's loader with the
//     host's libc (CheckRoot passes in hostRoot for the program at
//     <prefix>/bin/<name>). LD_LIBRARY_PATH is the prefix's library
//     directory, found as nvcdi finds the driver's (libcuda.so.<version>,
//     else libnvidia-ml.so.<version>, in the prefix's lib64,
//     lib/<triplet>, usr/lib64 or usr/lib/<triplet>).
//
// Why not NVIDIA's way: NVIDIA's DRA driver, where the driver root has no
// shell (GKE's COS), runs the control program from its own image with
// LD_LIBRARY_PATH into the driver root
// (templates/mps-control-daemon.tmpl.yaml). Facet's image's loader and
// libc then load the host's programs, which holds only while the image's
// glibc is as new as the host's (see Command); the host's root has the
// loader and libc these programs were installed for.
//
// Errors: Find's; or, when neither root can run the program, driverRoot's
// CheckRoot error naming what it lacks, followed by why the host's root
// cannot stand in (none given, driverRoot not in it, what it lacks, or no
// driver library in the prefix).
func (p Program) Locate(driverRoot, hostRoot string) (Layout, error) {
	path, err := p.Find(driverRoot)
	if err != nil {
		return Layout{}, err
	}
	rootErr := p.CheckRoot(driverRoot, path)
	if rootErr == nil {
		return Layout{Root: driverRoot, Path: path, Prefix: "/"}, nil
	}
	l, err := p.locateUnderHost(driverRoot, hostRoot, path)
	if err != nil {
		return Layout{}, fmt.Errorf("%w; nor from the host's root: %w", rootErr, err)
	}
	return l, nil
}

// locateUnderHost is Locate's layout for a driver under a prefix.
func (p Program) locateUnderHost(driverRoot, hostRoot, path string) (Layout, error) {
	if hostRoot == "" {
		return Layout{}, fmt.Errorf("none given (%s)", p.HostRootHint)
	}
	if !filepath.IsAbs(hostRoot) || !filepath.IsAbs(driverRoot) {
		return Layout{}, fmt.Errorf("host root %q and driver root %q must be absolute paths", hostRoot, driverRoot)
	}
	rel, err := filepath.Rel(filepath.Clean(hostRoot), filepath.Clean(driverRoot))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return Layout{}, fmt.Errorf("driver root %s is not a directory of host root %s: pass the driver root as a path under the host root (%s/usr/local/nvidia)", driverRoot, hostRoot, strings.TrimSuffix(hostRoot, "/"))
	}
	if rel == "." {
		// The same root, which CheckRoot has just refused.
		return Layout{}, fmt.Errorf("host root %s is the driver root", hostRoot)
	}
	prefix := "/" + rel
	l := Layout{Root: hostRoot, Path: prefix + path, Prefix: prefix}
	if err := p.CheckRoot(hostRoot, l.Path); err != nil {
		return Layout{}, err
	}
	libDir, err := driverLibraryDir(driverRoot)
	if err != nil {
		return Layout{}, err
	}
	l.LibraryPath = filepath.Join(prefix, libDir)
	return l, nil
}

// driverLibraryDir is the directory, relative to driverRoot, of the first
// of driverLibraries that nvidia-container-toolkit's library locator
// finds there (symbolic links resolved, as nvcdi takes it).
func driverLibraryDir(driverRoot string) (string, error) {
	loc := lookup.NewLibraryLocator(lookup.WithLogger(quietLogger{}), lookup.WithRoot(driverRoot))
	for _, name := range driverLibraries {
		found, err := loc.Locate(name)
		if err != nil || len(found) == 0 {
			continue
		}
		rel, err := filepath.Rel(driverRoot, filepath.Dir(found[0]))
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", fmt.Errorf("driver root %s: %s resolves to %s, outside it", driverRoot, name, found[0])
		}
		return rel, nil
	}
	return "", fmt.Errorf("driver root %s: none of %s in it, its lib64, lib/<triplet>, usr/lib64 or usr/lib/<triplet> (nvcdi's library search), for the daemons' LD_LIBRARY_PATH", driverRoot, strings.Join(driverLibraries, ", "))
}

// quietLogger drops the library locator's log: a miss is Locate's error.
type quietLogger struct{}

func (quietLogger) Debugf(string, ...any)   {}
func (quietLogger) Errorf(string, ...any)   {}
func (quietLogger) Infof(string, ...any)    {}
func (quietLogger) Warningf(string, ...any) {}
func (quietLogger) Tracef(string, ...any)   {}
