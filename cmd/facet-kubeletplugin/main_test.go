package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoFailpointInShippedBuild: the default build ignores
// $FACET_FAILPOINT (L5). Under -tags facet_failpoints it arms.
func TestNoFailpointInShippedBuild(t *testing.T) {
	t.Setenv("FACET_FAILPOINT", "after-mig-create")
	armed := failpoint(context.Background()) != nil
	if armed != failpointsCompiled {
		t.Fatalf("failpoint armed=%v in a build with failpoints compiled=%v", armed, failpointsCompiled)
	}
}

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
	os.WriteFile(lib, []byte("ELF"), 0o644)
	if e, err := openHAMi(lib, filepath.Join(dir, "vgpu")); e == nil || err != nil {
		t.Fatalf("with a library: %v %v", e, err)
	}
}
