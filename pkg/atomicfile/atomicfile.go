// Package atomicfile replaces a file so that a crash at any point leaves
// either its old or its new contents, never a mix: write a temporary file
// in the same directory, fsync it, rename it over the target, fsync the
// directory. Facet's checkpoint, its MIG layout records and the simulated
// NVML state are written this way.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces dir/name with data, with file mode perm. The temporary
// file is named tempPrefix followed by random characters, so that a
// start-up sweep can find what a crash left behind. Errors name the file.
func Write(dir, name, tempPrefix string, data []byte, perm os.FileMode) error {
	target := filepath.Join(dir, name)
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", target, err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := os.Rename(tmp, target); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	return nil
}

// SyncDir fsyncs a directory, making a rename or removal in it durable.
func SyncDir(dir string) error { return Sync(dir) }

// Sync fsyncs a file or a directory that is already in place.
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
