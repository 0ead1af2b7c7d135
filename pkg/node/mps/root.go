package mps

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// controlDirs are where driver installations put nvidia-cuda-mps-control,
// relative to the driver root: distribution packages and the GPU
// Operator's driver container use usr/bin; runfile installs into
// /usr/local/nvidia keep bin/.
var controlDirs = []string{"usr/bin", "bin", "usr/local/bin"}

// FindControl returns nvidia-cuda-mps-control's path inside driverRoot
// ("/usr/bin/nvidia-cuda-mps-control"), which is where the daemon, chrooted
// into the driver root, runs it from; or an error naming where it looked.
// driverRoot is the driver root as this process sees it (in a container,
// its mount of the host's).
func FindControl(driverRoot string) (string, error) {
	for _, dir := range controlDirs {
		p := filepath.Join(driverRoot, dir, ControlName)
		// An absolute symbolic link on the way resolves against this
		// process's root, not the driver root's; Stat is a first check,
		// and the chrooted exec the one that counts.
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return "/" + dir + "/" + ControlName, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s under driver root %s", ControlName, strings.Join(controlDirs, ", "), driverRoot)
}

// CheckRoot says whether the control program found by FindControl can run
// chrooted into driverRoot: the root must have /tmp and /dev/shm
// directories to hold the GPU's MPS directories, and the program's
// interpreter (an ELF program's loader, PT_INTERP, or a script's "#!"
// program) must be in it. A driver installed under a prefix of its own
// (/usr/local/nvidia, docs/driver-roots.md) has none of these: its
// programs use the host's loader from the host's /. Seen on a real H200:
// without this check, each MPS prepare failed on such a root instead of
// the node saying once that it cannot run MPS.
func CheckRoot(driverRoot, control string) error {
	var missing []string
	for _, d := range []string{"tmp", "dev/shm"} {
		st, err := os.Lstat(filepath.Join(driverRoot, d))
		if err != nil || !st.IsDir() {
			missing = append(missing, "no /"+d+" directory")
		}
	}
	interp, err := interpreter(filepath.Join(driverRoot, control))
	if err != nil {
		return fmt.Errorf("driver root %s: read %s: %w", driverRoot, control, err)
	}
	if interp != "" {
		// Resolved inside the root, as the chrooted exec will: a
		// loader reached through an absolute link (Debian's
		// /lib64/ld-linux-x86-64.so.2) must not be looked for in this
		// process's own root, the image's.
		p, err := securejoin.SecureJoin(driverRoot, interp)
		if err == nil {
			_, err = os.Stat(p)
		}
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s's interpreter %s is not in it", ControlName, interp))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("driver root %s cannot run MPS chrooted: %s (a driver under a prefix of its own, such as /usr/local/nvidia, runs its programs with the host's loader; docs/mps.md)", driverRoot, strings.Join(missing, "; "))
	}
	return nil
}

// interpreter is the program that runs path: an ELF file's PT_INTERP
// (empty for a static one), or a script's "#!" program.
func interpreter(path string) (string, error) {
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
