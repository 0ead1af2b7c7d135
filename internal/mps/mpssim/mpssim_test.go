package mpssim

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestWriteRoot runs the stand-in chrooted into a root from WriteRoot, as
// Facet runs the driver's nvidia-cuda-mps-control, and the old way (the
// caller's loader, LD_LIBRARY_PATH into the root), which must fail as it
// fails on a node whose glibc is another build than the image's.
func TestWriteRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot and mknod need root: run this test as root to check the stand-in's root")
	}
	root := t.TempDir()
	for range 2 {
		if err := WriteRoot(root); err != nil {
			t.Fatal(err)
		}
	}
	triplet, err := libraryTriplet()
	if err != nil {
		t.Fatal(err)
	}
	shell, interp, err := findShell()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shell %s, loader %s", shell, interp)

	// Idempotent: a third layout replaces nothing.
	replaced := []string{"bin/sh", "bin/busybox", strings.TrimPrefix(interp, "/"), filepath.Join("usr/lib", triplet, "libc.so.6"), ControlRel}
	inodes := map[string]uint64{}
	for _, rel := range replaced {
		inodes[rel] = inode(t, filepath.Join(root, rel))
	}
	if err := WriteRoot(root); err != nil {
		t.Fatal(err)
	}
	for _, rel := range replaced {
		if inode(t, filepath.Join(root, rel)) != inodes[rel] {
			t.Errorf("%s rewritten by a layout that had nothing to change", rel)
		}
	}

	pidFile := filepath.Join(root, "tmp/pipe/nvidia-cuda-mps-control.pid")
	logFile := filepath.Join(root, "tmp/log/control.log")
	daemon := func(t *testing.T) int {
		t.Helper()
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", pidFile, err)
		}
		return pid
	}
	var started int
	t.Cleanup(func() {
		if started > 0 && alive(started) {
			_ = syscall.Kill(started, syscall.SIGKILL)
		}
	})
	chrooted := func(stdin string, args ...string) *exec.Cmd {
		cmd := exec.Command("/"+ControlRel, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/pipe", "CUDA_MPS_LOG_DIRECTORY=/tmp/log", "PATH=/usr/bin:/bin"}
		cmd.Stdin = strings.NewReader(stdin)
		return cmd
	}

	t.Run("the daemon starts chrooted", func(t *testing.T) {
		if out, err := chrooted("", "-d").CombinedOutput(); err != nil {
			t.Fatalf("chroot %s %s -d: %v\n%s", root, ControlRel, err, out)
		}
		started = daemon(t)
		if !alive(started) {
			t.Fatalf("the daemon's pid %d is not running", started)
		}
		b, err := os.ReadFile(logFile)
		if err != nil || !bytes.Contains(b, []byte("startup pid="+strconv.Itoa(started))) {
			t.Fatalf("%s: no startup line (%v):\n%s", logFile, err, b)
		}
	})
	if started == 0 {
		t.FailNow()
	}

	t.Run("a layout while the daemon runs", func(t *testing.T) {
		// A wrong mode makes the layout replace the files that the daemon
		// runs: a write in place would fail (ETXTBSY) or change a script
		// under a shell reading it.
		for _, rel := range replaced {
			if err := os.Chmod(filepath.Join(root, rel), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := WriteRoot(root); err != nil {
			t.Fatal(err)
		}
		for _, rel := range replaced {
			p := filepath.Join(root, rel)
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("%s: %v %v, want mode 0755", rel, fi, err)
			}
			if inode(t, p) == inodes[rel] {
				t.Errorf("%s: rewritten in place, not replaced", rel)
			}
		}
		if !alive(started) {
			t.Errorf("the daemon (pid %d) died", started)
		}
	})

	t.Run("the caller's loader fails", func(t *testing.T) {
		// The script's #! line runs this system's /bin/sh, which may be
		// another shell than the one copied (busybox, in Facet's image).
		if sh, err := filepath.EvalSymlinks("/bin/sh"); err != nil {
			t.Skip(err)
		} else if i, err := elfInterp(sh); err != nil || i == "" {
			t.Skipf("/bin/sh (%s) is not dynamically linked (%v): LD_LIBRARY_PATH changes nothing", sh, err)
		}
		host := t.TempDir()
		cmd := exec.Command(filepath.Join(root, ControlRel), "-d")
		cmd.Env = []string{
			"LD_LIBRARY_PATH=" + filepath.Join(root, "usr/lib", triplet),
			"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(host, "pipe"),
			"CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(host, "log"),
			"PATH=/usr/bin:/bin",
		}
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("%s -d with LD_LIBRARY_PATH into the root succeeded:\n%s", ControlRel, out)
		}
		if !bytes.Contains(out, []byte(privateStandIn)) {
			t.Errorf("%v, output does not name %s:\n%s", err, privateStandIn, out)
		}
		t.Logf("%v: %s", err, bytes.TrimSpace(out))
	})

	t.Run("quit stops the daemon", func(t *testing.T) {
		if out, err := chrooted("quit\n").CombinedOutput(); err != nil {
			t.Fatalf("echo quit | chroot %s %s: %v\n%s", root, ControlRel, err, out)
		}
		for deadline := time.Now().Add(5 * time.Second); alive(started); {
			if time.Now().After(deadline) {
				t.Fatalf("the daemon (pid %d) still runs after quit", started)
			}
			time.Sleep(10 * time.Millisecond)
		}
		b, _ := os.ReadFile(logFile)
		for _, want := range []string{"cmd=quit", " quit\n"} {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("%s has no %q:\n%s", logFile, want, b)
			}
		}
	})
}

func TestWriteRootRefusesRoot(t *testing.T) {
	for _, root := range []string{"/", "//", "relative"} {
		if err := WriteRoot(root); err == nil {
			t.Errorf("WriteRoot(%q): no error", root)
		}
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// alive reports whether pid runs: a zombie, which no init in a container
// may reap, does not.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// TestWritePrefix: in each simulated prefix layout the stand-in is the
// prefix's, and the prefix has none of what a root to chroot into needs;
// run chrooted into the host's root with LD_LIBRARY_PATH into the
// prefix's lib64, as Facet runs a driver under a prefix, it starts, finds
// the prefix's libcuda.so.1 and quits.
func TestWritePrefix(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot and mknod need root: run this test as root to check the stand-in's prefix layout")
	}
	for _, prefix := range Prefixes {
		t.Run(prefix, func(t *testing.T) {
			host := t.TempDir()
			for range 2 {
				if err := WritePrefix(host, prefix); err != nil {
					t.Fatal(err)
				}
			}
			dir := filepath.Join(host, prefix)
			if fi, err := os.Stat(filepath.Join(dir, PrefixControlRel)); err != nil || fi.Mode().Perm() != 0o755 {
				t.Fatalf("the prefix's stand-in: %v %v", fi, err)
			}
			for _, absent := range []string{filepath.Join(host, ControlRel), filepath.Join(dir, "tmp"), filepath.Join(dir, "dev"), filepath.Join(dir, "bin/sh")} {
				if _, err := os.Lstat(absent); err == nil {
					t.Errorf("%s exists: a prefix layout has its stand-in in the prefix alone, and no root of its own", absent)
				}
			}
			lib := filepath.Join(dir, PrefixLibDir, "libcuda.so.1")
			if err := os.WriteFile(lib, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			run := func(stdin string, args ...string) {
				t.Helper()
				cmd := exec.Command(filepath.Join(prefix, PrefixControlRel), args...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: host}
				cmd.Dir = "/"
				cmd.Env = []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/pipe", "CUDA_MPS_LOG_DIRECTORY=/tmp/log", "PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/nowhere:" + filepath.Join(prefix, PrefixLibDir)}
				cmd.Stdin = strings.NewReader(stdin)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("chroot %s %s %v: %v\n%s", host, cmd.Path, args, err, out)
				}
			}
			run("", "-d")
			b, _ := os.ReadFile(filepath.Join(host, "tmp/log/control.log"))
			if want := "libcuda=" + filepath.Join(prefix, PrefixLibDir, "libcuda.so.1"); !bytes.Contains(b, []byte(want)) {
				t.Errorf("control.log has no %q:\n%s", want, b)
			}
			run("quit\n")
			b, _ = os.ReadFile(filepath.Join(host, "tmp/log/control.log"))
			if !bytes.Contains(b, []byte(" quit\n")) {
				t.Errorf("control.log has no quit:\n%s", b)
			}
		})
	}
	if err := WritePrefix(t.TempDir(), "/"); err == nil {
		t.Error("WritePrefix with the prefix /: no error")
	}
}
