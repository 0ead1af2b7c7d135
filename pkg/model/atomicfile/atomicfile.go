// Package atomicfile replaces a file so that a crash at any point leaves
// either its old or its new contents, never a mix: write a temporary file
// in the same directory, fsync it, rename it over the target, fsync the
// directory (WriteWith can skip the fsyncs where durability lies
// elsewhere). Every file Facet replaces is written this way.
package atomicfile

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Write replaces dir/name with data, with file mode perm, durably (the
// file and the directory fsynced). The temporary file is named tempPrefix
// followed by random characters, so that a start-up sweep can find what a
// crash left behind. Errors name the file.
func Write(dir, name, tempPrefix string, data []byte, perm os.FileMode) error {
	return WriteWith(dir, name, data, Options{TempPattern: tempPrefix + "*", Perm: perm})
}

// WriteJSON replaces the file at path with v as indented JSON (two spaces,
// a final newline), as Write does: durably, the temporary file in path's
// directory named tempPrefix followed by random characters. An error is
// v's encoding or the write's, naming the file.
func WriteJSON(path, tempPrefix string, v any, perm os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return Write(filepath.Dir(path), filepath.Base(path), tempPrefix, append(data, '\n'), perm)
}

// Options say how WriteWith writes.
type Options struct {
	// TempPattern names the temporary file in dir, as os.CreateTemp's
	// pattern (its last "*" becomes random characters). Required.
	TempPattern string
	// Perm is the file's mode; 0 means 0600.
	Perm os.FileMode
	// NoSync skips both fsyncs: the replacement is still atomic (readers
	// see the old or the new contents), but a crash may leave the old.
	// For writers whose durability lies elsewhere: the checkpoint's
	// journal, which is fsynced first; a CDI spec, which the plugin
	// verifies and rewrites at start.
	NoSync bool
}

// WriteWith replaces dir/name with data: a temporary file in dir, written,
// renamed over the target, as o says. Errors name the file. It is the one
// atomic writer of Facet: the checkpoint, the CDI specs, nvidia-cdi-hook's
// install, the MIG layout records, the MPS daemon records, the GPU fault
// records and the simulator's files all write through it.
func WriteWith(dir, name string, data []byte, o Options) error {
	target := filepath.Join(dir, name)
	if o.Perm == 0 {
		o.Perm = 0o600
	}
	f, err := os.CreateTemp(dir, o.TempPattern)
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
	if err := f.Chmod(o.Perm); err != nil {
		return fail(err)
	}
	if !o.NoSync {
		if err := f.Sync(); err != nil {
			return fail(err)
		}
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := os.Rename(tmp, target); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", target, err)
	}
	if !o.NoSync {
		if err := SyncDir(dir); err != nil {
			return fmt.Errorf("write %s: %w", target, err)
		}
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
