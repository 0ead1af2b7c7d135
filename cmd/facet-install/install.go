package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/facet-gpu/facet/pkg/model/atomicfile"
)

// StagedName is the file name Stage gives its copy.
const StagedName = "facet-install"

// LibraryName is the installed library's name in its host directory: the
// chart passes <hostDir>/libvgpu.so to the plugin as --hami-library.
const LibraryName = "libvgpu.so"

// Stage copies the running executable to dir/StagedName, executable by
// anyone: the copy runs in another container of the pod, as root, from a
// file this container (non-root) wrote.
func Stage(dir string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		return "", err
	}
	// The emptyDir lives as long as the pod: durability is not needed, only
	// that the other container never sees half of the file.
	if err := atomicfile.WriteWith(dir, StagedName, data, atomicfile.Options{TempPattern: "." + StagedName + ".tmp.*", Perm: 0o755, NoSync: true}); err != nil {
		return "", err
	}
	return filepath.Join(dir, StagedName), nil
}

// Installed is what InstallHAMiCore did.
type Installed struct {
	// Path is the installed file, dir/LibraryName.
	Path string
	// Source is the file the glob matched.
	Source string
	// SHA256 is its hash, in lower-case hex.
	SHA256 string
	// Wrote is false when Path already had these bytes and mode.
	Wrote bool
}

// InstallHAMiCore installs the one regular file that glob matches (Go's
// filepath.Match syntax, which for HAMi's paths is the shell's) as
// dir/LibraryName with mode 0644. The file must be an ELF object and, when
// wantSHA256 is set, have that SHA-256; otherwise nothing is written, so a
// node keeps the library it had. A file already there with the same bytes
// and mode is left as it is; any other is replaced by a rename, never
// rewritten in place, so that containers already running with the old file
// bind-mounted keep it whole.
func InstallHAMiCore(glob, dir, wantSHA256 string) (Installed, error) {
	var r Installed
	if !filepath.IsAbs(dir) {
		return r, fmt.Errorf("directory %q is not an absolute path", dir)
	}
	want := strings.ToLower(wantSHA256)
	if want != "" {
		if b, err := hex.DecodeString(want); err != nil || len(b) != sha256.Size {
			return r, fmt.Errorf("--sha256 %q is not %d hex digits", wantSHA256, sha256.Size*2)
		}
	}
	matches, err := filepath.Glob(glob)
	if err != nil {
		return r, fmt.Errorf("--from %q: %w", glob, err)
	}
	if len(matches) != 1 {
		return r, fmt.Errorf("want exactly one file matching %s in this image, found %d %q: set kubeletPlugin.hamiCore.librarySource to where the image (kubeletPlugin.hamiCore.image) has libvgpu.so", glob, len(matches), matches)
	}
	r.Source = matches[0]
	fi, err := os.Stat(r.Source)
	if err != nil {
		return r, err
	}
	if !fi.Mode().IsRegular() {
		return r, fmt.Errorf("%s is not a regular file (%s)", r.Source, fi.Mode().Type())
	}
	data, err := os.ReadFile(r.Source)
	if err != nil {
		return r, err
	}
	// A glob too wide (a directory of notes, a symlink farm's text file)
	// would otherwise put a file on every tenant's ld.so.preload path that
	// the dynamic loader refuses at each container's start.
	if !bytes.HasPrefix(data, []byte("\x7fELF")) {
		return r, fmt.Errorf("%s is not an ELF shared object (it starts with %q)", r.Source, data[:min(len(data), 4)])
	}
	s := sha256.Sum256(data)
	r.SHA256 = hex.EncodeToString(s[:])
	if want != "" && r.SHA256 != want {
		return r, fmt.Errorf("%s has SHA-256 %s, not %s (kubeletPlugin.hamiCore.librarySHA256): not installed. Pin the image you vetted by digest (kubeletPlugin.hamiCore.image.digest), or vet this library and set librarySHA256 to its hash", r.Source, r.SHA256, want)
	}
	r.Path = filepath.Join(dir, LibraryName)
	if old, err := os.ReadFile(r.Path); err == nil && bytes.Equal(old, data) {
		if fi, err := os.Stat(r.Path); err == nil && fi.Mode().Perm() == 0o644 {
			return r, nil
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, err
	}
	// What an install that died mid-write left (atomicfile removes its
	// temporary file on every error it sees, not on a kill).
	tmp := "." + LibraryName + ".tmp."
	if stale, err := filepath.Glob(filepath.Join(dir, tmp+"*")); err == nil {
		for _, f := range stale {
			os.Remove(f)
		}
	}
	// Durable: a node rebooted mid-install keeps the old library or the new
	// one, never a truncated file that every share's container preloads.
	if err := atomicfile.WriteWith(dir, LibraryName, data, atomicfile.Options{TempPattern: tmp + "*", Perm: 0o644}); err != nil {
		return r, err
	}
	r.Wrote = true
	return r, nil
}
