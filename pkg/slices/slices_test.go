package slices

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/facet-gpu/facet/pkg/inventory"
	"github.com/facet-gpu/facet/pkg/nvml"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func render(t *testing.T, machine string, cfg inventory.Config) []byte {
	t.Helper()
	lib, err := nvml.OpenMachine(filepath.Join("..", "..", "demo", "machines", machine+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := lib.Discover()
	if err != nil {
		t.Fatal(err)
	}
	inv, err := inventory.Build(node, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteYAML(&buf, Objects(Resources(inv, "node-a"), "node-a")); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestGolden pins the exact slices of each demo machine.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		machine string
		cfg     inventory.Config
		golden  string
	}{
		{"dgx-h100", inventory.Config{}, "dgx-h100-exclusive.yaml"},
		{"l4x4", inventory.Config{}, "l4x4-exclusive.yaml"},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			got := render(t, tc.machine, tc.cfg)
			path := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("slices differ from %s (run with -update if intended):\n%s", path, got)
			}
		})
	}
}
