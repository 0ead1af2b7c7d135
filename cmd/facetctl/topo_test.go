package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var updateTopo = flag.Bool("update", false, "rewrite testdata/topo-*.txt")

// TestTopoGolden pins `facetctl topo --machine FILE` for the topology
// machines (dgx-h100: NVSwitches without PCIe switches) and for one
// without topology (l4x4: PCIe only, no switch, no NVLink attribute).
func TestTopoGolden(t *testing.T) {
	for _, m := range []string{"hgx-h100", "h100-nvl-pairs", "l40s-8", "gb200-nvl72-tray", "dgx-h100", "l4x4"} {
		t.Run(m, func(t *testing.T) {
			out, err := captureStdout(t, func() error {
				return runTopo([]string{"--machine", filepath.Join("..", "..", "demo", "machines", m+".yaml")})
			})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "topo-"+m+".txt")
			if *updateTopo {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal([]byte(out), want) {
				t.Errorf("facetctl topo differs from %s (run with -update if intended):\n%s", path, out)
			}
		})
	}
}
