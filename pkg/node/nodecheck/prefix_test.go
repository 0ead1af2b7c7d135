package nodecheck

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/facet-gpu/facet/internal/mps/mpssim"
	"github.com/facet-gpu/facet/internal/nvml/sim"
)

// TestDriverUnderAPrefix runs the check on simulated nodes whose driver is
// under a prefix (GKE's, /usr/local/nvidia), as docs/node-check.md runs it
// on such a host: --driver-root the prefix, --dev-root and --host-root the
// host's /, and the scratch directory in the host's /tmp, which the MPS
// launcher mounts over. With the host's root the share and the slot are
// MPS clients of a daemon that ran from there; without it they are
// time-sliced, and the log says what was missing.
func TestDriverUnderAPrefix(t *testing.T) {
	for _, prefix := range mpssim.Prefixes {
		for _, tc := range []struct {
			name     string
			hostRoot bool
			wantLog  string
		}{
			{name: "with the host's root", hostRoot: true, wantLog: "vGPU share  probe environment: "},
			{name: "without it", wantLog: "MPS unavailable, the share and the slot are time-sliced by HAMi-core: root "},
		} {
			t.Run(prefix+"/"+tc.name, func(t *testing.T) {
				o := simNode(t, 2)
				node, err := o.Library.Discover()
				if err != nil {
					t.Fatal(err)
				}
				var minors []int
				for _, g := range node.GPUs {
					minors = append(minors, g.Minor)
				}
				host := t.TempDir()
				if err := sim.LayoutPrefixDriverRoot(host, prefix, node.DriverVersion, minors); err != nil {
					t.Fatal(err)
				}
				o.DriverRoot, o.DevRoot = filepath.Join(host, prefix), host
				if tc.hostRoot {
					o.HostRoot = host
				}
				o.ScratchParent = filepath.Join(host, "tmp")
				o.SkipProbe, o.MPS = "simulated GPU", true
				var log bytes.Buffer
				o.Log = &log
				rep, err := Run(testContext(t), o)
				if err != nil {
					t.Fatal(err)
				}
				if rep.Failed() || len(rep.Leftovers) > 0 {
					t.Errorf("failed: %v, leftovers %v\n%s", rep.Failed(), rep.Leftovers, log.String())
				}
				wantPct := map[bool][2]string{true: {"20", "25"}, false: {"", ""}}[tc.hostRoot]
				for i, claim := range []string{ClaimShare, ClaimSlot} {
					row := rep.Rows[i+1]
					if row.Claim != claim || row.PrepareErr != nil || row.MPSPercent != wantPct[i] {
						t.Errorf("%s: prepare %v, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE %q; want %q", row.Claim, row.PrepareErr, row.MPSPercent, wantPct[i])
					}
				}
				if !strings.Contains(log.String(), tc.wantLog) {
					t.Errorf("log lacks %q:\n%s", tc.wantLog, log.String())
				}
				if tc.hostRoot && strings.Contains(log.String(), "MPS unavailable") {
					t.Errorf("MPS unavailable with the host's root:\n%s", log.String())
				}
				if entries, _ := filepath.Glob(filepath.Join(o.ScratchParent, "facet-node-check-*")); len(entries) != 0 {
					t.Errorf("scratch left: %v", entries)
				}
			})
		}
	}
}
