package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// elf is a stand-in library: what InstallHAMiCore checks is the ELF magic.
func elf(s string) []byte { return append([]byte("\x7fELF"), s...) }

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestInstallHAMiCore: the one file the glob matches is installed as
// <dir>/libvgpu.so, 0644; a second run with the same file writes nothing;
// a new library replaces the old one by a rename, so that a process that
// holds the old file open (a running share's container bind-mounts it)
// still reads the old bytes; and --sha256 is honoured in either case.
func TestInstallHAMiCore(t *testing.T) {
	img := t.TempDir()
	dir := filepath.Join(t.TempDir(), "facet-hami-core")
	v1 := elf("HAMi-core 1")
	write(t, filepath.Join(img, "k8s-vgpu/lib/nvidia/libvgpu.so.v2.9.0"), v1)
	glob := filepath.Join(img, "k8s-vgpu/lib/nvidia/libvgpu.so*")

	r, err := InstallHAMiCore(glob, dir, strings.ToUpper(sum(v1)))
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(dir, "libvgpu.so")
	if !r.Wrote || r.Path != dest || r.SHA256 != sum(v1) || !strings.HasSuffix(r.Source, "libvgpu.so.v2.9.0") {
		t.Errorf("first install: %+v", r)
	}
	if got, _ := os.ReadFile(dest); !bytes.Equal(got, v1) {
		t.Errorf("installed %q, want %q", got, v1)
	}
	if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644: every container's loader reads it", fi.Mode())
	}
	ino := inode(t, dest)

	if r, err := InstallHAMiCore(glob, dir, ""); err != nil || r.Wrote {
		t.Errorf("second install of the same file: %+v, %v; want nothing written", r, err)
	}
	if inode(t, dest) != ino {
		t.Error("an unchanged library was replaced")
	}

	old, err := os.Open(dest)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	v2 := elf("HAMi-core 2, longer")
	write(t, filepath.Join(img, "k8s-vgpu/lib/nvidia/libvgpu.so.v2.9.0"), v2)
	if r, err := InstallHAMiCore(glob, dir, sum(v2)); err != nil || !r.Wrote || r.SHA256 != sum(v2) {
		t.Fatalf("upgrade: %+v, %v", r, err)
	}
	if got, _ := os.ReadFile(dest); !bytes.Equal(got, v2) {
		t.Errorf("after the upgrade %q, want %q", got, v2)
	}
	if got, _ := io.ReadAll(old); !bytes.Equal(got, v1) {
		t.Errorf("the old file, held open, reads %q: rewritten in place, not renamed over", got)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("left in %s: %v, want libvgpu.so only", dir, entries)
	}
}

// TestInstallHAMiCoreRefuses: a glob that matches no file, two files or a
// directory, a file that is no ELF object, and a library whose hash is not
// the one asked for install nothing, and a library already installed stays.
func TestInstallHAMiCoreRefuses(t *testing.T) {
	lib := elf("HAMi-core")
	for _, tc := range []struct {
		name  string
		files map[string][]byte
		glob  string
		sha   string
		want  string
	}{
		{"no match", map[string][]byte{"lib/other.so": lib}, "lib/libvgpu.so*", "", "found 0"},
		{"two matches", map[string][]byte{"lib/libvgpu.so": lib, "lib/libvgpu.so.1": lib}, "lib/libvgpu.so*", "", "found 2"},
		{"a directory", map[string][]byte{"lib/libvgpu.so.d/x": lib}, "lib/libvgpu.so*", "", "not a regular file"},
		{"not ELF", map[string][]byte{"lib/libvgpu.so.txt": []byte("see libvgpu.so.1")}, "lib/libvgpu.so*", "", "not an ELF"},
		{"other hash", map[string][]byte{"lib/libvgpu.so": lib}, "lib/libvgpu.so*", strings.Repeat("ab", 32), "has SHA-256 " + sum(lib) + ", not " + strings.Repeat("ab", 32)},
		{"malformed hash", map[string][]byte{"lib/libvgpu.so": lib}, "lib/libvgpu.so*", "abc", "not 64 hex digits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := t.TempDir()
			for name, data := range tc.files {
				write(t, filepath.Join(img, name), data)
			}
			dir := t.TempDir()
			kept := elf("the node's vetted library")
			write(t, filepath.Join(dir, "libvgpu.so"), kept)
			r, err := InstallHAMiCore(filepath.Join(img, tc.glob), dir, tc.sha)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one with %q", err, tc.want)
			}
			if r.Wrote {
				t.Error("reports a write")
			}
			if got, _ := os.ReadFile(filepath.Join(dir, "libvgpu.so")); !bytes.Equal(got, kept) {
				t.Errorf("the installed library became %q", got)
			}
		})
	}
	if _, err := InstallHAMiCore("/nonexistent/libvgpu.so*", "relative/dir", ""); err == nil {
		t.Error("a relative directory is accepted")
	}
}

// TestStage: stage copies the running executable, executable by anyone
// (HAMi's container runs it as another user than the one that wrote it).
func TestStage(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := run(context.Background(), []string{"stage", "--dir=" + dir}, &out); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	want, _ := os.ReadFile(exe)
	got, err := os.ReadFile(filepath.Join(dir, "facet-install"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("staged %d bytes (%v), want this executable's %d", len(got), err, len(want))
	}
	if fi, _ := os.Stat(filepath.Join(dir, "facet-install")); fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", fi.Mode())
	}
}

// TestHold: hold returns, successfully, only when its context ends (the
// container's SIGTERM).
func TestHold(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"hold"}, io.Discard) }()
	select {
	case err := <-done:
		t.Fatalf("hold returned before SIGTERM: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("hold: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("hold did not return after SIGTERM")
	}
}

// TestCommandLine: the flags the chart passes (templates/hami-core.yaml)
// reach InstallHAMiCore; missing ones and unknown commands are refused.
func TestCommandLine(t *testing.T) {
	img, dir := t.TempDir(), t.TempDir()
	lib := elf("x")
	write(t, filepath.Join(img, "libvgpu.so"), lib)
	var out bytes.Buffer
	err := run(context.Background(), []string{"hami-core", "--from=" + filepath.Join(img, "libvgpu.so*"), "--dir=" + dir, "--sha256=" + sum(lib)}, &out)
	if err != nil || !strings.Contains(out.String(), "installed "+filepath.Join(dir, "libvgpu.so")) || !strings.Contains(out.String(), sum(lib)) {
		t.Errorf("hami-core: %v\n%s", err, out.String())
	}
	for _, args := range [][]string{nil, {"hami-core", "--dir=" + dir}, {"stage"}, {"copy"}} {
		if err := run(context.Background(), args, io.Discard); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// TestStatic: no package facet-install links has cgo files, so it links
// statically whatever CGO_ENABLED says, and runs in HAMi's image whatever
// libc that has (a dynamically linked facetctl would need the image's
// loader and a glibc at least as new as Debian 12's).
func TestStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if .CgoFiles}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if pkgs := strings.Fields(string(out)); len(pkgs) != 0 {
		t.Errorf("facet-install links packages with cgo files: %v", pkgs)
	}
}
