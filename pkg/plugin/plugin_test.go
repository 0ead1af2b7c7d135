package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMissingHAMiLibraryIsNotFatal: a missing --hami-library is a reason
// for share claims to fail, returned with no editor; the plugin goes on
// (L4: run used to return it and exit).
func TestMissingHAMiLibraryIsNotFatal(t *testing.T) {
	dir := t.TempDir()
	e, err := openHAMi(filepath.Join(dir, "missing", "libvgpu.so"), filepath.Join(dir, "vgpu"))
	if e != nil || err == nil || !strings.Contains(err.Error(), "libvgpu.so") {
		t.Fatalf("editor %v, error %v", e, err)
	}
	if e, err := openHAMi("", dir); e != nil || err != nil {
		t.Fatalf("no library asked for: %v %v", e, err)
	}
	lib := filepath.Join(dir, "libvgpu.so")
	if err := os.WriteFile(lib, []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := openHAMi(lib, filepath.Join(dir, "vgpu")); e == nil || err != nil {
		t.Fatalf("with a library: %v %v", e, err)
	}
}
